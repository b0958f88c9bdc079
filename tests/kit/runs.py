"""Small Trainer runs tests of several folders share: a RegressionModel run (optionally with scripted
metrics choosing the best checkpoint), one SGD step, and tests/jobs/resume_job.py in its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from typing import Any

from conftest import RegressionDataset, RegressionModel
from safetensors.torch import load_file

from kit import job, job_env
from trainwright import Trainer

RESUME_JOB = job("resume_job.py")


def regression_trainer(args: Any, eval_dataset: Any = None, **kw: Any) -> Trainer:
    """A Trainer of RegressionModel() on the 64 samples of RegressionDataset()."""
    return Trainer(
        model=RegressionModel(), args=args, train_dataset=RegressionDataset(), eval_dataset=eval_dataset, **kw
    )


def one_step(
    model_fn, make_args, data, bs: int, ga: int, trainer_cls: type = Trainer, collator: Any = None, **kw: Any
) -> tuple[Trainer, dict]:
    """One optimizer step (SGD, learning rate 1, no clipping, samples in order) of `bs` x `ga` samples:
    the trainer and the weights after it, the measure of an accumulated step against a full batch."""
    model = model_fn()
    args = make_args(
        per_device_train_batch_size=bs,
        gradient_accumulation_steps=ga,
        max_steps=1,
        optim="sgd",
        learning_rate=1.0,
        max_grad_norm=0,
        train_sampling_strategy="sequential",
        **kw,
    )
    trainer = trainer_cls(model=model, args=args, train_dataset=data, data_collator=collator)
    trainer.train()
    return trainer, {k: v.detach().clone() for k, v in model.state_dict().items()}


def scored_best_model_run(make_args, scores: Iterable[float], eval_length: int, **kw: Any) -> Trainer:
    """Train a regression_trainer that evaluates and saves every 2 steps and loads its best checkpoint
    at the end; the metric "score" (lower is better) of each evaluation is the next of `scores`."""
    values = iter(scores)
    args = make_args(
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        load_best_model_at_end=True,
        metric_for_best_model="score",
        greater_is_better=False,
        **kw,
    )
    trainer = regression_trainer(
        args, RegressionDataset(length=eval_length), compute_metrics=lambda _: {"score": next(values)}
    )
    trainer.train()
    return trainer


def run_resume_job(cfg: dict, check: bool = True) -> subprocess.CompletedProcess:
    """resume_job.py with `cfg`, to its end; `check`: fail with its stderr if it did not exit 0."""
    proc = subprocess.run(
        [sys.executable, RESUME_JOB, json.dumps(cfg)],
        capture_output=True,
        text=True,
        env=job_env(),
        timeout=300,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"job failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def resume_job_result(folder: str) -> tuple[dict, dict]:
    """What a finished resume_job.py wrote: its result.json and its final weights."""
    with open(os.path.join(folder, "result.json")) as f:
        res = json.load(f)
    return res, load_file(os.path.join(folder, "final", "model.safetensors"))


def start_resume_job(cfg: dict, stderr: int = subprocess.PIPE) -> subprocess.Popen:
    """resume_job.py with `cfg`, started; its stdout (the "STEP n" lines of `announce`) piped."""
    return subprocess.Popen(
        [sys.executable, RESUME_JOB, json.dumps(cfg)],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=job_env(),
    )


def read_until(proc: subprocess.Popen, prefix: str) -> bool:
    """Read `proc`'s stdout up to a line starting with `prefix`; False if it ended first."""
    assert proc.stdout is not None
    return any(line.startswith(prefix) for line in proc.stdout)
