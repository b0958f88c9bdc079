"""The job side of a library run on both trainers (tests/jobs/trl_job.py, st_job.py, setfit_job.py, ...):
a job script builds a library's trainer for a scenario; these helpers train it, report its log history,
files and final weights, and check trainwright's guarantees on it (a resume from checkpoint-2 in the
same process, a background checkpoint's bytes).

Plain functions, imported by job scripts running in a process of their own (`python JOB CFG` trains on
transformers, `python -m trainwright run JOB CFG` on trainwright). A job's `build(scenario, out, cfg,
**overrides)` returns the trainer; `cfg` is the JSON the test passed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

Build = Callable[..., Any]


def announce_callback(pause: float) -> Any:
    """A callback that prints SAVED <step> at each save and sleeps `pause` seconds a step (for the
    signal tests, which kill the job once a checkpoint is on disk)."""
    import transformers

    class Announce(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            time.sleep(pause)

        def on_save(self, args, state, control, **kwargs):
            print(f"SAVED {state.global_step}", flush=True)

    return Announce()


def callbacks(cfg: dict) -> list:
    return [announce_callback(cfg.get("pause", 0.0))] if cfg.get("announce") else []


def weights(trainer: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def folder_files(path: str) -> dict[str, list[str]]:
    """{checkpoint folder: its files} and {".": the output folder's entries}."""
    return {
        entry: sorted(os.listdir(os.path.join(path, entry)))
        for entry in sorted(os.listdir(path))
        if entry.startswith("checkpoint-")
    } | {".": sorted(os.listdir(path))}


def _bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def weight_files_equal(a: str, b: str) -> bool:
    """The weight and state files of two checkpoint folders hold the same bytes (searched below them:
    a library's model may be saved in module subfolders)."""
    names = [
        os.path.relpath(os.path.join(folder, n), a)
        for folder, _, files in os.walk(a)
        for n in files
        if n.endswith((".safetensors", ".pt", ".pth", ".bin", "adapter_config.json"))
        and n != "training_args.bin"  # the arguments differ: one run sets async_save
    ]
    return bool(names) and all(_bytes(os.path.join(a, n)) == _bytes(os.path.join(b, n)) for n in names)


def save_weights(trainer: Any, out: str, tag: str) -> str:
    path = os.path.join(os.path.dirname(out), f"{os.path.basename(out)}-{tag}-weights.pt")
    torch.save(weights(trainer), path)
    return path


def trainer_base(trainer: Any) -> str:
    """The module of the first transformers or trainwright class in the trainer's MRO."""
    return next(
        c.__module__
        for c in type(trainer).__mro__
        if c.__module__.startswith(("transformers", "trainwright"))
    )


def run_scenario(build: Build, scenario: str, cfg: dict, checks: Callable[..., dict] | None = None) -> dict:
    """Train `scenario` (4 steps, a checkpoint every 2) and report it; with cfg "resumed" and "async",
    the resume and background-save checks; `checks(scenario, trainer, out)` adds the job's own."""
    out = os.path.join(cfg["root"], scenario)
    if cfg.get("only_resume"):
        trainer = build(scenario, out, cfg)
        trainer.train(resume_from_checkpoint=True)
        return {
            "weights_file": save_weights(trainer, out, "resumed"),
            "global_step": trainer.state.global_step,
        }
    trainer = build(scenario, out, cfg)
    trainer.train()
    trainer.save_model()
    report = {
        "base": trainer_base(trainer),
        "history": trainer.state.log_history,
        "files": folder_files(out),
        "weights_file": save_weights(trainer, out, "final"),
    }
    if checks is not None:
        report.update(checks(scenario, trainer, out))
    if cfg.get("resumed"):
        again = build(scenario, out + "_resumed", cfg)
        again.train(resume_from_checkpoint=os.path.join(out, "checkpoint-2"))
        report["resume_exact"] = same_weights(weights(again), weights(trainer))
    if cfg.get("async"):
        later = build(scenario, out + "_async", cfg, async_save=True)
        later.train()
        report["async_same_bytes"] = all(
            weight_files_equal(os.path.join(out, c), os.path.join(out + "_async", c))
            for c in ("checkpoint-2", "checkpoint-4")
        )
    return report


def main(run: Callable[[dict], dict]) -> None:
    """A job's entry point: CFG (JSON) from argv, `run(cfg)`'s report written to cfg["report"] (under
    torchrun by rank 0 alone: every rank reports the same run)."""
    torch.set_num_threads(1)
    cfg = json.loads(sys.argv[1])
    report = run(cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        with open(cfg["report"], "w") as f:
            json.dump(report, f)
