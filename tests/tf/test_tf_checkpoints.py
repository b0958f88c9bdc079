"""TFTrainer's checkpoint rules in one process: best model kept and loaded, resume refusals."""

from __future__ import annotations

import os
from functools import partial

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tfkit import make_data, make_model, tf_args, weights  # noqa: E402

from trainwright import TFTrainer  # noqa: E402
from trainwright.checkpoint import CheckpointError  # noqa: E402

_args = partial(tf_args, max_steps=8, save_steps=2)


def test_best_checkpoint_is_kept_by_rotation_and_loaded_at_the_end(tmp_path):
    from trainwright.tf import checkpointing

    args = _args(
        tmp_path,
        eval_strategy="steps",
        eval_steps=2,
        save_total_limit=1,
        metric_for_best_model="accuracy",
        load_best_model_at_end=True,
        eval_on_start=True,
        learning_rate=0.5,  # large enough that accuracy moves around
    )
    accuracy = {"values": iter([0.1, 0.9, 0.2, 0.3, 0.4])}  # the best is the first in-training evaluation

    def metrics(_pred):
        return {"accuracy": next(accuracy["values"])}

    trainer = TFTrainer(make_model(), args, make_data(48), make_data(10, seed=4), compute_metrics=metrics)
    trainer.train()
    assert trainer.state.best_metric == 0.9 and trainer.state.best_global_step == 2
    best = os.path.join(args.output_dir, "checkpoint-2")
    assert trainer.state.best_model_checkpoint == best
    assert sorted(n for n in os.listdir(args.output_dir) if n.startswith("checkpoint-")) == [
        "checkpoint-2",
        "checkpoint-8",
    ]
    reference = make_model()
    reference({"x": np.zeros((1, 6), "float32")})
    checkpointing.restore(best, reference)
    assert all(np.array_equal(a, b) for a, b in zip(weights(trainer.model), weights(reference)))


def test_resume_refusals(tmp_path):
    args = _args(tmp_path, max_steps=4)
    TFTrainer(make_model(), args, make_data(48)).train()
    with pytest.raises(ValueError, match="samples per step"):  # another batch geometry cannot resume exactly
        TFTrainer(
            make_model(), _args(tmp_path, max_steps=8, per_device_train_batch_size=4), make_data(48)
        ).train(True)
    damaged = os.path.join(args.output_dir, "checkpoint-4", "tf_checkpoint.index")
    with open(damaged, "r+b") as f:
        f.write(b"\0\0\0\0")
    with pytest.raises(CheckpointError, match="tf_checkpoint.index"):
        TFTrainer(make_model(), _args(tmp_path, max_steps=8), make_data(48)).train(os.path.dirname(damaged))
    only_model = _args(tmp_path / "m", max_steps=2, save_only_model=True)
    TFTrainer(make_model(), only_model, make_data(48)).train()
    with pytest.raises(ValueError, match="save_only_model"):
        TFTrainer(make_model(), _args(tmp_path / "m", max_steps=4), make_data(48)).train(True)
    with pytest.raises(ValueError, match="no complete checkpoint"):
        TFTrainer(make_model(), _args(tmp_path / "empty"), make_data(48)).train(True)


def test_datasets_the_trainer_cannot_use_are_named(tmp_path):
    unknown = make_data(48).filter(lambda f, y: y >= 0)
    with pytest.raises(ValueError, match="unknown length"):
        TFTrainer(make_model(), _args(tmp_path), unknown).train()
    with pytest.raises(ValueError, match="infinite"):
        TFTrainer(make_model(), _args(tmp_path), make_data(48).repeat()).train()
    dict_data = make_data(48).map(lambda f, y: {"x": f["x"], "labels": y})
    trainer = TFTrainer(make_model(), _args(tmp_path, max_steps=2), dict_data)
    assert trainer.train().global_step == 2  # a dict dataset: labels found under "labels"
    renamed = make_data(48).map(lambda f, y: {"x": f["x"], "target": y})
    trainer = TFTrainer(make_model(), _args(tmp_path, label_names=["target"], max_steps=2), renamed)
    with pytest.raises(ValueError, match="returned no loss"):  # passed as "target", which this model ignores
        trainer.train()


def test_resume_with_more_steps_continues_to_the_new_end(tmp_path):
    TFTrainer(make_model(), _args(tmp_path, max_steps=4), make_data(48)).train()
    trainer = TFTrainer(make_model(), _args(tmp_path, max_steps=8), make_data(48))
    out = trainer.train(resume_from_checkpoint=True)
    assert out.global_step == 8 and trainer.state.max_steps == 8
    assert [r["step"] for r in trainer.state.log_history if "loss" in r] == [2, 4, 6, 8]
    assert int(trainer.optimizer.iterations.numpy()) == 8
