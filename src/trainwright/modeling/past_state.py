"""`past_index` (transformers v4): feed a model's recurrent memory back to it as `mems`.

Models like Transformer-XL and XLNet return their memory among their outputs; with
`past_index >= 0` the output at that index is given back as the `mems` input of the next batch.
As in transformers v4 the memory starts empty at each epoch and at each evaluation/prediction;
outputs without a loss in front (a forward without labels) hold the memory one place earlier, at
`past_index - 1`, as v4 read it in prediction. An evaluation during training has its own memory
and leaves the training memory as it was (v4 deleted it, which failed the next step).

It is a plug-in, not part of the step: `PastState.attach(model)` puts forward hooks on the model
(one feeds `mems` in, one keeps the memory out), and `PastStateCallback` empties the training
memory at each epoch's start and the evaluation memory after each evaluation or prediction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from trainwright.core.events import TrainerCallback


class PastState:
    """The memories carried from one batch to the next: one for training forwards, one for
    evaluation forwards (the model's mode says which)."""

    def __init__(self, index: int):
        self.index = index
        self.memory: dict[bool, Any] = {True: None, False: None}  # by module.training
        self._handles: list[Any] = []
        self._model: nn.Module | None = None

    def attach(self, model: nn.Module) -> None:
        """Hook `model` (once; a new model, e.g. from `model_init`, moves the hooks to it)."""
        if model is self._model:
            return
        self.detach()
        self._handles = [
            model.register_forward_pre_hook(self._feed, with_kwargs=True),
            model.register_forward_hook(self._keep, with_kwargs=True),
        ]
        self._model = model

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self._model = [], None

    def reset(self, training: bool) -> None:
        self.memory[training] = None

    def _feed(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        past = self.memory[module.training]
        if past is None:
            return None
        if args:
            raise ValueError(f"past_index={self.index}: batches must be mappings to receive `mems`.")
        return args, {**kwargs, "mems": past}

    def _keep(self, module: nn.Module, args: tuple, kwargs: dict, outputs: Any) -> None:
        self.memory[module.training] = self.read(outputs, with_loss=_has_loss(outputs, kwargs))

    def read(self, outputs: Any, with_loss: bool = True) -> Any:
        """`outputs[past_index]` (`past_index - 1` when the outputs have no loss in front)."""
        index = self.index if with_loss else self.index - 1
        if hasattr(outputs, "to_tuple"):  # ModelOutput: indexed like its tuple (None fields dropped)
            values = outputs.to_tuple()
        elif isinstance(outputs, dict):
            values = tuple(outputs.values())
        else:
            values = outputs
        if not isinstance(values, (tuple, list)) or not -len(values) <= index < len(values):
            raise ValueError(
                f"past_index={self.index}: the model returned {type(outputs).__name__} with "
                f"{len(values) if isinstance(values, (tuple, list)) else 'no indexable'} outputs, "
                f"so there is no memory at index {index}."
            )
        return values[index]


def _has_loss(outputs: Any, kwargs: Mapping[str, Any]) -> bool:
    """Whether the outputs start with a loss: a mapping says so; a tuple has one when labels went in."""
    if isinstance(outputs, Mapping):
        return outputs.get("loss") is not None
    return kwargs.get("labels") is not None


class PastStateCallback(TrainerCallback):
    """Starts the memories empty: training's at each epoch, evaluation's after each evaluation
    (so the next one starts empty) and prediction. Hooks the model being trained."""

    def __init__(self, past: PastState):
        self.past = past

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None:  # model_init builds a new model for each train()
            self.past.attach(model)

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.past.reset(training=True)

    def on_evaluate(self, args, state, control, **kwargs):
        self.past.reset(training=False)

    def on_predict(self, args, state, control, metrics=None, **kwargs):
        self.past.reset(training=False)
