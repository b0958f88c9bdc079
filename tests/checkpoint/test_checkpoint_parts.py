"""A checkpoint is a mapping of parts, and one table says where trainwright's parts live; a user's part
(a callback with a `checkpoint_part` name) declares its own file (`checkpoint_file`) and never touches
that table. Either way it is saved (synchronously or in the background), listed in the manifest and
restored exactly with everything else."""

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
    checkpoint_file = "ema.pt"

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


class TableEMA(EMA):
    """The same part, stored where a row of the library's table says (how trainwright adds its own)."""

    checkpoint_file = None


@pytest.fixture
def ema_row(monkeypatch):
    monkeypatch.setitem(layout.PARTS, "ema", PartSpec("ema.pt", "torch"))


def _train(make_args, out, resume=None, part=EMA, **kw):
    torch.manual_seed(0)
    ema = part()
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
def test_a_users_part_declares_its_file_and_resumes_exactly(make_args, tmp_path, async_save):
    assert "ema" not in layout.PARTS
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


def test_a_json_file_is_written_as_json(make_args, tmp_path):
    class Counter(TrainerCallback):
        checkpoint_part, checkpoint_file = "counter", "counter.json"

        def __init__(self):
            self.steps = 0

        def on_step_end(self, args, state, control, **kwargs):
            self.steps += 1

        def state_dict(self):
            return {"steps": self.steps}

        def load_state_dict(self, state):
            self.steps = state["steps"]

    _train(make_args, tmp_path, part=Counter)
    assert json.loads((tmp_path / "checkpoint-3" / "counter.json").read_text()) == {"steps": 3}
    _, resumed = _train(make_args, tmp_path, resume=str(tmp_path / "checkpoint-3"), part=Counter)
    assert resumed.steps == 6  # 3 restored + 3 trained


@pytest.mark.parametrize(
    "name,file,error",
    [
        ("optimizer", "mine.pt", "is trainwright's own part"),
        ("ema", "sub/ema.pt", "plain file name"),
        ("ema", ".ema.pt", "plain file name"),
    ],
)
def test_a_declared_file_that_would_clash_is_refused(make_args, tmp_path, name, file, error):
    class Clash(EMA):
        checkpoint_part, checkpoint_file = name, file

    with pytest.raises(ValueError, match=error):
        _train(make_args, tmp_path, part=Clash)
    assert not os.path.exists(tmp_path / "checkpoint-3")


def test_a_library_row_still_places_a_part(make_args, tmp_path, ema_row):
    _, whole = _train(make_args, tmp_path, part=TableEMA)
    assert (tmp_path / "checkpoint-3" / "ema.pt").is_file()
    _, resumed = _train(make_args, tmp_path, resume=str(tmp_path / "checkpoint-3"), part=TableEMA)
    for k in whole.shadow:
        assert torch.equal(whole.shadow[k], resumed.shadow[k]), k


def test_a_part_without_a_row_is_refused_naming_the_table(make_args, tmp_path):
    class Orphan(EMA):
        checkpoint_part, checkpoint_file = "orphan", None

    args = make_args(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=2,
        save_strategy="steps",
        save_steps=2,
    )
    trainer = Trainer(model=DropoutMLP(), args=args, train_dataset=VectorDataset(n=16), callbacks=[Orphan()])
    with pytest.raises(
        KeyError, match=r"'orphan' has no row in .*layout.PARTS.* give the part a `checkpoint_file`"
    ):
        trainer.train()
    assert not os.path.exists(tmp_path / "checkpoint-2")


def test_a_damaged_part_is_refused_by_the_manifest(make_args, tmp_path):
    _train(make_args, tmp_path)
    (tmp_path / "checkpoint-3" / "ema.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="ema.pt"):
        _train(make_args, tmp_path, resume=str(tmp_path / "checkpoint-3"))


def test_a_part_absent_from_an_older_checkpoint_starts_fresh(make_args, tmp_path):
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


def test_building_a_checkpoints_parts_writes_nothing_of_the_trainers_state(make_args):
    """`build_parts` reads the Trainer's values and builds the parts; the callbacks' states go into
    `trainer_state.json` at the save (`Checkpointer.save`), not as a side effect of building."""
    from trainwright.loop.checkpoints.parts import build_parts

    args = make_args(max_steps=2, per_device_train_batch_size=4, save_strategy="no")
    trainer = Trainer(DropoutMLP(), args, train_dataset=VectorDataset(16), callbacks=[EMA()])
    trainer.train()
    run = trainer._run
    assert run is not None
    trainer.state.stateful_callbacks = marker = {"planted": {"args": {}, "attributes": {}}}
    parts = build_parts(trainer, run, trainer.runtime, main=True)
    assert trainer.state.stateful_callbacks is marker
    assert {"model", "data_state", "trainer_state", "ema"} <= set(parts)
