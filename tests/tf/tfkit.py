"""Small real Keras models and tf.data datasets for the TFTrainer tests (nothing downloaded)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", "TF_NUM_INTRAOP_THREADS": "1"}


def make_data(n: int = 48, features: int = 6, classes: int = 3, seed: int = 0):
    """A dataset of ({"x": ...}, label) pairs whose label depends on x."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype("float32")
    y = ((x[:, 0] > 0).astype("int32") + (x[:, 1] > 0.5).astype("int32")) % classes
    return tf.data.Dataset.from_tensor_slices(({"x": x}, y))


def make_model(dropout: float = 0.0, classes: int = 3, seed: int = 1):
    """A two-layer classifier whose call takes the batch dict and returns {"loss", "logits"}."""
    import keras

    class Classifier(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            init = keras.initializers.GlorotUniform(seed=seed)
            self.hidden = keras.layers.Dense(16, activation="tanh", kernel_initializer=init)
            self.norm = keras.layers.LayerNormalization()
            self.drop = keras.layers.Dropout(dropout, seed=seed)
            self.out = keras.layers.Dense(
                classes, kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 1)
            )

        def call(self, batch, training=False):
            h = self.drop(self.norm(self.hidden(batch["x"])), training=training)
            logits = self.out(h)
            result = {"logits": logits}
            if "labels" in batch:
                result["loss"] = keras.losses.sparse_categorical_crossentropy(
                    batch["labels"], logits, from_logits=True
                )
            return result

    return Classifier()


def weights(model) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in model.weights]


def run_job(*argv: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run tests/tf/tf_job.py in a new process (TensorFlow fresh: devices are set before it starts)."""
    full_env = {**os.environ, **QUIET_ENV, **(env or {})}
    return subprocess.run(
        [sys.executable, os.path.join(HERE, "tf_job.py"), *argv],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
