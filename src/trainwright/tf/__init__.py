"""TFTrainer and TFTrainingArguments: transformers v4's TensorFlow trainer API on TensorFlow 2 + Keras 3.

Needs the `tf` extra (`pip install 'trainwright[tf]'`); importing `trainwright` alone never imports
TensorFlow. Usage and what is supported or refused: docs/tf.md.
"""

try:
    import keras  # noqa: F401
    import tensorflow  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"TFTrainer needs TensorFlow 2 and Keras 3: pip install 'trainwright[tf]' (import failed: {exc})"
    ) from exc

from trainwright.tf.arguments import TFTrainingArguments
from trainwright.tf.trainer import TFTrainer

__all__ = ["TFTrainer", "TFTrainingArguments"]
