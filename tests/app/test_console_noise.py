"""What a newcomer sees on the console: building the package and a short run with a transformers model,
checkpoints and TensorBoard print nothing they did not ask for (no setuptools deprecation block, no
TensorFlow start-up, no "Writing model shards" bar per save)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from kit import ROOT


def _version(name: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in importlib.metadata.version(name).split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return ()


@pytest.mark.skipif(_version("setuptools") < (77,), reason="the SPDX license string needs setuptools >= 77")
def test_building_the_package_prints_no_warning(tmp_path):
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(
        ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", "dist", "."],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list((tmp_path / "dist").glob("trainwright-*.whl"))
    assert proc.stdout + proc.stderr == ""


TENSORBOARD_JOB = textwrap.dedent(
    """
    import sys
    import torch
    from torch import nn
    from trainwright import Trainer, TrainingArguments

    class Line(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Linear(2, 1)

        def forward(self, x, labels=None):
            y = self.w(x).squeeze(-1)
            return {"loss": ((y - labels) ** 2).mean(), "logits": y}

    torch.manual_seed(0)
    data = [{"x": torch.randn(2), "labels": torch.randn(())} for _ in range(16)]
    args = TrainingArguments(output_dir=sys.argv[1], logging_dir=sys.argv[2], max_steps=4, logging_steps=2,
                             per_device_train_batch_size=4, report_to=["tensorboard"], save_strategy="no")
    Trainer(model=Line(), args=args, train_dataset=data).train()
    print("TENSORFLOW_IMPORTED", "tensorflow" in sys.modules)
    """
)


def test_tensorboard_events_are_written_without_importing_tensorflow(tmp_path):
    pytest.importorskip("tensorboard")
    job = tmp_path / "job.py"
    job.write_text(TENSORBOARD_JOB)
    proc = subprocess.run(
        [sys.executable, str(job), str(tmp_path / "out"), str(tmp_path / "tb")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TENSORFLOW_IMPORTED False" in proc.stdout
    for marker in ("oneDNN", "cpu_feature_guard", "absl::InitializeLog", "TensorFlow binary"):
        assert marker not in proc.stderr
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [2, 4]


RUN_JOB = textwrap.dedent(
    """
    import sys
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from trainwright import Trainer, TrainingArguments

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                         bos_token_id=0, eos_token_id=1, pad_token_id=2)
    data = [{"input_ids": torch.randint(3, 64, (16,))} for _ in range(16)]
    data = [{**row, "labels": row["input_ids"]} for row in data]
    args = TrainingArguments(output_dir=sys.argv[1], max_steps=4, per_device_train_batch_size=4, save_steps=2,
                             logging_steps=2, eval_strategy="steps", eval_steps=2, report_to=["tensorboard"])
    trainer = Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=data, eval_dataset=data[:4])
    trainer.train()
    trainer.save_model()
    print("TENSORFLOW_IMPORTED", "tensorflow" in sys.modules)
    """
)


@pytest.mark.skipif(
    importlib.util.find_spec("torchao") is not None,
    reason="torchao is installed (not part of the test set-up): transformers imports it, and PyPI's CUDA "
    "build logs its 'Failed to load' lines on a CPU-only torch",
)
def test_a_short_transformers_run_prints_nothing_on_stderr(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("tensorboard")
    job = tmp_path / "job.py"
    job.write_text(RUN_JOB)
    env = {k: v for k, v in os.environ.items() if k != "TORCHAO_FORCE_SKIP_LOADING_SO_FILES"}
    # one thread: on a machine busier than its CPUs the Trainer's own warning says so (observe/host.py),
    # which is not third-party noise
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, str(job), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TENSORFLOW_IMPORTED False" in proc.stdout
    assert proc.stderr.splitlines() == []
    assert "Writing model shards" not in proc.stdout
    assert (tmp_path / "out" / "checkpoint-4" / "model.safetensors").is_file()
