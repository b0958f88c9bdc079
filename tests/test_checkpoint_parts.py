"""A checkpoint is a mapping of parts, and one table says where each part lives: adding a part is its
object plus one row of `trainwright.checkpoint.layout.PARTS`, and it is saved (synchronously or in
the background), listed in the manifest and restored exactly with everything else."""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import DropoutMLP, VectorDataset

from trainwright import Trainer, TrainerCallback
from trainwright.checkpoint import layout
from trainwright.checkpoint.layout import PartSpec


class EMA(TrainerCallback):
    """An exponential moving average of the weights: a Stateful checkpoint part of its own."""

    checkpoint_part = "ema"

    def __init__(self, decay: float = 0.5):
        self.decay = decay
        self.shadow: dict[str, torch.Tensor] | None = None

    def on_step_end(self, args, state, control, model=None, **kwargs):
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if self.shadow is None:
            self.shadow = weights
        else:
            for k, v in weights.items():
                self.shadow[k].mul_(self.decay).add_(v, alpha=1 - self.decay)

    def state_dict(self):
        return {"shadow": self.shadow, "decay": torch.tensor(self.decay)}

    def load_state_dict(self, state):
        self.shadow, self.decay = state["shadow"], float(state["decay"])


@pytest.fixture
def ema_row(monkeypatch):
    monkeypatch.setitem(layout.PARTS, "ema", PartSpec("ema.pt", "torch"))


def _train(make_args, out, resume=None, **kw):
    torch.manual_seed(0)
    ema = EMA()
    args = make_args(
        output_dir=str(out),
        per_device_train_batch_size=4,
        max_steps=6,
        save_strategy="steps",
        save_steps=3,
        **kw,
    )
    trainer = Trainer(model=DropoutMLP(), args=args, train_dataset=VectorDataset(n=64), callbacks=[ema])
    trainer.train(resume_from_checkpoint=resume)
    return trainer, ema


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_new_part_is_its_object_and_one_row(make_args, tmp_path, ema_row, async_save):
    _, whole = _train(make_args, tmp_path / "whole", async_save=async_save)
    folder = tmp_path / "whole" / "checkpoint-3"
    assert (folder / "ema.pt").is_file()
    manifest = json.loads((folder / "checkpoint_complete.json").read_text())
    assert "ema.pt" in manifest["files"]  # checksummed like every other file

    # resume from step 3 with a fresh EMA: its state comes back, and it ends where the whole run ended
    resumed_out = tmp_path / "resumed"
    _train(make_args, resumed_out, async_save=async_save)  # the same run, to resume its checkpoint
    _, resumed = _train(
        make_args, resumed_out, resume=str(resumed_out / "checkpoint-3"), async_save=async_save
    )
    assert whole.shadow is not None and resumed.shadow is not None
    for k in whole.shadow:
        assert torch.equal(whole.shadow[k], resumed.shadow[k]), k


def test_a_part_without_a_row_is_refused_naming_the_table(make_args, tmp_path):
    class Orphan(EMA):
        checkpoint_part = "orphan"

    args = make_args(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=2,
        save_strategy="steps",
        save_steps=2,
    )
    trainer = Trainer(model=DropoutMLP(), args=args, train_dataset=VectorDataset(n=16), callbacks=[Orphan()])
    with pytest.raises(KeyError, match=r"'orphan' has no row in trainwright.checkpoint.layout.PARTS"):
        trainer.train()
    assert not os.path.exists(tmp_path / "checkpoint-2")


def test_a_damaged_part_is_refused_by_the_manifest(make_args, tmp_path, ema_row):
    _train(make_args, tmp_path)
    (tmp_path / "checkpoint-3" / "ema.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="ema.pt"):
        _train(make_args, tmp_path, resume=str(tmp_path / "checkpoint-3"))


def test_a_part_absent_from_an_older_checkpoint_starts_fresh(make_args, tmp_path, ema_row):
    torch.manual_seed(0)
    args = make_args(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=6,
        save_strategy="steps",
        save_steps=3,
    )
    Trainer(model=DropoutMLP(), args=args, train_dataset=VectorDataset(n=64)).train()  # no EMA then
    _, ema = _train(make_args, tmp_path, resume=str(tmp_path / "checkpoint-3"))
    assert ema.shadow is not None  # trained from step 3 on, from nothing
    assert (tmp_path / "checkpoint-6" / "ema.pt").is_file()


def test_the_table_is_the_one_source_of_part_names():
    from trainwright.checkpoint import verify
    from trainwright.checkpoint.manager import CheckpointManager

    class One:
        rank, world_size = 0, 1

    manager = CheckpointManager(One(), main=True)
    for name, row in layout.PARTS.items():
        if row.stateful and not row.every_process:
            assert manager.path("/c", name) == os.path.join("/c", row.file)
    with pytest.raises(ValueError, match="unknown need"):
        verify.check_checkpoint_files("/nonexistent", need=["nothing"])
