"""TFTrainer and TFTrainingArguments: transformers v4's TensorFlow trainer API on TensorFlow 2 + Keras 3.

Needs the `tf` extra (`pip install 'trainwright[tf]'`); importing `trainwright` alone never imports
TensorFlow. Usage and what is supported or refused: docs/tf.md.
"""

try:
    import keras
    import tensorflow  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"TFTrainer needs TensorFlow 2 and Keras 3: pip install 'trainwright[tf]' (import failed: {exc})"
    ) from exc

if keras.backend.backend() != "tensorflow":
    raise ImportError(
        f"TFTrainer runs Keras on TensorFlow, but Keras uses the {keras.backend.backend()!r} backend "
        "(KERAS_BACKEND): set KERAS_BACKEND=tensorflow"
    )

from trainwright.tf.arguments import TFTrainingArguments  # noqa: E402
from trainwright.tf.trainer import TFTrainer  # noqa: E402

__all__ = ["TFTrainer", "TFTrainingArguments"]
