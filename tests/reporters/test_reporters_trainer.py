"""Reporters under the real Trainer: what they write matches state.log_history, also across resume."""

from __future__ import annotations

import json

import pytest
from conftest import DropoutMLP, VectorDataset

from trainwright.loop.trainer import Trainer


def jsonl_rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_rows_match_log_history_and_resume_does_not_duplicate(make_args, tmp_path):
    args = make_args(
        max_steps=6, logging_steps=1, save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=3,
        per_device_train_batch_size=8, report_to=["jsonl"], seed=1,
    )  # fmt: skip
    data = VectorDataset(n=64)
    trainer = Trainer(
        model=DropoutMLP(), args=args, train_dataset=data, eval_dataset=VectorDataset(n=16, seed=1)
    )
    trainer.train()
    path = tmp_path / "out" / "logs.jsonl"
    full = jsonl_rows(path)
    assert [r["step"] for r in full] == [r["step"] for r in trainer.state.log_history]
    for row, logged in zip(full, trainer.state.log_history):
        assert {k: row[k] for k in logged if k != "step"} == pytest.approx(
            {k: v for k, v in logged.items() if k != "step"}
        )

    # resume from checkpoint-4 in a new trainer: rows after step 4 are replaced, none duplicated
    resumed = Trainer(
        model=DropoutMLP(), args=args, train_dataset=data, eval_dataset=VectorDataset(n=16, seed=1)
    )
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-4"))
    again = jsonl_rows(path)
    assert [r["step"] for r in again] == [r["step"] for r in full]
    assert [r.get("loss") for r in again] == pytest.approx([r.get("loss") for r in full])
