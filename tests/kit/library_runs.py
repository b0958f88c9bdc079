"""The test side of a library run on both trainers: a job script (tests/jobs/) run with `python` (on
transformers) and with `python -m trainwright run` (on trainwright), its reports compared, and a run
interrupted by a signal to its process group and resumed in a new process; the same under torchrun
(`run_torchrun_job`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from kit import job_env
from kit import torchrun as launch

# the metrics whose value is a time (or trainwright's counted FLOPs against upstream's estimate)
TIMINGS = ("_runtime", "_per_second", "step_time", "total_flos")
# what trainwright adds to a checkpoint: its manifest, its data position, its arguments as JSON
# trainwright's own checkpoint files (the batch fetched ahead of the next step: one per process)
OWN_FILES = {
    "base_model.json",
    "batch_in_hand.safetensors",
    "batch_in_hand_0.safetensors",
    "batch_in_hand_1.safetensors",
    "checkpoint_complete.json",
    "data_state.json",
    "training_args.json",
}
# PYTHONHASHSEED: a library may order what it builds by a set of strings (GLiNER's label prompts), so
# both libraries' processes hash strings alike
ENV = {"HF_HUB_OFFLINE": "1", "CI": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONHASHSEED": "0"}


def command(job: str, library: str, python: str = sys.executable) -> list[str]:
    if library == "transformers":
        return [python, job]
    return [python, "-m", "trainwright", "run", job]


def env(**extra: str) -> dict[str, str]:
    return job_env(**ENV, **extra)


def torchrun_command(job: str, library: str, nproc: int = 2) -> list[str]:
    """`job` on `nproc` torchrun processes (gloo on the loopback): `torchrun JOB` on transformers,
    `torchrun -m trainwright run JOB` on trainwright."""
    if library == "transformers":
        return [*launch.torchrun_command(nproc), job]
    return [*launch.torchrun_command(nproc), "-m", "trainwright", "run", job]


def run_torchrun_job(job: str, library: str, cfg: dict, nproc: int = 2, timeout: int = 600) -> dict:
    """Run `job` with CFG on `library` under torchrun; its report (rank 0's)."""
    proc = subprocess.Popen(
        [*torchrun_command(job, library, nproc), json.dumps(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"),
        start_new_session=True,  # killed with every process under it if it overruns (finish)
    )
    code, out = launch.finish([proc], timeout)[0]
    assert code == 0, f"{library} torchrun job failed ({code}):\n{out[-6000:]}"
    with open(cfg["report"]) as f:
        return json.load(f)


def run_job(job: str, library: str, cfg: dict, python: str = sys.executable, timeout: int = 900) -> dict:
    """Run `job` with CFG on `library`; its report."""
    proc = subprocess.run(
        [*command(job, library, python), json.dumps(cfg)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env(),
    )
    assert proc.returncode == 0, f"{library} job failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    with open(cfg["report"]) as f:
        return json.load(f)


def comparable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.endswith(TIMINGS)}


def assert_same_history(theirs: list[dict], ours: list[dict], rel: float = 1e-5) -> None:
    """Every logged row has the same keys and values (relative `rel`), timings aside."""
    assert len(ours) == len(theirs), (len(ours), len(theirs))
    for a, b in zip(theirs, ours):
        a, b = comparable(a), comparable(b)
        assert b.keys() == a.keys(), (b.get("step"), sorted(set(a) ^ set(b)))
        for key, value in a.items():
            assert b[key] == pytest.approx(value, rel=rel, abs=1e-7), (b.get("step"), key, value, b[key])


def assert_same_files(theirs: dict[str, list[str]], ours: dict[str, list[str]], own_top: set[str]) -> None:
    """Each folder holds transformers' files plus at most trainwright's own (`own_top`: in the output
    folder itself)."""
    for folder, names in theirs.items():
        mine = set(ours[folder])
        assert set(names) <= mine, (folder, sorted(set(names) - mine))
        assert mine - set(names) <= OWN_FILES | (own_top if folder == "." else set()), folder


def same_weights(a: str, b: str) -> None:
    ours, theirs = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    assert ours.keys() == theirs.keys()
    for k in ours:
        assert torch.equal(ours[k], theirs[k]), k


def interrupted(
    job: str,
    tmp_path,
    scenario: str,
    sig: signal.Signals,
    extra: dict | None = None,
    python: str = sys.executable,
) -> tuple[subprocess.Popen, dict, str]:
    """Run `scenario` on trainwright in its own process group, send `sig` to the group once
    checkpoint-2 is saved, then resume the newest checkpoint in a new process: (the killed process,
    the resumed run's report, the first run's output)."""
    cfg = {
        "scenarios": [scenario],
        "root": str(tmp_path / "run"),
        "report": str(tmp_path / "first.json"),
        "announce": True,
        "pause": 0.4,
        **(extra or {}),
    }
    proc = subprocess.Popen(
        [*command(job, "trainwright", python), json.dumps(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env(),
        start_new_session=True,  # its own process group, as a cluster's job
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("SAVED 2"):
            os.killpg(proc.pid, sig)
            break
    rest = proc.stdout.read()
    proc.wait(timeout=300)
    output = "".join(seen) + rest
    assert any(line.startswith("SAVED 2") for line in seen), output[-4000:]
    resumed = run_job(
        job, "trainwright", {**cfg, "only_resume": True, "report": str(tmp_path / "resumed.json")}, python
    )
    return proc, resumed[scenario], output
