"""Real torchrun launches: gloo on the loopback, the ranks' output on one pipe, and a launch that
overruns killed with every process under it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import psutil
import torch
from safetensors.torch import load_file

from kit import job, job_env

DIST_JOB = job("dist_job.py")

# Arguments of dist_job.py's tasks.
# SGD with momentum: Adam would turn the float noise of parameters whose true gradient is zero (the
# attention key bias) into full-size steps, and momentum gives the optimizer state to checkpoint.
SGD = {"optim": "sgd", "optim_args": "momentum=0.9", "learning_rate": 0.1}
LM_GA = {**SGD, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2}
FSDP_WRAP = {"fsdp": "full_shard auto_wrap", "fsdp_config": {"transformer_layer_cls_to_wrap": ["_Block"]}}


def free_port() -> int:
    """A free TCP port on the loopback interface (for a torchrun's --master_port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loopback(nproc: int = 2) -> list[str]:
    """torchrun's arguments for `nproc` ranks on this machine, meeting on a free port."""
    return [f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1", f"--master_port={free_port()}"]


def torchrun_command(nproc: int = 2) -> list[str]:
    """`python -m torch.distributed.run` on the loopback; the script and its arguments follow."""
    return [sys.executable, "-m", "torch.distributed.run", *loopback(nproc)]


def launch_env() -> dict[str, str]:
    return job_env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def spawn(cmd: list[str], **kw) -> subprocess.Popen:
    """A launcher in a session of its own, stdout and stderr on one pipe."""
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=launch_env(),
        start_new_session=True,
        **kw,
    )


def start(launcher_args: list[str], cfg: dict, script: str = DIST_JOB) -> subprocess.Popen:
    return spawn([sys.executable, "-m", "torch.distributed.run", *launcher_args, script, json.dumps(cfg)])


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a launcher and every process under it (torchrun starts each worker in its own session,
    so killing the launcher's process group would leave the workers running)."""
    try:
        parent = psutil.Process(proc.pid)
        family = [*parent.children(recursive=True), parent]
    except psutil.NoSuchProcess:
        family = []
    for member in family:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()


def finish(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str]]:
    """Each launcher's exit code and output; all of them killed if any is still running at `timeout`."""
    deadline = time.monotonic() + timeout
    results = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(deadline - time.monotonic(), 1))
            results.append((p.returncode, out))
    except subprocess.TimeoutExpired:
        for p in procs:
            kill_tree(p)
            p.communicate()
        raise AssertionError(f"distributed job still running after {timeout} s: killed") from None
    return results


def torchrun(
    cfg: dict, nproc: int = 2, timeout: float = 240, check: bool = True, script: str = DIST_JOB
) -> tuple[int, str]:
    """`script` (tests/jobs/dist_job.py by default) with `cfg` on `nproc` ranks; its exit code and output."""
    code, out = finish([start(loopback(nproc), cfg, script)], timeout)[0]
    if check and code != 0:
        raise AssertionError(f"torchrun job failed ({code}):\n{out[-6000:]}")
    return code, out


def result(folder: str) -> dict:
    with open(os.path.join(folder, "result.json")) as f:
        return json.load(f)


def weights(folder: str) -> dict[str, torch.Tensor]:
    return load_file(os.path.join(folder, "final", "model.safetensors"))


def assert_close_weights(a: dict, b: dict, atol: float = 2e-6) -> None:
    assert set(a) == set(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
