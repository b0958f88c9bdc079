"""A run's faults as a cluster makes them: a small model and data to break, tests/jobs/fault_job.py in a
process of its own (and session, so a signal to its group stays there), and a real tmpfs to fill."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

import trainwright.checkpoint as ckpt
from kit import TESTS, job
from trainwright import Trainer, TrainingArguments

FAULT_JOB = job("fault_job.py")


class Data(Dataset):
    def __init__(self, n: int = 32, d: int = 8) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, d, generator=g)
        self.y = self.x.sum(-1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "labels": self.y[i]}


class Net(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 1))

    def forward(self, x, labels=None):
        out = self.net(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


def fault_trainer(output_dir, model=None, dataset=None, **kw) -> Trainer:
    defaults = dict(
        per_device_train_batch_size=4,
        max_steps=4,
        save_steps=2,
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
    )
    args = TrainingArguments(output_dir=output_dir, **{**defaults, **kw})
    return Trainer(model=model or Net(), args=args, train_dataset=dataset or Data())


class FaultJob:
    """tests/jobs/fault_job.py in its own process and session; its stdout read line by line."""

    def __init__(self, cfg: dict) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, FAULT_JOB, json.dumps(cfg)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=TESTS,
            start_new_session=True,
        )
        self.lines: list[str] = []

    def wait_for(self, prefix: str, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line.rstrip("\n"))
            if line.startswith(prefix):
                return line.strip()
        self.proc.kill()
        raise AssertionError(
            f"no {prefix!r} line; exit {self.proc.wait()}; stdout tail {self.lines[-10:]}; "
            f"stderr {self.proc.stderr.read()[-3000:]}"
        )

    def finish(self, timeout: float = 120.0) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        self.lines += out.splitlines()
        return self.proc.returncode, "\n".join(self.lines), err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()


def hidden(folder) -> list[str]:
    return sorted(e for e in os.listdir(folder) if e.startswith(".checkpoint"))


@contextlib.contextmanager
def mounted_tmpfs(where, size: str, read_only: bool = False):
    """A real tmpfs at `where`, or a skip where this user may not mount (CI without privileges)."""
    os.makedirs(where, exist_ok=True)
    opts = f"size={size}" + (",ro" if read_only else "")
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot run mount: {exc}")
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield str(where)
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def check_full_disk_error(exc: BaseException, out: str, name: str, file: str) -> None:
    text = str(exc)
    assert isinstance(exc, ckpt.CheckpointError), text
    assert f"could not write checkpoint {name!r} in {out}: No space left on device" in text, text
    assert file in text, text
    assert "the disk of" in text and "is full" in text
