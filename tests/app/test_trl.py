"""TRL's trainers on trainwright, against the same script on transformers (tests/jobs/trl_job.py run with
`python` and with `python -m trainwright run`): SFT (full, LoRA, packing), DPO (a reference model,
`ref_model=None` from a folder, LoRA), the reward trainer and GRPO (generation, a Python reward),
and the other trainers TRL builds on the Trainer (KTO, RLOO, distillation; ORPO, CPO, GKD).

Each scenario's logged losses and metrics (evaluation included) equal transformers' (relative 1e-5),
the files it leaves are transformers' (plus trainwright's own), and trainwright's guarantees hold
for it: a resume from checkpoint-2 ends on the uninterrupted weights, bit for bit (in the job's
process for every scenario; after SIGKILL to the process group and after SIGTERM, in new processes,
for DPO, GRPO and SFT with LoRA), a background checkpoint is the synchronous one's bytes, and SFT's
accumulation is token-exact.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
from kit import job, job_env

pytest.importorskip("trl")
pytest.importorskip("peft")

JOB = job("trl_job.py")
SCENARIOS = ["sft", "sft_lora", "sft_pack", "dpo", "dpo_none", "dpo_lora", "reward", "grpo"]
# the other trainers TRL builds on the Trainer (the last three are experimental): trained only
OTHERS = ["kto", "rloo", "distillation", "orpo", "cpo", "gkd"]
TIMINGS = ("_runtime", "_per_second", "step_time", "total_flos")
# what trainwright adds to a checkpoint: its manifest, its data position, its arguments as JSON
OWN_FILES = {"checkpoint_complete.json", "data_state.json", "training_args.json"}
ENV = job_env(HF_HUB_OFFLINE="1", CI="1", TOKENIZERS_PARALLELISM="false")


def command(library: str) -> list[str]:
    if library == "transformers":
        return [sys.executable, JOB]
    return [sys.executable, "-m", "trainwright", "run", JOB]


def run_job(library: str, cfg: dict) -> dict:
    proc = subprocess.run(
        [*command(library), json.dumps(cfg)], capture_output=True, text=True, timeout=600, env=ENV
    )
    assert proc.returncode == 0, f"{library} job failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    with open(cfg["report"]) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("trl")
    base = {"scenarios": SCENARIOS + OTHERS, "tokenizer": str(root / "tokenizer"), "lifetime": True}
    hf = run_job("transformers", {**base, "root": str(root / "hf"), "report": str(root / "hf.json")})
    extra = {"resumed": True, "async": True, "accumulation": True}
    tw = run_job("trainwright", {**base, **extra, "root": str(root / "tw"), "report": str(root / "tw.json")})
    return {"transformers": hf, "trainwright": tw, "root": root}


def comparable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.endswith(TIMINGS)}


@pytest.mark.parametrize("scenario", SCENARIOS + OTHERS)
def test_trl_trainer_runs_on_trainwright_as_on_transformers(runs, scenario):
    hf, tw = runs["transformers"][scenario], runs["trainwright"][scenario]
    assert hf["base"] == "transformers.trainer" and tw["base"] == "trainwright.loop.trainer"
    assert len(tw["history"]) == len(hf["history"])
    for theirs, ours in zip(hf["history"], tw["history"]):
        theirs, ours = comparable(theirs), comparable(ours)
        assert ours.keys() == theirs.keys()
        for key, value in theirs.items():
            assert ours[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (ours["step"], key)
    assert scenario in OTHERS or any("eval_loss" in row for row in tw["history"])
    for folder, names in hf["files"].items():
        ours = set(tw["files"][folder])
        assert set(names) <= ours, folder
        assert ours - set(names) <= OWN_FILES | (
            {"config.json", "generation_config.json"} if folder == "." else set()
        ), folder


@pytest.mark.parametrize("scenario", SCENARIOS + OTHERS)
def test_trl_resume_and_background_checkpoints_keep_trainwrights_guarantees(runs, scenario):
    tw = runs["trainwright"][scenario]
    assert tw["resume_exact"], "a resume from checkpoint-2 did not end on the uninterrupted weights"
    assert tw["async_same_bytes"], "a background checkpoint's files differ from the synchronous one's"


def test_a_finished_sft_trainer_is_freed_at_once_wherever_it_is_on_transformers(runs):
    """`del trainer` frees the model by reference counting wherever transformers.Trainer does (the
    full-model SFT trainer keeps it in a cycle of TRL's own on transformers)."""
    hf, tw = runs["transformers"]["lifetime"], runs["trainwright"]["lifetime"]
    assert hf["sft_lora"], "transformers frees an SFT LoRA trainer's model at once: the check works"
    assert all(tw[scenario] or not hf[scenario] for scenario in hf), (hf, tw)


def test_sft_accumulation_is_token_exact(runs):
    report = runs["trainwright"]["accumulation"]
    assert report["losses"][0] == pytest.approx(report["losses"][1], rel=1e-6)
    assert report["max_weight_difference"] < 1e-6


def _interrupted(tmp_path, scenario: str, sig: signal.Signals) -> subprocess.CompletedProcess:
    cfg = {
        "scenarios": [scenario],
        "root": str(tmp_path / "run"),
        "tokenizer": str(tmp_path / "tokenizer"),
        "report": str(tmp_path / "first.json"),
        "announce": True,
        "pause": 0.4,
    }
    proc = subprocess.Popen(
        [*command("trainwright"), json.dumps(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ENV,
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
    resumed = run_job("trainwright", {**cfg, "only_resume": True, "report": str(tmp_path / "resumed.json")})
    return proc, resumed[scenario], output


def _same_weights(a: str, b: str) -> None:
    ours, theirs = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    assert ours.keys() == theirs.keys()
    for k in ours:
        assert torch.equal(ours[k], theirs[k]), k


@pytest.mark.parametrize("scenario", ["dpo", "grpo"])
def test_trl_run_killed_after_a_checkpoint_resumes_bit_exact_in_a_new_process(runs, tmp_path, scenario):
    proc, resumed, output = _interrupted(tmp_path, scenario, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL, output[-3000:]
    assert resumed["global_step"] == 4
    _same_weights(resumed["weights_file"], runs["trainwright"][scenario]["weights_file"])


def test_trl_run_stopped_by_sigterm_saves_and_resumes_bit_exact(runs, tmp_path):
    proc, resumed, output = _interrupted(tmp_path, "sft_lora", signal.SIGTERM)
    assert proc.returncode == 0, output[-3000:]  # the preemption save, then a clean exit
    assert "SAVED 3" in output  # the step in progress when the signal came
    assert os.path.isfile(tmp_path / "run" / "sft_lora" / "checkpoint-3" / "adapter_model.safetensors")
    assert resumed["global_step"] == 4
    _same_weights(resumed["weights_file"], runs["trainwright"]["sft_lora"]["weights_file"])
