"""Checkpoints travel both ways between trainwright and the installed transformers (issue 18, item 15).

A user who changes the import back to `transformers.Trainer` keeps their run: transformers'
`train(resume_from_checkpoint=...)` resumes a trainwright checkpoint (trainer_state.json and
rng_state.pth are in upstream's format; trainwright's own state is in data_state.json, which
transformers ignores), and trainwright resumes transformers' checkpoints as before. Each side is
checked where the formats allow exactness: after the resume has restored everything, the model's
weights, the optimizer's moments (by parameter name), the schedule, the global step and the state of
the Python, NumPy and torch generators are those of the step the checkpoint was written at, and the
logged history carries on. (The data order is each library's own: a resumed run continues in the
resuming library's order, as it would after an uninterrupted run of it.)

GPT-2 from a config, a tokenizer trained offline, DataCollatorForLanguageModeling, 2 dataloader
workers, accumulation 2; every run in a process of its own (tests/jobs/hf_roundtrip_job.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")
from kit import hf, job, job_env  # noqa: E402

tokenizer_dir = hf.tokenizer_dir  # the session fixture
JOB = job("hf_roundtrip_job.py")


def _run(trainer: str, tokenizer: str, out: str, report: str, resume: str | None = None) -> dict:
    cfg = {"trainer": trainer, "tokenizer": tokenizer, "output_dir": out, "report": report, "resume": resume}
    proc = subprocess.run(
        [sys.executable, JOB, json.dumps(cfg)], capture_output=True, text=True, timeout=600, env=job_env()
    )
    assert proc.returncode == 0, f"{trainer} job failed ({proc.returncode}):\n{proc.stderr[-5000:]}"
    with open(os.path.join(report, "final.json")) as f:
        return json.load(f)


def _assert_restored(saved_path: str, loaded_path: str) -> None:
    saved, loaded = torch.load(saved_path), torch.load(loaded_path)
    assert loaded["global_step"] == saved["global_step"]
    assert saved["weights"].keys() == loaded["weights"].keys()
    for name, value in saved["weights"].items():
        assert torch.equal(loaded["weights"][name], value), name
    assert saved["optimizer"].keys() == loaded["optimizer"].keys() and saved["optimizer"]
    for name, moments in saved["optimizer"].items():
        for key, value in moments.items():
            assert torch.equal(loaded["optimizer"][name][key], value), (name, key)
    for key in ("last_epoch", "base_lrs", "_last_lr", "_step_count"):
        assert loaded["scheduler"][key] == saved["scheduler"][key], key
    assert loaded["draws"] == saved["draws"]  # Python (with its cached gaussian), NumPy, torch CPU


def _upstream_format(checkpoint: str) -> None:
    """What transformers reads is in transformers' format (its own classes read it)."""
    from transformers.trainer_callback import TrainerState as UpstreamState

    UpstreamState.load_from_json(os.path.join(checkpoint, "trainer_state.json"))  # no foreign key
    rng = torch.load(os.path.join(checkpoint, "rng_state.pth"), weights_only=True)  # no allow-list
    assert set(rng) == {"python", "numpy", "cpu"}
    assert isinstance(rng["python"], tuple) and rng["python"][0] == 3 and len(rng["python"][1]) == 625


def test_transformers_resumes_a_trainwright_checkpoint(tokenizer_dir, tmp_path):
    out = str(tmp_path / "run")
    written = _run("trainwright", tokenizer_dir, out, str(tmp_path / "tw"))
    checkpoint = os.path.join(out, "checkpoint-4")
    _upstream_format(checkpoint)
    assert os.path.exists(os.path.join(checkpoint, "data_state.json"))  # trainwright's own state

    resumed = _run("transformers", tokenizer_dir, out, str(tmp_path / "hf"), resume=checkpoint)
    _assert_restored(str(tmp_path / "tw" / "save-4.pt"), str(tmp_path / "hf" / "loaded.pt"))
    assert resumed["global_step"] == 9
    assert resumed["rows"][:4] == written["rows"][:4]  # the history carried over
    assert [r["step"] for r in resumed["rows"]] == list(range(1, 10))


def test_trainwright_resumes_a_transformers_checkpoint(tokenizer_dir, tmp_path):
    out = str(tmp_path / "run")
    written = _run("transformers", tokenizer_dir, out, str(tmp_path / "hf"))
    checkpoint = os.path.join(out, "checkpoint-4")
    assert not os.path.exists(os.path.join(checkpoint, "data_state.json"))

    resumed = _run("trainwright", tokenizer_dir, out, str(tmp_path / "tw"), resume=checkpoint)
    _assert_restored(str(tmp_path / "hf" / "save-4.pt"), str(tmp_path / "tw" / "loaded.pt"))
    assert resumed["global_step"] == 9
    assert resumed["rows"][:4] == written["rows"][:4]
    assert [r["step"] for r in resumed["rows"]] == list(range(1, 10))
