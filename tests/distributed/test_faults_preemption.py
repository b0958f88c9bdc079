"""Preemption with DataLoader workers (issue 18, item 1), with real processes and real signals.

A scheduler (Slurm, systemd, Kubernetes) stops a job by signalling its whole process group, and
torchrun forwards a signal to each rank's group: the DataLoader workers get it too. The run must then
save and exit 0 exactly as with no workers, and resume bit for bit; the workers leave the decision to
the main process, which still stops a worker that does not end (torch's `terminate()`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import psutil
import pytest
import torch
from kit.faults import hidden
from safetensors.torch import load_file
from torch.utils.data import Dataset

import trainwright.checkpoint as ckpt
from trainwright import TrainingArguments
from trainwright.data import make_dataloader

MAX_STEPS = 24  # 64 items, batch 4: 16 steps an epoch, so the run crosses an epoch boundary


def _job_cfg(out: str, **kw) -> dict:
    return {
        "output_dir": out,
        "max_steps": MAX_STEPS,
        "workers": 2,
        "train_item_sleep": 0.02,  # 0.08 s a batch: the main process mostly waits for a worker
        "augment": True,  # workers draw from their RNG: resume is exact only if their seeds are
        "dropout": 0.3,
        **kw,
    }


def _weights(folder: str) -> dict[str, torch.Tensor]:
    return load_file(os.path.join(folder, "model.safetensors"))


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"persistent": True},
        {"async_save": True, "save_steps": 3},
        {"persistent": True, "async_save": True},
    ],
    ids=["workers", "persistent", "async_save", "persistent+async_save"],
)
def test_sigterm_to_the_process_group_with_workers_saves_exits_0_and_resumes_exactly(tmp_path, jobs, options):
    out, ref = str(tmp_path / "out"), str(tmp_path / "ref")
    reference = jobs(_job_cfg(ref, final=os.path.join(ref, "final"), **options))
    job = jobs(_job_cfg(out, **options))
    job.wait_for("STEP 6")
    os.killpg(job.proc.pid, signal.SIGTERM)  # the job's group: the trainer and its workers
    code, stdout, stderr = job.finish()
    assert code == 0, stderr[-3000:]
    assert "killed by signal" not in stderr and "exited unexpectedly" not in stderr
    assert "Preempted by SIGTERM: checkpoint written, exiting." in stderr
    last = ckpt.get_last_checkpoint(out)
    step = int(last.rsplit("-", 1)[1])
    assert 6 <= step < MAX_STEPS and f"STEP {step + 1}" not in stdout  # the step ended, then it stopped
    assert ckpt.verify_checkpoint(last) == [] and hidden(out) == []

    final = os.path.join(out, "final")
    code, stdout, stderr = jobs(_job_cfg(out, resume=True, final=final, **options)).finish()
    assert code == 0, stderr[-3000:]
    assert f"DONE {MAX_STEPS}" in stdout
    code, _, stderr = reference.finish()
    assert code == 0, stderr[-3000:]
    expected, got = _weights(os.path.join(ref, "final")), _weights(final)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name


class _Stuck(Dataset):
    """Item 0 loads at once; every other item blocks for 10 minutes (a hung storage read)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict:
        if i:
            time.sleep(600)
        return {"x": torch.zeros(2)}


def _stuck_loader(tmp_path):
    args = TrainingArguments(
        output_dir=str(tmp_path), dataloader_num_workers=1, use_cpu=True, report_to="none"
    )
    assert "SIGTERM" in args.preemption_signals
    return make_dataloader(
        _Stuck(), batch_size=1, sampler=None, collate_fn=None, args=args, drop_last=False, seed=0
    )


def test_a_worker_ignores_preemption_signals_from_others_but_obeys_its_loader(tmp_path):
    """SIGTERM, SIGUSR1 and SIGINT sent by another process leave the worker loading; torch's own
    shutdown (join, then SIGTERM from the loader's process to a worker that does not stop) ends it."""
    iterator = iter(_stuck_loader(tmp_path))
    next(iterator)
    worker = psutil.Process(iterator._workers[0].pid)
    time.sleep(0.5)  # the worker is now inside the 600 s item
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        subprocess.run(["kill", f"-{sig.name[3:]}", str(worker.pid)], check=True)  # another sender
    time.sleep(1.0)
    assert worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE
    started = time.monotonic()
    iterator._shutdown_workers()  # what deleting the iterator does
    assert time.monotonic() - started < 30
    assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE


def test_without_preemption_signals_a_worker_dies_of_sigterm_as_before(tmp_path):
    args = TrainingArguments(
        output_dir=str(tmp_path),
        dataloader_num_workers=1,
        use_cpu=True,
        report_to="none",
        enable_jit_checkpoint=False,
    )
    assert args.preemption_signals == []
    loader = make_dataloader(
        _Stuck(), batch_size=1, sampler=None, collate_fn=None, args=args, drop_last=False, seed=0
    )
    iterator = iter(loader)
    next(iterator)
    with pytest.raises(
        RuntimeError, match=r"DataLoader worker \(pid.*(killed by signal: Terminated|exited unexpectedly)"
    ):
        subprocess.run(["kill", "-TERM", str(iterator._workers[0].pid)], check=True)
        next(iterator)  # torch's SIGCHLD handler, or the wait for the batch, reports the dead worker


def test_torchrun_forwarding_sigterm_with_workers_saves_on_every_rank_and_resumes_exactly(tmp_path):
    """Slurm signals torchrun's process group; torchrun forwards SIGTERM to each rank's whole group
    (rank and workers). Every rank finishes the step, the checkpoint is written, and a resume in new
    processes ends with the weights of the uninterrupted 2-process run."""
    from kit.torchrun import DIST_JOB, spawn, torchrun, torchrun_command

    task = {
        "name": "pre",
        "model": "mlp_dropout",
        "n": 64,
        "args": {
            "per_device_train_batch_size": 4,
            "max_steps": 16,
            "dataloader_num_workers": 2,
            "save_strategy": "steps",
            "save_steps": 1000,
            "learning_rate": 0.05,
        },
    }
    ref_root, root = tmp_path / "ref", tmp_path / "run"
    torchrun({"out": str(ref_root), "tasks": [task]})

    cmd = [
        *torchrun_command(),
        DIST_JOB,
        json.dumps({"out": str(root), "tasks": [{**task, "announce": True, "slow_items": 0.02}]}),
    ]
    proc = spawn(cmd)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("STEP 4"):
            break
    os.killpg(proc.pid, signal.SIGTERM)  # what a scheduler does: torchrun forwards it to the ranks
    rest, _ = proc.communicate(timeout=120)
    log = "".join(seen) + rest
    assert "exited unexpectedly" not in log and "killed by signal" not in log, log[-4000:]
    for rank in (0, 1):
        assert f"R{rank} trainwright.loop.trainer WARNING Preempted by SIGTERM" in log, log[-4000:]
    folder = str(root / "pre")
    last = ckpt.get_last_checkpoint(folder)
    assert last is not None and 4 <= int(last.rsplit("-", 1)[1]) < 16, log[-4000:]
    assert ckpt.verify_checkpoint(last) == []
    assert os.path.exists(os.path.join(last, "rng_state_1.pth"))

    torchrun({"out": str(root), "tasks": [{**task, "resume": True}]})
    expected = load_file(os.path.join(ref_root, "pre", "final", "model.safetensors"))
    got = load_file(os.path.join(folder, "final", "model.safetensors"))
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
