"""What a checkpoint's own files say is checked before it is trusted (issue 18, items 8 and 14): a
manifest that would switch its own checks off, weight files it does not list, a damaged safetensors
header, JSON state whose fields are not what a resume reads, a position beyond the epoch. Each is
refused naming the file; discovery falls back to the checkpoint before, as for a damaged file.
Real runs, real files, edited as a user (or damage) would."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest
import torch
from checkpoint_kit import flip_byte, run_regression
from conftest import RegressionModel

import trainwright.checkpoint as ckpt
from trainwright.checkpoint.manifest import manifest_problems, read_manifest
from trainwright.checkpoint.verify import file_checksum


def manifest_path(folder):
    return os.path.join(folder, ckpt.CHECKPOINT_COMPLETE_NAME)


def edit_manifest(folder, change):
    with open(manifest_path(folder)) as f:
        manifest = json.load(f)
    change(manifest)
    with open(manifest_path(folder), "w") as f:
        json.dump(manifest, f)


def rewrite(folder, name, text):
    """A hand edit of a file that also updates the manifest: only the checks of its content can see it."""
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(text)

    def record(manifest):
        manifest["files"][name] = os.path.getsize(path)
        manifest["checksums"][name] = file_checksum(path)

    edit_manifest(folder, record)


def edited_newest(make_args, name, change):
    """checkpoint-6 of a run, its JSON file `name` edited in place by `change` (the manifest agreeing)."""
    _, out = run_regression(make_args)
    newest = os.path.join(out, "checkpoint-6")
    with open(os.path.join(newest, name)) as f:
        value = json.load(f)
    change(value)
    rewrite(newest, name, json.dumps(value))
    return newest


def assert_skipped_and_refused(make_args, out, expected):
    """Discovery skips checkpoint-6 (warning naming `expected`) for checkpoint-4; an explicit resume
    of checkpoint-6 is refused naming it; `resume_from_checkpoint=True` resumes checkpoint-4."""
    newest = os.path.join(out, "checkpoint-6")
    with pytest.warns(UserWarning, match=f"skipping incomplete checkpoint .*checkpoint-6.*{expected}"):
        assert ckpt.get_last_checkpoint(out) == os.path.join(out, "checkpoint-4")
    with pytest.raises(ValueError, match=f"Can't resume from {newest}: .*{expected}"):
        run_regression(make_args, max_steps=8, resume=newest)
    with pytest.warns(UserWarning, match="checkpoint-6"):
        trainer, _ = run_regression(make_args, max_steps=8, resume=True)
    assert trainer.cursor.first_step_of_call == 4


# ---------------------------------------------------------------------- item 8: the manifest
_SWITCHED_OFF = {
    "unknown checksum": (
        lambda m: m.update(checksum="xxh3_65"),
        r"names checksum 'xxh3_65', which this version does not compute .*cannot be verified",
    ),
    "renamed checksums": (
        lambda m: m.update(sums=m.pop("checksums")),
        r"has no 'checksums' object, so its files cannot be verified",
    ),
    "no algorithm": (lambda m: m.pop("checksum"), r"names no checksum algorithm"),
    "a file's checksum dropped": (
        lambda m: m["checksums"].pop("optimizer.pt"),
        r"records no checksum for optimizer.pt",
    ),
    "a path outside": (
        lambda m: m["files"].update({"../elsewhere.pt": 1}),
        r"lists paths outside the checkpoint folder: ../elsewhere.pt",
    ),
}


@pytest.mark.parametrize("damaged", ["optimizer.pt", "model.safetensors"])
@pytest.mark.parametrize("edit", list(_SWITCHED_OFF))
def test_a_manifest_that_cannot_check_its_files_is_a_damaged_checkpoint(make_args, edit, damaged):
    _, out = run_regression(make_args)
    newest = os.path.join(out, "checkpoint-6")
    change, expected = _SWITCHED_OFF[edit]
    edit_manifest(newest, change)
    flip_byte(os.path.join(newest, damaged))  # same size: only a checksum could see it
    problems = ckpt.verify_checkpoint(newest)
    assert problems and all(p.startswith("checkpoint_complete.json") for p in problems), problems
    assert_skipped_and_refused(make_args, out, expected)


def test_a_transformers_checkpoint_without_a_manifest_still_resumes(make_args, tmp_path):
    _, out = run_regression(make_args)
    theirs = tmp_path / "theirs" / "checkpoint-4"
    shutil.copytree(os.path.join(out, "checkpoint-4"), theirs)
    for name in (ckpt.CHECKPOINT_COMPLETE_NAME, ckpt.DATA_STATE_NAME):  # what transformers does not write
        os.remove(theirs / name)
    assert ckpt.verify_checkpoint(theirs) == [] and ckpt.check_checkpoint_files(theirs) == []
    trainer, _ = run_regression(make_args, max_steps=8, resume=str(theirs))
    assert trainer.state.global_step == 8 and trainer.cursor.first_step_of_call == 4


def _added_index(folder, tmp_path):
    """A sharded copy of other weights (a=100, b=-100) put beside the checkpoint's own weights."""
    other = tmp_path / "other"
    ckpt.save_model_weights(RegressionModel(a=100.0, b=-100.0), other, max_shard_size=4)  # a shard each
    added = sorted(os.listdir(other))
    assert ckpt.WEIGHTS_INDEX_NAME in added and len(added) == 3, added
    for name in added:
        shutil.copy(other / name, os.path.join(folder, name))
    return added


