"""Files written through a temporary file get the mode the umask gives (0644 under umask 022), as a
plain `open(path, "w")` would: weights, results, trainer state, checkpoint files, reporter files."""

from __future__ import annotations

import os
import stat

import pytest
import torch
from conftest import RegressionDataset, RegressionModel, tiny_gpt2

from trainwright.core import files
from trainwright.loop.trainer import Trainer


@pytest.fixture
def umask():
    """Set the process umask for the test (put back afterwards)."""
    previous = os.umask(0o022)
    os.umask(previous)
    yield lambda mask: os.umask(mask)
    os.umask(previous)


def _modes(folder) -> dict[str, int]:
    return {
        os.path.relpath(os.path.join(root, name), folder): stat.S_IMODE(
            os.stat(os.path.join(root, name)).st_mode
        )
        for root, _, names in os.walk(folder)
        for name in names
    }


def _run(trainer: Trainer) -> None:
    result = trainer.train()
    trainer.save_model()
    trainer.save_state()
    trainer.save_metrics("train", result.metrics)
    trainer.save_metrics("eval", trainer.evaluate())


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_every_file_of_a_run_follows_the_umask(tmp_path, make_args, umask, mask):
    umask(mask)
    args = make_args(
        max_steps=4,
        per_device_train_batch_size=8,
        save_strategy="steps",
        save_steps=2,
        report_to=["jsonl", "csv"],
    )
    trainer = Trainer(
        model=RegressionModel(),
        args=args,
        train_dataset=RegressionDataset(length=32),
        eval_dataset=RegressionDataset(length=8),
    )
    _run(trainer)
    modes = _modes(args.output_dir)
    for name in (
        "model.safetensors",
        "train_results.json",
        "eval_results.json",
        "all_results.json",
        "trainer_state.json",
        "logs.jsonl",
        "logs.csv",
        "checkpoint-4/model.safetensors",
        "checkpoint-4/trainer_state.json",
        "checkpoint-4/data_state.json",
        "checkpoint-4/optimizer.pt",
        "checkpoint-4/checkpoint_complete.json",
    ):
        assert name in modes, sorted(modes)
    expected = 0o666 & ~mask
    wrong = {
        name: oct(mode) for name, mode in modes.items() if mode != expected and name != ".trainwright.lock"
    }
    assert wrong == {}, f"expected {oct(expected)}"


def test_save_pretrained_weights_follow_the_umask(tmp_path, make_args, umask):
    umask(0o022)
    args = make_args(max_steps=2, per_device_train_batch_size=4, save_strategy="steps", save_steps=2)
    data = [{"input_ids": torch.randint(0, 64, (8,)), "labels": torch.randint(0, 64, (8,))} for _ in range(8)]
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=data)
    trainer.train()
    trainer.save_model()
    modes = _modes(args.output_dir)
    assert modes["model.safetensors"] == 0o644
    assert modes["checkpoint-2/model.safetensors"] == 0o644
    assert modes["config.json"] == 0o644


def test_atomic_write_mode_content_and_cleanup(tmp_path, umask):
    umask(0o027)
    assert files.current_umask() == 0o027
    path = tmp_path / "a.json"
    files.write_json(path, {"b": 1, "a": [1.5, None]})
    assert files.read_json_object(path) == {"a": [1.5, None], "b": 1}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    with pytest.raises(RuntimeError, match="boom"):
        with files.atomic_write(path) as f:
            f.write("half")
            raise RuntimeError("boom")
    assert files.read_json_object(path) == {"a": [1.5, None], "b": 1}  # the old file is untouched
    assert os.listdir(tmp_path) == ["a.json"]  # no temporary file left
    with pytest.raises(files.JSONFileError, match="cannot write .*a.json"):
        files.write_json(path, {"x": object()})
    path.write_text("[1]")
    with pytest.raises(files.JSONFileError, match="a.json must hold a JSON object, found list"):
        files.read_json_object(path)
    with pytest.raises(FileNotFoundError, match="nope.json"):
        files.read_json(tmp_path / "nope.json")


def test_honour_umask_on_a_file_written_by_another_library(tmp_path, umask):
    from safetensors.torch import save_file

    umask(0o022)
    path = str(tmp_path / "w.safetensors")
    save_file({"a": torch.zeros(2)}, path)  # safetensors writes through its own temporary file
    files.honour_umask(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
