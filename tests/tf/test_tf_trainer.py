"""TFTrainer in this process: train / evaluate / predict, metrics, files, accumulation, clipping,
TensorBoard event files, checkpoint rotation, lazy import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tfkit import make_data, make_model, tf_args, weights  # noqa: E402

from trainwright import TFTrainer  # noqa: E402

_args = partial(tf_args, max_steps=6)


def _accuracy(pred):
    return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}


def test_train_evaluate_predict_and_files(tmp_path):
    args = _args(
        tmp_path, max_steps=12, eval_strategy="steps", eval_steps=6, save_steps=4, save_total_limit=2
    )
    trainer = TFTrainer(make_model(), args, make_data(48), make_data(13, seed=5), compute_metrics=_accuracy)
    before = trainer.evaluate()
    out = trainer.train()
    assert out.global_step == 12 and trainer.global_step == 12
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert [r["step"] for r in trainer.state.log_history if "eval_loss" in r] == [6, 12]
    metrics = trainer.evaluate()
    assert metrics["eval_loss"] < before["eval_loss"]
    assert 0.0 <= metrics["eval_accuracy"] <= 1.0
    pred = trainer.predict(make_data(13, seed=5))
    assert pred.predictions.shape == (13, 3) and pred.label_ids.shape == (13,)
    assert pred.metrics["test_loss"] == pytest.approx(metrics["eval_loss"], rel=1e-6)
    assert pred.metrics["test_accuracy"] == metrics["eval_accuracy"]
    # rotation keeps the newest two; each folder is complete (manifest) and holds TF checkpoint files
    folders = sorted(n for n in os.listdir(args.output_dir) if n.startswith("checkpoint-"))
    assert folders == ["checkpoint-12", "checkpoint-8"]
    files = set(os.listdir(os.path.join(args.output_dir, "checkpoint-12")))
    assert {
        "tf_checkpoint.index",
        "trainer_state.json",
        "data_state.json",
        "checkpoint_complete.json",
    } <= files
    assert not [n for n in os.listdir(args.output_dir) if n.startswith(".")]
    trainer.log_metrics("train", out.metrics)
    trainer.save_metrics("train", out.metrics)
    trainer.save_state()
    trainer.save_model()
    saved = json.loads((tmp_path / "out" / "train_results.json").read_text())
    assert saved["train_loss"] == pytest.approx(out.training_loss)
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    assert state["global_step"] == 12 and state["max_steps"] == 12
    reloaded = make_model()
    reloaded({"x": np.zeros((1, 6), "float32")})
    reloaded.load_weights(str(tmp_path / "out" / "model.weights.h5"))
    assert all((a == b).all() for a, b in zip(weights(reloaded), weights(trainer.model)))


def test_features_and_labels_keyword_model(tmp_path):
    """A v4-style model: call(features, labels=None, training=False) returning (loss, logits)."""
    import keras

    class V4Style(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, features, labels=None, training=False):
            logits = self.dense(features["x"])
            if labels is None:
                return (logits,)
            return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True), logits

    trainer = TFTrainer(V4Style(), _args(tmp_path), make_data(24))
    assert trainer.train().training_loss > 0
    assert trainer.predict(make_data(7)).predictions.shape == (7, 3)


def _train_weights(tmp_path, name, n=48, **kw):
    trainer = TFTrainer(make_model(), _args(tmp_path / name, weight_decay=0.01, **kw), make_data(n))
    trainer.train()
    return weights(trainer.model)


def test_gradient_accumulation_equals_full_batch(tmp_path):
    # 44 samples: each epoch's 6th step has 4 (2 + 2 when accumulating)
    full = _train_weights(tmp_path, "full", 44, per_device_train_batch_size=8, max_steps=12)
    accumulated = _train_weights(
        tmp_path, "ga", 44, per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=12
    )
    other = _train_weights(tmp_path, "half", 44, per_device_train_batch_size=4, max_steps=12)
    for a, b in zip(full, accumulated):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert any(not np.allclose(a, c, atol=1e-4) for a, c in zip(full, other))  # the test can tell


def test_clipping_by_global_norm(tmp_path):
    """One SGD step at lr 1 with max_grad_norm 1e-3 moves the weights by exactly 1e-3 in norm."""
    args = _args(tmp_path, optim="sgd", learning_rate=1.0, max_steps=1, max_grad_norm=1e-3, logging_steps=1)
    trainer = TFTrainer(make_model(), args, make_data(16))
    trainer._build_model(trainer.train_dataset)
    before = [w.copy() for w in weights(trainer.model)]
    trainer.train()
    moved = np.sqrt(sum(float(((a - b) ** 2).sum()) for a, b in zip(weights(trainer.model), before)))
    assert moved == pytest.approx(1e-3, rel=1e-3)
    assert trainer.state.log_history[0]["grad_norm"] > 1e-2  # the norm before clipping is logged


def test_tensorboard_event_file_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = _args(tmp_path, report_to="tensorboard", logging_dir=str(tmp_path / "tb"))
    TFTrainer(make_model(), args, make_data(48)).train()
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    tags = acc.Tags()["tensors"]
    assert "train/loss" in tags and "train/learning_rate" in tags and "args" in tags
    steps = [e.step for e in acc.Tensors("train/loss")]
    assert steps == [2, 4, 6]
    # a writer passed as tb_writer is used (v4), without report_to
    writer = tf.summary.create_file_writer(str(tmp_path / "own"))
    TFTrainer(make_model(), _args(tmp_path / "b"), make_data(48), tb_writer=writer).train()
    own = EventAccumulator(str(tmp_path / "own"), size_guidance={"tensors": 0})
    own.Reload()
    assert [e.step for e in own.Tensors("train/loss")] == [2, 4, 6]


def test_xla_step_trains(tmp_path):
    plain = _train_weights(tmp_path, "plain")
    compiled = _train_weights(tmp_path, "xla", xla=True)
    for a, b in zip(plain, compiled):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_importing_trainwright_does_not_import_tensorflow():
    # (this module's own `from trainwright import TFTrainer` is the lazy name working)
    code = (
        "import sys, trainwright\n"
        "assert 'tensorflow' not in sys.modules, 'import trainwright imported TensorFlow'\n"
        "sys.modules['tensorflow'] = None  # as if TensorFlow were not installed\n"
        "from trainwright import TFTrainer"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "ImportError" in out.stderr and "trainwright[tf]" in out.stderr, out.stderr


def test_callback_events_fire_as_in_the_pytorch_trainer(tmp_path):
    from trainwright import TrainerCallback

    seen = []
    events = ["on_train_begin", "on_epoch_begin", "on_step_begin", "on_step_end", "on_epoch_end"]
    events += ["on_log", "on_evaluate", "on_save", "on_train_end"]

    def recorder(event):
        return lambda self, args, state, control, **kwargs: seen.append(event)

    Recorder = type("Recorder", (TrainerCallback,), {e: recorder(e) for e in events})
    args = _args(tmp_path, max_steps=4, logging_steps=2, eval_strategy="epoch", save_strategy="epoch")
    TFTrainer(make_model(), args, make_data(16), make_data(4), callbacks=[Recorder()]).train()
    step = ["on_step_begin", "on_step_end"]
    epoch_end = ["on_epoch_end", "on_log", "on_evaluate", "on_save"]  # eval row, then the epoch's save
    assert seen == (
        ["on_train_begin", "on_epoch_begin", *step, *step, "on_log", *epoch_end]
        + ["on_epoch_begin", *step, *step, "on_log", *epoch_end, "on_log", "on_train_end"]
    )
