"""Same-size damage and paths that leave the checkpoint folder are caught, never loaded silently."""

from __future__ import annotations

import json
import os

import pytest
import torch
from checkpoint_kit import flip_byte, run_regression
from conftest import RegressionDataset, RegressionModel

import trainwright.checkpoint as ckpt
from trainwright import Trainer


def test_manifest_records_a_checksum_of_every_file(make_args):
    _, out = run_regression(make_args)
    manifest = json.load(open(os.path.join(out, "checkpoint-6", "checkpoint_complete.json")))
    assert manifest["checksum"] == "xxh3_64"
    assert set(manifest["checksums"]) == set(manifest["files"])
    assert ckpt.verify_checkpoint(os.path.join(out, "checkpoint-6")) == []


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "trainer_state.json", "rng_state.pth"])
def test_a_flipped_byte_is_caught_and_discovery_falls_back(make_args, name):
    _, out = run_regression(make_args)
    newest = os.path.join(out, "checkpoint-6")
    size = os.path.getsize(os.path.join(newest, name))
    flip_byte(os.path.join(newest, name))
    assert os.path.getsize(os.path.join(newest, name)) == size  # same size: only the checksum sees it
    assert any(name in p and "damaged" in p for p in ckpt.verify_checkpoint(newest))
    with pytest.warns(UserWarning, match=f"skipping incomplete checkpoint .*checkpoint-6.*{name} is damaged"):
        assert ckpt.get_last_checkpoint(out) == os.path.join(out, "checkpoint-4")
    with pytest.raises(ValueError, match=f"{name} is damaged"):
        Trainer(
            model=RegressionModel(), args=make_args(max_steps=8), train_dataset=RegressionDataset()
        ).train(resume_from_checkpoint=newest)


def test_resume_true_takes_the_newest_checkpoint_that_verifies(make_args):
    _, out = run_regression(make_args)
    flip_byte(os.path.join(out, "checkpoint-6", "model.safetensors"))
    args = make_args(per_device_train_batch_size=4, max_steps=8)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=32))
    with pytest.warns(UserWarning, match="checkpoint-6"):
        trainer.train(resume_from_checkpoint=True)
    assert trainer.cursor.first_step_of_call == 4  # it resumed from step 4, not 6


def test_a_damaged_rng_file_is_an_error_not_a_warning(make_args, tmp_path):
    _, out = run_regression(make_args)
    rng = os.path.join(out, "checkpoint-6", "rng_state.pth")
    with open(rng, "r+b") as f:  # damage it and its manifest entry, as a hand edit would
        f.truncate(10)
    os.remove(os.path.join(out, "checkpoint-6", "checkpoint_complete.json"))
    with pytest.raises(ckpt.CheckpointError, match="rng_state.pth.*Delete that file"):
        ckpt.load_rng_state(os.path.join(out, "checkpoint-6"))


def test_a_damaged_pickle_is_reported_as_damaged_not_as_a_payload(tmp_path):
    path = tmp_path / "state.pt"
    torch.save({"a": torch.ones(2)}, path)
    data = open(path, "rb").read()
    garbled = data.replace(b"torch._utils", b"torcx._utils", 1)  # same size, a name that exists nowhere
    assert garbled != data
    open(path, "wb").write(garbled)
    with pytest.raises(ckpt.CheckpointError, match="is damaged") as info:
        ckpt.safe_torch_load(path)
    assert "refusing" not in str(info.value)


def test_symlinked_files_and_folders_are_refused(make_args, tmp_path):
    _, out = run_regression(make_args)
    newest = os.path.join(out, "checkpoint-6")
    outside = tmp_path / "outside.pt"
    os.replace(os.path.join(newest, "optimizer.pt"), outside)
    os.symlink(outside, os.path.join(newest, "optimizer.pt"))
    assert any("optimizer.pt is a symbolic link" in p for p in ckpt.verify_checkpoint(newest))
    # a symlinked checkpoint-N folder is never discovered nor rotated
    os.symlink(os.path.join(out, "checkpoint-4"), os.path.join(out, "checkpoint-99"))
    with pytest.warns(UserWarning):
        assert ckpt.get_last_checkpoint(out) == os.path.join(out, "checkpoint-4")
    assert ckpt.verify_checkpoint(os.path.join(out, "checkpoint-99"))[0].endswith("must be a real folder)")
    ckpt.rotate_checkpoints(out, save_total_limit=1)
    assert os.path.islink(os.path.join(out, "checkpoint-99"))
    assert not [n for n in os.listdir(out) if ".trash-" in n]


def test_a_shard_index_that_points_outside_is_refused(tmp_path):
    from trainwright.checkpoint import CheckpointError, load_model_weights

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (tmp_path / "secret.safetensors").write_bytes(b"x")
    index = {"metadata": {}, "weight_map": {"a": "../secret.safetensors", "b": "../secret.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="not a file inside"):
        load_model_weights(RegressionModel(), folder)