def test_weights_the_manifest_does_not_list_are_never_loaded(make_args, tmp_path):
    _, out = run_regression(make_args)
    newest = os.path.join(out, "checkpoint-6")
    added = _added_index(newest, tmp_path)
    problems = ckpt.verify_checkpoint(newest)
    for name in added:  # the index and both shards
        assert any(p.startswith(f"{name} is not listed in checkpoint_complete.json") for p in problems), (
            problems
        )

    # load_model_weights refuses too (the best model at the end of a run goes through it)
    model = RegressionModel()
    with pytest.raises(
        ckpt.CheckpointError, match=f"model.safetensors.index.json is not listed .*in {newest}"
    ):
        ckpt.load_model_weights(model, newest)
    assert model.a.item() == 0.0 and model.b.item() == 0.0  # nothing was copied

    # discovery skips it, an explicit resume is refused, True resumes checkpoint-4 (and writes 6 and 8 anew)
    assert_skipped_and_refused(make_args, out, "model.safetensors.index.json is not listed")
    last = os.path.join(out, "checkpoint-8")
    assert ckpt.verify_checkpoint(last) == []

    # a shard alone slipped in is refused the same way; with it gone the checkpoint is whole again
    shard = os.path.join(last, added[0])
    shutil.copy(tmp_path / "other" / added[0], shard)
    assert any(f"{added[0]} is not listed" in p for p in ckpt.verify_checkpoint(last))
    os.remove(shard)
    assert ckpt.verify_checkpoint(last) == []

    # a file nothing reads may be added (notes beside the weights): the checkpoint still verifies
    with open(os.path.join(last, "README.md"), "w") as f:
        f.write("notes")
    assert ckpt.verify_checkpoint(last) == []
    ckpt.load_model_weights(model, last)


def test_an_added_pytorch_model_bin_is_refused_by_load_model_weights(make_args, tmp_path):
    _, out = run_regression(make_args)
    folder = os.path.join(out, "checkpoint-6")
    os.remove(os.path.join(folder, ckpt.WEIGHTS_NAME))  # as if the listed weights were lost...
    torch.save(
        RegressionModel(a=7.0).state_dict(), os.path.join(folder, ckpt.PT_WEIGHTS_NAME)
    )  # ...and replaced
    with pytest.raises(
        ckpt.CheckpointError, match="pytorch_model.bin is not listed in checkpoint_complete.json"
    ):
        ckpt.load_model_weights(RegressionModel(), folder)
    problems = ckpt.verify_checkpoint(folder)
    assert "model.safetensors is missing" in problems and any(
        "pytorch_model.bin is not listed" in p for p in problems
    )


# ---------------------------------------------------------------------- item 14: headers and JSON fields
def test_a_damaged_safetensors_header_is_named(make_args, tmp_path):
    _, out = run_regression(make_args)
    newest = os.path.join(out, "checkpoint-6")
    path = os.path.join(newest, ckpt.WEIGHTS_NAME)
    data = bytearray(open(path, "rb").read())
    data[data.index(b"data_offsets")] ^= 0x01  # one flipped bit: "eata_offsets", still valid JSON
    open(path, "wb").write(bytes(data))
    expected = "model.safetensors is corrupt: its header's entry '[ab]' has no valid 'data_offsets'"
    with pytest.raises(ValueError, match=f"Can't resume from {newest}: .*{expected}"):
        run_regression(make_args, max_steps=8, resume=newest)
    # the same without a manifest (a transformers checkpoint): the header check alone names it
    os.remove(manifest_path(newest))
    problems = ckpt.check_checkpoint_files(newest)
    assert any(re.match(expected, p) for p in problems), problems
    with pytest.raises(ValueError, match=expected):
        run_regression(make_args, max_steps=8, resume=newest)


_TRAINER_STATE_EDITS = {
    "log_history an object": (
        lambda s: s.update(log_history={"loss": 1.0}),
        r"trainer_state.json: log_history is \{'loss': 1.0\} \(dict\), not a list of objects",
    ),
    "log_history of numbers": (
        lambda s: s.update(log_history=[1, 2]),
        r"trainer_state.json: log_history is \[1, 2\] \(list\), not a list of objects",
    ),
    "global_step a string": (
        lambda s: s.update(global_step="six"),
        r"trainer_state.json: global_step is 'six' \(str\), not a non-negative integer",
    ),
    "no global_step": (lambda s: s.pop("global_step"), r"trainer_state.json has no 'global_step'"),
}


