"""Steps per second of TFTrainer against a hand-written `tf.function` loop and `model.fit`.

The same MLP, data pipeline (seeded shuffle, batch, prefetch), Adam, constant learning rate and
clipping by global norm 1.0 in every variant. Each variant's clock starts after its first
`--warmup` steps (tracing and graph building are not counted) and stops at its last step. Variants
alternate, `--rounds` times; the best steps/s of each is reported, with the machine's load average
(this machine is shared: a busy one slows every variant, so compare the ratios). Each line
gives steps/s over all timed steps and of the median step, each as a ratio to the tf.function loop.

    .venv/bin/python bench/tf_loop.py [--steps 300] [--rounds 5] [--batch 64] [--width 512]
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainwright import TFTrainer, TFTrainingArguments  # noqa: E402
from trainwright.core.events import TrainerCallback  # noqa: E402

FEATURES, CLASSES = 256, 10


def data(n: int) -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, size=(n,)).astype("int32")
    return tf.data.Dataset.from_tensor_slices(({"x": x}, y))


def layers(width: int) -> list[keras.layers.Layer]:
    return [
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(CLASSES),
    ]


class DictModel(keras.Model):
    """The TFTrainer contract: call(batch dict) -> {"loss", "logits"}."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.stack = layers(width)

    def call(self, batch, training=False):
        h = batch["x"]
        for layer in self.stack:
            h = layer(h)
        out = {"logits": h}
        if "labels" in batch:
            out["loss"] = keras.losses.sparse_categorical_crossentropy(batch["labels"], h, from_logits=True)
        return out


def pipeline(dataset: tf.data.Dataset, n: int, batch: int) -> tf.data.Dataset:
    # what TFTrainer does per epoch (trainwright.tf.data.epoch_order)
    return dataset.shuffle(n, seed=0, reshuffle_each_iteration=False).batch(batch).prefetch(tf.data.AUTOTUNE)


class Clock(TrainerCallback):
    def __init__(self) -> None:
        self.stamps: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.stamps.append(time.perf_counter())


def rate(stamps: list[float], warmup: int) -> tuple[float, float]:
    """(steps/s over the timed steps, steps/s of the median step). The median is robust to the
    other users of a shared machine taking the CPU for a while; both are reported."""
    steps = np.diff(np.asarray(stamps[warmup - 1 :]))
    return len(steps) / float(steps.sum()), 1.0 / float(np.median(steps))


def run_trainer(ds, n, ns) -> tuple[float, float]:
    keras.utils.set_random_seed(0)
    with tempfile.TemporaryDirectory() as out:
        args = TFTrainingArguments(
            output_dir=out,
            per_device_train_batch_size=ns.batch,
            max_steps=ns.steps,
            learning_rate=1e-3,
            lr_scheduler_type="constant",
            logging_steps=ns.steps,
            save_strategy="no",
            disable_tqdm=True,
            report_to="none",
        )
        clock = Clock()
        TFTrainer(DictModel(ns.width), args, train_dataset=ds, callbacks=[clock]).train()
    return rate(clock.stamps, ns.warmup)


def run_hand_loop(ds, n, ns) -> tuple[float, float]:
    keras.utils.set_random_seed(0)
    model = DictModel(ns.width)
    optimizer = keras.optimizers.Adam(1e-3)

    @tf.function
    def step(features, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model({**features, "labels": labels}, training=True)["loss"])
        grads = tape.gradient(loss, model.trainable_variables)
        grads, _ = tf.clip_by_global_norm(grads, 1.0)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    stamps: list[float] = []
    losses = []
    while len(stamps) < ns.steps:
        for features, labels in pipeline(ds, n, ns.batch):
            losses.append(step(features, labels))
            stamps.append(time.perf_counter())
            if len(stamps) == ns.steps:
                break
    return rate(stamps, ns.warmup)


class FitClock(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.stamps: list[float] = []

    def on_train_batch_end(self, batch, logs=None):
        self.stamps.append(time.perf_counter())


def run_fit(ds, n, ns) -> tuple[float, float]:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,))
    h = inputs
    for layer in layers(ns.width):
        h = layer(h)
    model = keras.Model(inputs, h)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3, global_clipnorm=1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    per_epoch = -(-n // ns.batch)
    epochs = -(-ns.steps // per_epoch)
    xy = pipeline(ds.map(lambda f, y: (f["x"], y)), n, ns.batch).repeat(epochs).take(ns.steps)
    clock = FitClock()
    model.fit(xy, epochs=1, verbose=0, callbacks=[clock])
    return rate(clock.stamps, ns.warmup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--samples", type=int, default=4096)
    ns = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    ds = data(ns.samples)
    variants = {"tf.function loop": run_hand_loop, "TFTrainer": run_trainer, "model.fit": run_fit}
    best = {name: (0.0, 0.0) for name in variants}
    loads = []
    for r in range(ns.rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in order:
            loads.append(os.getloadavg()[0])
            overall, median = variants[name](ds, ns.samples, ns)
            best[name] = (max(best[name][0], overall), max(best[name][1], median))
    print(
        f"TensorFlow {tf.__version__}, Keras {keras.__version__}; MLP {FEATURES}-{ns.width}-{ns.width}-{CLASSES}, "
        f"batch {ns.batch}, {ns.steps} steps ({ns.warmup} warm-up not timed), best of {ns.rounds} alternating rounds"
    )
    print(
        f"load average (1 min) during the runs: {min(loads):.2f} .. {max(loads):.2f} on {os.cpu_count()} cores"
    )
    base = best["tf.function loop"]
    print(f"  {'':<18} {'all timed steps':>24}   {'median step':>24}")
    for name, (overall, median) in best.items():
        print(
            f"  {name:<18} {overall:8.1f} steps/s {overall / base[0]:6.3f}x   "
            f"{median:8.1f} steps/s {median / base[1]:6.3f}x"
        )


if __name__ == "__main__":
    main()
