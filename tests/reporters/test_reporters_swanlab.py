"""SwanLab reporter: a real Trainer run with report_to="swanlab" in offline mode (in a subprocess:
swanlab hooks the console and closes its run at exit), its backup file read back with swanlab's
own reader."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap

import pytest
import yaml

pytest.importorskip("swanlab")

from trainwright.reporters import get_reporter_class, normalize_report_to  # noqa: E402
from trainwright.reporters.swanlab import SwanLabCallback  # noqa: E402

JOB = textwrap.dedent(
    """
    import json, sys
    import torch
    from trainwright import Trainer, TrainingArguments

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = {"hidden_size": 3, "model_type": "tiny"}
            self.linear = torch.nn.Linear(3, 1)

        def forward(self, x, labels=None):
            out = self.linear(x).squeeze(-1)
            return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

    torch.manual_seed(0)
    data = [{"x": torch.randn(3), "labels": torch.randn(())} for _ in range(32)]
    args = TrainingArguments(
        output_dir=sys.argv[1], max_steps=4, logging_steps=2, per_device_train_batch_size=4,
        eval_strategy="steps", eval_steps=4, save_strategy="no", report_to="swanlab",
        run_name="swan-run", learning_rate=0.05, disable_tqdm=True, use_cpu=True,
    )
    trainer = Trainer(model=Model(), args=args, train_dataset=data, eval_dataset=data[:8])
    trainer.train()
    with open(sys.argv[2], "w") as f:
        json.dump(trainer.state.log_history, f)
    """
)


def read_backup(run_dir: str) -> list[dict]:
    from swanlab.log.backup.datastore import DataStore

    store = DataStore()
    store.open_for_scan(os.path.join(run_dir, "backup.swanlab"))
    records = [json.loads(r) for r in store if r is not None]
    return records


@pytest.fixture
def swan_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWANLAB_")}
    env.update(
        SWANLAB_MODE="offline",
        SWANLAB_LOG_DIR=str(tmp_path / "swanlog"),
        SWANLAB_SAVE_DIR=str(tmp_path / "swanhome"),  # swanlab's own folder, kept out of $HOME
        SWANLAB_PROJECT="trainwright-test",
        PYTHONUNBUFFERED="1",
    )
    return env


def test_trainer_run_is_written_to_an_offline_swanlab_backup(tmp_path, swan_env):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    history_file = tmp_path / "history.json"
    proc = subprocess.run(
        [sys.executable, str(job), str(tmp_path / "out"), str(history_file)],
        cwd=tmp_path,
        env=swan_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    history = json.loads(history_file.read_text())
    (run_name,) = [d for d in os.listdir(tmp_path / "swanlog") if d.startswith("run-")]
    run_dir = tmp_path / "swanlog" / run_name
    records = read_backup(str(run_dir))

    def first(model_type):
        return next(r["data"] for r in records if r["model_type"] == model_type)

    assert first("Project")["name"] == "trainwright-test"
    assert first("Experiment")["name"] == "swan-run"
    scalars: dict[str, dict[int, float]] = {}
    for r in records:
        if r["model_type"] == "Scalar":
            scalars.setdefault(r["data"]["key"], {})[r["data"]["step"]] = r["data"]["metric"]["data"]
    train_rows = [row for row in history if "loss" in row]
    assert scalars["train/loss"] == {row["step"]: pytest.approx(row["loss"]) for row in train_rows}
    assert scalars["train/learning_rate"] == {
        row["step"]: pytest.approx(row["learning_rate"]) for row in train_rows
    }
    (eval_row,) = [row for row in history if "eval_loss" in row]
    assert scalars["eval/loss"] == {4: pytest.approx(eval_row["eval_loss"])}
    assert scalars["train/global_step"] == {2: 2, 4: 4}
    (summary,) = [row for row in history if "train_runtime" in row]
    assert scalars["single_value/train_loss"] == {4: pytest.approx(summary["train_loss"])}
    assert "train/train_loss" not in scalars  # the summary goes to single_value/ only
    assert next(r for r in records if r["model_type"] == "Footer")["data"]["success"] is True

    config = yaml.safe_load((run_dir / "files" / "config.yaml").read_text())
    values = {k: v["value"] for k, v in config.items()}
    assert values["learning_rate"] == 0.05 and values["run_name"] == "swan-run"
    assert values["hidden_size"] == 3 and values["model_num_parameters"] == 4
    assert values["FRAMEWORK"] == "trainwright"


def test_all_includes_swanlab_only_when_it_can_run_unattended(monkeypatch, tmp_path):
    for name in ("SWANLAB_MODE", "SWANLAB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SWANLAB_SAVE_DIR", str(tmp_path / "nohome"))
    assert "no SwanLab API key" in SwanLabCallback.skip_reason()
    assert "swanlab" not in normalize_report_to("all")
    (tmp_path / "nohome").mkdir()
    (tmp_path / "nohome" / ".netrc").write_text("machine https://swanlab.cn login user password key\n")
    assert SwanLabCallback.skip_reason() is None  # `swanlab login` stored a key
    monkeypatch.setenv("SWANLAB_SAVE_DIR", str(tmp_path / "nohome2"))
    for mode in ("offline", "local", "disabled"):
        monkeypatch.setenv("SWANLAB_MODE", mode)
        assert SwanLabCallback.skip_reason() is None
        assert "swanlab" in normalize_report_to("all")
    assert get_reporter_class("swanlab") is SwanLabCallback


def test_resume_variables_need_an_init_that_takes_them(monkeypatch, tmp_path):
    monkeypatch.setenv("SWANLAB_SAVE_DIR", str(tmp_path / "swanhome"))
    import swanlab

    from trainwright.args.training_args import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), run_name="r")
    kwargs = SwanLabCallback._init_kwargs(args, "trial-3", swanlab.init)
    assert kwargs["experiment_name"] == "r-trial-3"
    monkeypatch.setenv("SWANLAB_RUN_ID", "abc123")
    if "id" in inspect.signature(swanlab.init).parameters:
        assert SwanLabCallback._init_kwargs(args, None, swanlab.init)["id"] == "abc123"
    else:  # swanlab 0.6.x: init would swallow id= silently, so the variable is refused
        with pytest.raises(ValueError, match="SWANLAB_RUN_ID.*no 'id' argument"):
            SwanLabCallback._init_kwargs(args, None, swanlab.init)
