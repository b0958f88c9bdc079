"""Learning-rate schedules and optimizers for TFTrainer.

The schedule's curve is not a second copy: the multiplier of every step comes from trainwright's
PyTorch schedules (`trainwright.optim.schedules.get_scheduler`, the same validation and
`lr_scheduler_kwargs`), tabulated once into a Keras `LearningRateSchedule`, so the learning rate of
step k is the one the PyTorch Trainer uses at step k. The table holds `num_training_steps + 1`
float32 values (4 bytes a step).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf
import torch

from trainwright.optim.schedules import get_scheduler


def schedule_arguments(args: Any) -> tuple[str, dict[str, Any]]:
    """(schedule name, schedule kwargs) for `args`, with v4's `poly_power`.

    transformers v4's TFTrainer always used warmup + polynomial decay to 0 with power `poly_power`
    (power 1 is the linear schedule). Here `lr_scheduler_type` picks the curve; `poly_power` is the
    power of "polynomial", and with "linear" a `poly_power` other than 1 gives v4's curve
    (polynomial decay to 0 with that power).
    """
    name = str(args.lr_scheduler_type)
    kwargs = dict(args.lr_scheduler_kwargs or {})
    power = float(args.poly_power)
    if name == "polynomial":
        if "power" in kwargs and power != 1.0 and float(kwargs["power"]) != power:
            raise ValueError(
                f"poly_power={power} and lr_scheduler_kwargs['power']={kwargs['power']} disagree; give one"
            )
        kwargs.setdefault("power", power)
    elif power != 1.0:
        if name != "linear":
            raise ValueError(
                f"poly_power={power} applies to lr_scheduler_type 'linear' (v4's polynomial decay) or "
                f"'polynomial', not {name!r}"
            )
        name, kwargs = "polynomial", {"lr_end": 0.0, "power": power}
    return name, kwargs


def multipliers(name: str, kwargs: dict[str, Any], lr: float, warmup: int, total: int) -> list[float]:
    """The LR multiplier of steps 0..total, from the PyTorch schedule of that name."""
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=lr)
    sched = get_scheduler(
        name, opt, num_warmup_steps=warmup, num_training_steps=total, scheduler_specific_kwargs=kwargs
    )
    curve = sched.lr_lambdas[0]  # type: ignore[attr-defined]
    return [float(curve(k)) for k in range(total + 1)]


@keras.saving.register_keras_serializable(package="trainwright")
class TabulatedSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`lr * multiplier[step]`, the last value held after the table ends."""

    def __init__(self, learning_rate: float, values: list[float] | np.ndarray) -> None:
        self.learning_rate = float(learning_rate)
        self.values = np.asarray(values, dtype=np.float64)
        self._table = tf.constant(self.learning_rate * self.values, dtype=tf.float32)

    def __call__(self, step: Any) -> tf.Tensor:
        index = tf.minimum(tf.cast(step, tf.int32), tf.shape(self._table)[0] - 1)
        return tf.gather(self._table, index)

    def value_at(self, step: int) -> float:
        """The LR of `step` on the host (for logging; no device work)."""
        return float(np.float32(self.learning_rate * self.values[min(step, len(self.values) - 1)]))

    def get_config(self) -> dict[str, Any]:
        return {"learning_rate": self.learning_rate, "values": self.values.tolist()}


def make_schedule(args: Any, num_training_steps: int) -> TabulatedSchedule:
    """The run's schedule over `num_training_steps` optimizer steps."""
    name, kwargs = schedule_arguments(args)
    warmup = args.get_warmup_steps(num_training_steps)
    values = multipliers(name, kwargs, args.learning_rate, warmup, num_training_steps)
    return TabulatedSchedule(args.learning_rate, values)


_NORM_LAYERS = (
    keras.layers.LayerNormalization,
    keras.layers.BatchNormalization,
    keras.layers.GroupNormalization,
    keras.layers.UnitNormalization,
)


def no_decay_variables(model: keras.Model) -> list[Any]:
    """Biases and normalisation weights, which get no weight decay (as on the PyTorch side)."""
    out: dict[int, Any] = {}
    for layer in model._flatten_layers(include_self=True):
        for v in layer.trainable_variables if isinstance(layer, _NORM_LAYERS) else []:
            out[id(v)] = v
    for v in model.trainable_variables:
        if v.name.split("/")[-1].split(":")[0] == "bias":
            out[id(v)] = v
    return list(out.values())


def make_optimizer(args: Any, schedule: Any, model: keras.Model) -> keras.optimizers.Optimizer:
    """The optimizer `args.optim` names, built on the model's trainable variables."""
    optim = str(args.optim)
    decay = float(args.weight_decay) or None
    opt: keras.optimizers.Optimizer
    if optim == "sgd":
        opt = keras.optimizers.SGD(learning_rate=schedule, weight_decay=decay)
    elif decay is None:  # AdamW with decay 0 would still spend a multiply-subtract per variable
        opt = keras.optimizers.Adam(
            learning_rate=schedule, beta_1=args.adam_beta1, beta_2=args.adam_beta2, epsilon=args.adam_epsilon
        )
    else:
        opt = keras.optimizers.AdamW(
            learning_rate=schedule,
            weight_decay=decay,
            beta_1=args.adam_beta1,
            beta_2=args.adam_beta2,
            epsilon=args.adam_epsilon,
        )
    if decay:
        opt.exclude_from_weight_decay(var_list=no_decay_variables(model))
    opt.build(model.trainable_variables)
    return opt
