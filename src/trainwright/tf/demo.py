"""`trainwright demo --framework tf`: a small Keras classifier trained by TFTrainer on generated data
(two interleaved spirals, three arms; nothing is downloaded)."""

from __future__ import annotations

import logging
import math
import os

import keras
import numpy as np
import tensorflow as tf

from trainwright.observe.metrics import EvalPrediction
from trainwright.tf.arguments import TFTrainingArguments
from trainwright.tf.trainer import TFTrainer

CLASSES = 3


def spirals(n: int, seed: int) -> tf.data.Dataset:
    """`n` points on three noisy spiral arms; the label is the arm."""
    rng = np.random.default_rng(seed)
    arm = rng.integers(0, CLASSES, size=n)
    t = rng.uniform(0.2, 1.0, size=n)
    angle = 4.0 * t + arm * (2 * math.pi / CLASSES)
    x = np.stack([t * np.cos(angle), t * np.sin(angle)], axis=1) + rng.normal(scale=0.03, size=(n, 2))
    return tf.data.Dataset.from_tensor_slices(({"x": x.astype("float32")}, arm.astype("int32")))


class SpiralClassifier(keras.Model):
    """An MLP whose call takes the batch dict and returns {"loss", "logits"}, as TFTrainer expects."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.body = [keras.layers.Dense(width, activation="gelu") for _ in range(3)]
        self.head = keras.layers.Dense(CLASSES)

    def call(self, batch, training=False):
        h = batch["x"]
        for layer in self.body:
            h = layer(h)
        logits = self.head(h)
        out = {"logits": logits}
        if "labels" in batch:
            out["loss"] = keras.losses.sparse_categorical_crossentropy(
                batch["labels"], logits, from_logits=True
            )
        return out


def accuracy(pred: EvalPrediction) -> dict[str, float]:
    return {"accuracy": float((np.argmax(pred.predictions, -1) == pred.label_ids).mean())}


def run_tf_demo(output_dir: str = "trainwright_tf_demo", max_steps: int = 400) -> dict[str, float]:
    """Train, evaluate, save; returns the final evaluation metrics."""
    logging.getLogger("absl").setLevel(logging.WARNING)  # TF's checkpoint writer chats at INFO
    args = TFTrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=32,
        per_device_eval_batch_size=128,
        learning_rate=1e-2,
        warmup_steps=0.05,
        weight_decay=0.01,
        max_steps=max_steps,
        logging_steps=max(1, max_steps // 10),
        eval_strategy="steps",
        eval_steps=max(1, max_steps // 4),
        save_steps=max(1, max_steps // 2),
        save_total_limit=2,
        report_to="tensorboard",
        seed=0,
    )
    with args.strategy.scope():
        model = SpiralClassifier()
    trainer = TFTrainer(model, args, spirals(2048, seed=0), spirals(512, seed=1), compute_metrics=accuracy)
    result = trainer.train()
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    metrics = trainer.evaluate()
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    trainer.save_model()
    trainer.save_state()
    print(f"model, metrics and TensorBoard logs in {os.path.abspath(output_dir)}")
    return metrics