@pytest.mark.parametrize("edit", list(_TRAINER_STATE_EDITS))
def test_trainer_state_fields_a_resume_reads_are_checked(make_args, edit):
    change, expected = _TRAINER_STATE_EDITS[edit]
    newest = edited_newest(make_args, ckpt.TRAINER_STATE_NAME, change)
    assert manifest_problems(newest, read_manifest(newest), True) == []  # the manifest agrees
    assert re.search(expected, "; ".join(ckpt.verify_checkpoint(newest)))  # damaged for discovery too
    with pytest.raises(ValueError, match=f"Can't resume from {newest}: {expected}"):
        run_regression(make_args, max_steps=8, resume=newest)


_DATA_STATE_EDITS = {
    "batch beyond the epoch": (
        lambda s: s["cursor"].update(batch_in_epoch=10**6),
        r"data_state.json's cursor.batch_in_epoch is 1000000, beyond the 8 batches of an epoch of this run",
    ),
    "samples beyond the epoch": (
        lambda s: s["cursor"].update(samples_in_epoch=10**6),
        r"data_state.json's cursor.samples_in_epoch is 1000000, beyond the 32 samples per process",
    ),
    "negative batch": (
        lambda s: s["cursor"].update(batch_in_epoch=-3),
        r"data_state.json: cursor.batch_in_epoch is -3 \(int\), not a non-negative integer",
    ),
    "epoch a string": (
        lambda s: s["cursor"].update(epoch="x"),
        r"data_state.json: cursor.epoch is 'x' \(str\), not a non-negative integer",
    ),
    "cursor a number": (lambda s: s.update(cursor=5), r"data_state.json has no 'cursor' object"),
    "a sampler seed over 64 bits": (
        lambda s: s["sampler"].update(seed=2**70),
        r"data_state.json: sampler.seed is 1180591620717411303424 \(int\), not an integer in \[0, 2\*\*63\)",
    ),
}


@pytest.mark.parametrize("edit", list(_DATA_STATE_EDITS))
def test_a_data_state_position_that_is_no_position_of_this_run_is_refused(make_args, edit):
    change, expected = _DATA_STATE_EDITS[edit]
    newest = edited_newest(make_args, ckpt.DATA_STATE_NAME, change)
    with pytest.raises(
        (ValueError, ckpt.CheckpointError), match=f"Can't resume from {newest}: {expected}"
    ) as info:
        run_regression(make_args, max_steps=8, resume=newest)
    if "beyond" in edit:  # the range needs this run's loader: checked when the part is restored
        assert isinstance(info.value, ckpt.CheckpointError)
        assert "pass ignore_data_skip=True" in str(info.value)
        assert os.path.join(newest, "data_state.json") in str(info.value)
        trainer, _ = run_regression(
            make_args, max_steps=8, resume=newest, ignore_data_skip=True
        )  # the way forward
        assert trainer.state.global_step == 8


def test_a_json_file_nested_too_deeply_is_a_damaged_checkpoint(make_args):
    _, out = run_regression(make_args)
    newest = os.path.join(out, "checkpoint-6")
    # valid JSON, deeper than Python's parser recurses
    rewrite(newest, ckpt.TRAINER_STATE_NAME, "[" * 200_000 + "]" * 200_000)
    assert_skipped_and_refused(make_args, out, "trainer_state.json is nested too deeply")


def test_a_tf_checkpoint_is_checked_against_the_data_state_tftrainer_writes(tmp_path):
    """TFTrainer's data_state.json is flat (no 'cursor'): discovery reads it with its own fields."""
    from trainwright.checkpoint.verify import verify_checkpoint

    good = {
        "epoch": 0,
        "batch_in_epoch": 4,
        "step_batch": 8,
        "has_optimizer": True,
        "loss_window": [0.5, 0.25],
        "loss_logged_total": 1.5,
    }

    def saved(step: int, data: dict, tf_index: bool = True) -> list[str]:
        def write(folder: str) -> None:
            if tf_index:
                with open(os.path.join(folder, "tf_checkpoint.index"), "wb") as f:
                    f.write(b"\0")
            with open(os.path.join(folder, "trainer_state.json"), "w") as f:
                json.dump({"global_step": step, "log_history": []}, f)
            with open(os.path.join(folder, "data_state.json"), "w") as f:
                json.dump(data, f)

        return verify_checkpoint(ckpt.write_checkpoint(str(tmp_path), f"checkpoint-{step}", write))

    assert saved(1, good) == []
    problems = saved(2, {**good, "step_batch": "8", "epoch": -1})
    assert any("step_batch is '8' (str), not a positive integer" in p for p in problems), problems
    assert any("epoch is -1" in p for p in problems), problems
    without_total = {k: v for k, v in good.items() if k != "loss_logged_total"}
    assert saved(3, without_total) == ["data_state.json has no 'loss_logged_total'"]
    # without the TF index the same file is read as the Trainer's, and misses its cursor
    assert any("no 'cursor'" in p for p in saved(4, good, tf_index=False))
