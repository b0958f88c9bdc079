"""trainwright's own JSONL / CSV reporters: rows, growing CSV header, resume truncation."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import torch
from kit.reporters import drive, make_args, make_state

from trainwright.reporters.files import CsvCallback, JsonlCallback


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def read_csv(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def test_jsonl_one_row_per_log_with_step_and_epoch(tmp_path):
    args = make_args(tmp_path)
    logs = [
        (1, {"loss": torch.tensor(1.5), "learning_rate": np.float32(0.25)}),
        (2, {"loss": 1.25, "grad_norm": float("nan")}),
        (2, {"eval_loss": 2.0, "eval_runtime": 0.1, "note": "ok", "shape": (2, 3)}),
    ]
    drive(JsonlCallback(), args, logs)
    rows = read_jsonl(tmp_path / "logs.jsonl")
    assert rows[0] == {"step": 1, "epoch": 0.1, "loss": 1.5, "learning_rate": 0.25}
    assert rows[1]["step"] == 2 and math.isnan(rows[1]["grad_norm"])
    assert rows[2] == {
        "step": 2,
        "epoch": 0.2,
        "eval_loss": 2.0,
        "eval_runtime": 0.1,
        "note": "ok",
        "shape": [2, 3],
    }


def test_jsonl_resume_drops_rows_after_the_checkpoint_and_appends(tmp_path):
    args = make_args(tmp_path)
    drive(JsonlCallback(), args, [(s, {"loss": 1.0 / s}) for s in range(1, 6)])
    # Resume from checkpoint-3: rows 4 and 5 were logged after it and will be logged again.
    with open(tmp_path / "logs.jsonl", "a") as f:
        f.write('{"step": 6, "loss"')  # a row cut off by the crash
    resumed = make_state(global_step=3)
    drive(JsonlCallback(), args, [(s, {"loss": 2.0 / s}) for s in range(4, 7)], state=resumed)
    rows = read_jsonl(tmp_path / "logs.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[2]["loss"] == 1.0 / 3 and rows[3]["loss"] == 2.0 / 4


def test_jsonl_fresh_run_starts_a_new_file(tmp_path):
    args = make_args(tmp_path)
    drive(JsonlCallback(), args, [(0, {"eval_loss": 3.0}), (1, {"loss": 1.0})])
    drive(JsonlCallback(), args, [(0, {"eval_loss": 4.0})])
    assert read_jsonl(tmp_path / "logs.jsonl") == [{"step": 0, "epoch": 0.0, "eval_loss": 4.0}]


def test_jsonl_trials_write_their_own_files(tmp_path):
    args = make_args(tmp_path)
    for trial in ("0", "1"):
        state = make_state(is_hyper_param_search=True, trial_name=trial)
        drive(JsonlCallback(), args, [(1, {"loss": float(trial)})], state=state)
    assert read_jsonl(tmp_path / "logs-0.jsonl")[0]["loss"] == 0.0
    assert read_jsonl(tmp_path / "logs-1.jsonl")[0]["loss"] == 1.0
    assert not (tmp_path / "logs.jsonl").exists()


def test_jsonl_evaluate_without_train_appends(tmp_path):
    args = make_args(tmp_path)
    drive(JsonlCallback(), args, [(1, {"loss": 1.0})])
    reporter = JsonlCallback()
    state = make_state(global_step=1)
    reporter.on_log(args, state, None, logs={"eval_loss": 0.5})
    assert [r.get("eval_loss") for r in read_jsonl(tmp_path / "logs.jsonl")] == [None, 0.5]


def test_csv_header_grows_and_file_stays_valid(tmp_path):
    args = make_args(tmp_path)
    logs = [
        (1, {"loss": 1.0, "learning_rate": 0.1}),
        (2, {"loss": 0.5, "learning_rate": 0.05}),
        (2, {"eval_loss": 0.7}),
        (3, {"loss": 0.25, "learning_rate": 0.01, "note": 'a "quoted", text'}),
    ]
    drive(CsvCallback(), args, logs)
    header, rows = read_csv(tmp_path / "logs.csv")
    assert header == ["step", "epoch", "loss", "learning_rate", "eval_loss", "note"]
    assert [r["step"] for r in rows] == ["1", "2", "2", "3"]
    assert rows[0]["loss"] == "1.0" and rows[0]["eval_loss"] == ""
    assert rows[2]["eval_loss"] == "0.7" and rows[2]["loss"] == ""
    assert rows[3]["note"] == 'a "quoted", text'


def test_csv_resume_keeps_header_and_rows_up_to_checkpoint(tmp_path):
    args = make_args(tmp_path)
    drive(CsvCallback(), args, [(1, {"loss": 1.0}), (2, {"eval_loss": 2.0}), (3, {"loss": 0.5})])
    drive(
        CsvCallback(),
        args,
        [(3, {"loss": 0.4}), (4, {"loss": 0.3, "extra": 1})],
        state=make_state(global_step=2),
    )
    header, rows = read_csv(tmp_path / "logs.csv")
    assert header == ["step", "epoch", "loss", "eval_loss", "extra"]
    assert [(r["step"], r["loss"], r["eval_loss"], r["extra"]) for r in rows] == [
        ("1", "1.0", "", ""),
        ("2", "", "2.0", ""),
        ("3", "0.4", "", ""),
        ("4", "0.3", "", "1"),
    ]


def test_other_ranks_write_nothing(tmp_path):
    args = make_args(tmp_path)
    state = make_state(is_world_process_zero=False, is_local_process_zero=False)
    drive([JsonlCallback(), CsvCallback()], args, [(1, {"loss": 1.0})], state=state)
    assert not (tmp_path / "logs.jsonl").exists() and not (tmp_path / "logs.csv").exists()
