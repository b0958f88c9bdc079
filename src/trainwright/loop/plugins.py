"""Optional features a Trainer attaches: one table (`PLUGINS`), one row per feature.

A row says when its feature applies (`applies(args)`) and builds it once per Trainer. A plug-in
may give callbacks (added when the Trainer is built, before the user's), a context around each
`train()` call (on the model being trained), and a context around each run once the engine holds
the model (on the module the engine trains, with the run's state). The Trainer enters them in one
`ExitStack` each (`around_train`, `around_run`): an add-on is a file of its own and a row here,
and the Trainer does not change.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, cast

from torch import nn

from trainwright.args.checks import feature
from trainwright.args.training_args import TrainingArguments
from trainwright.callbacks.jit_checkpoint import jit_checkpoint_callbacks
from trainwright.core.enums import DebugOption
from trainwright.core.events import TrainerCallback
from trainwright.core.runtime import Runtime
from trainwright.distributed.collectives import float32_outputs
from trainwright.distributed.device_cache import EmptyCacheEvery
from trainwright.modeling import debug_underflow, lean_activations, liger, neftune
from trainwright.modeling.past_state import PastState, PastStateCallback


@dataclass(frozen=True)
class Values:
    """What a plug-in is built from: the Trainer's arguments, processes and model (never the Trainer)."""

    args: TrainingArguments
    runtime: Runtime
    model: nn.Module


class PlugIn:
    """One optional feature of a Trainer; each part does nothing unless the feature overrides it."""

    def callbacks(self) -> list[TrainerCallback]:
        return []

    def around_train(self, model: nn.Module) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def around_run(self, module: nn.Module, state: Any) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()


@dataclass(frozen=True)
class Row:
    """A row of `PLUGINS`: the feature's name, when it applies, how it is built for a Trainer."""

    name: str
    applies: Callable[[TrainingArguments], bool]
    build: Callable[[Values], PlugIn]


class JITCheckpoint(PlugIn):
    """`enable_jit_checkpoint`: upstream's callback for the preemption save (the Trainer sets itself
    on it, as upstream's does: `set_trainer`)."""

    def __init__(self, given: Values):
        self.saving = jit_checkpoint_callbacks(given.args)

    def callbacks(self) -> list[TrainerCallback]:
        return list(self.saving)


class PastIndex(PlugIn):
    """`past_index` (v4): the model's memory fed back as `mems` (`modeling/past_state.py`)."""

    def __init__(self, given: Values):
        self.past = PastState(given.args.past_index)
        self.past.attach(given.model)

    def callbacks(self) -> list[TrainerCallback]:
        return [PastStateCallback(self.past)]


class Liger(PlugIn):
    """`use_liger_kernel`: Liger's kernels patched into the model at each train() (kept after it)."""

    def __init__(self, given: Values):
        self.config, self.device = given.args.liger_kernel_config, given.runtime.device

    def around_train(self, model: nn.Module) -> AbstractContextManager[Any]:
        liger.apply(model, self.config, self.device)
        return contextlib.nullcontext()


class OverflowDetector(PlugIn):
    """`debug="underflow_overflow"`: the inf/nan detector, kept on the model after train() as
    upstream's; one detector a model, however many train() calls."""

    def __init__(self, given: Values):
        self.detector: debug_underflow.DebugUnderflowOverflow | None = None

    def around_train(self, model: nn.Module) -> AbstractContextManager[Any]:
        self.detector = debug_underflow.watch(model, self.detector)
        return contextlib.nullcontext()


class NEFTune(PlugIn):
    """`neftune_noise_alpha`: noise on the input embeddings for one train() call's training."""

    def __init__(self, given: Values):
        self.alpha: Any = given.args.neftune_noise_alpha  # as given: activate() checks it, naming it

    @contextlib.contextmanager
    def around_train(self, model: nn.Module) -> Iterator[None]:
        handle = neftune.activate(model, self.alpha)
        try:
            yield
        finally:
            handle.remove()


class LeanActivations(PlugIn):
    """`lean_activations`: activations that keep less for the backward, while train() runs."""

    def __init__(self, given: Values):
        self.compiled = bool(given.args.torch_compile)

    def around_train(self, model: nn.Module) -> AbstractContextManager[Any]:
        return lean_activations.applied(model, compiled=self.compiled)


class EmptyCache(PlugIn):
    """`torch_empty_cache_steps`: the device cache emptied after the forwards of every N-th step."""

    def __init__(self, given: Values):
        self.every = EmptyCacheEvery(cast(int, given.args.torch_empty_cache_steps), given.runtime.device)

    def around_run(self, module: nn.Module, state: Any) -> AbstractContextManager[Any]:
        return self.every.attach(module, state)


class Float32Outputs(PlugIn):
    """`bf16` / `fp16`: the trained model's half-precision outputs come back as float32 while
    train() runs, as from the forward accelerate prepares upstream; a loss a library computes from
    the outputs (TRL's reward trainer: a log-sigmoid of the scores) runs on float32 as there."""

    def around_train(self, model: nn.Module) -> AbstractContextManager[Any]:
        return float32_outputs(model)


# In this order: callbacks join the Trainer's in it; contexts are entered in it (left in reverse).
PLUGINS = [
    Row(
        "enable_jit_checkpoint",
        lambda a: bool(a.enable_jit_checkpoint and a.preemption_signals),
        JITCheckpoint,
    ),
    Row("past_index", lambda a: a.past_index >= 0, PastIndex),
    Row("use_liger_kernel", lambda a: bool(a.use_liger_kernel), Liger),
    Row("debug underflow_overflow", lambda a: DebugOption.UNDERFLOW_OVERFLOW in a.debug, OverflowDetector),
    Row("neftune_noise_alpha", lambda a: a.neftune_noise_alpha is not None, NEFTune),
    Row("lean_activations", lambda a: feature(a, "lean_activations"), LeanActivations),
    Row("torch_empty_cache_steps", lambda a: bool(a.torch_empty_cache_steps), EmptyCache),
    Row("bf16 / fp16", lambda a: bool(a.bf16 or a.fp16), lambda given: Float32Outputs()),
]


def build(args: TrainingArguments, runtime: Runtime, model: nn.Module) -> list[PlugIn]:
    """The plug-ins these arguments ask for, built from the Trainer's values, in the table's order."""
    given = Values(args, runtime, model)
    return [row.build(given) for row in PLUGINS if row.applies(args)]


@contextlib.contextmanager
def around_train(plugins: list[PlugIn], model: nn.Module) -> Iterator[None]:
    """Every plug-in's context around one train() call, on the model it trains."""
    with contextlib.ExitStack() as stack:
        for plugin in plugins:
            stack.enter_context(plugin.around_train(model))
        yield


def around_run(plugins: list[PlugIn], module: nn.Module, state: Any) -> contextlib.ExitStack:
    """Every plug-in's context around one run, entered now; the run closes the stack when it ends."""
    with contextlib.ExitStack() as stack:  # one that fails to enter: those before it come off
        for plugin in plugins:
            stack.enter_context(plugin.around_run(module, state))
        return stack.pop_all()
