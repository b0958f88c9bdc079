"""docs/train_config.md's complete config runs as written with `trainwright train` (smaller model and
fewer steps given as flags, which also shows that flags override the file)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml
from kit import ROOT

DOC = ROOT / "docs" / "train_config.md"


def doc_config() -> str:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 1, "docs/train_config.md should hold one yaml block: the complete config"
    return blocks[0]


def test_the_documented_config_trains_a_transformers_model(tmp_path):
    pytest.importorskip("transformers")
    text = doc_config()
    config = yaml.safe_load(text)
    assert config["model_type"] == "llama" and config["train_file"] == "data/train.txt"
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.txt").write_text("the quick brown fox jumps over the lazy dog. " * 120)
    (tmp_path / "data" / "valid.txt").write_text("a lazy dog sleeps in the sun all day long. " * 30)
    (tmp_path / "run.yaml").write_text(text)
    small = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
    }
    overrides = [
        "--model_config",
        json.dumps(small),
        "--block_size",
        "32",
        "--max_steps",
        "4",
        "--per_device_train_batch_size",
        "4",
        "--eval_steps",
        "2",
        "--save_steps",
        "2",
        "--logging_steps",
        "2",
        "--learning_rate",
        "1e-4",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "trainwright", "train", "run.yaml", *overrides],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / config["output_dir"]
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    assert (out / "model.safetensors").is_file()
    model_config = json.loads((out / "config.json").read_text())
    assert model_config["model_type"] == "llama" and model_config["hidden_size"] == 32
    assert model_config["vocab_size"] == 256  # bytes: no tokenizer folder given
    results = json.loads((out / "all_results.json").read_text())
    assert "eval_loss" in results and "train_loss" in results
    assert (out / "checkpoint-4").is_dir() and (out / "logs.jsonl").is_file()
    args = json.loads((out / "training_args.json").read_text())
    assert args["learning_rate"] == 1e-4 and args["lr_scheduler_type"] == "cosine"  # flag, then file
