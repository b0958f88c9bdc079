"""Small real Keras models and tf.data datasets for the TFTrainer tests (nothing downloaded)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from typing import Any

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


def tf_args(tmp_path, **kw):
    """TFTrainingArguments of a small run into tmp_path/out (batches of 8, logging every 2 steps)."""
    from trainwright import TFTrainingArguments

    base = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        learning_rate=0.05,
        logging_steps=2,
        disable_tqdm=True,
        seed=3,
    )
    return TFTrainingArguments(**{**base, **kw})


def _job(argv, env):
    return [sys.executable, os.path.join(HERE, "tf_job.py"), *argv], {
        **os.environ,
        **QUIET_ENV,
        **(env or {}),
    }


def run_job(*argv: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run tests/tf/tf_job.py in a new process (TensorFlow fresh: devices are set before it starts)."""
    cmd, full_env = _job(argv, env)
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)


def start_job(argv, env: dict | None = None, **popen: Any) -> subprocess.Popen:
    """tests/tf/tf_job.py started in a new process, its stdout and stderr piped."""
    cmd, full_env = _job(argv, env)
    return subprocess.Popen(
        cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
    )


@contextlib.contextmanager
def reaped(*procs: subprocess.Popen):
    """Kill whichever of `procs` still runs when the block ends (a wait that timed out, a failed check)."""
    try:
        yield
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def load_npz(path) -> list[np.ndarray]:
    """The arrays of a .npz file that tf_job.py wrote (--weights), in their order."""
    data = np.load(path)
    return [data[k] for k in data.files]


def worker_envs(n: int = 2) -> list[dict[str, str]]:
    """The environments of `n` MultiWorkerMirroredStrategy workers on free loopback ports."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    cluster = {"worker": [f"127.0.0.1:{s.getsockname()[1]}" for s in socks]}
    for s in socks:
        s.close()
    return [
        {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})}
        for i in range(n)
    ]
