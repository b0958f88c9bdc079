"""The engine: one backend, decided once per run. It wraps the model, builds the optimizer around
it, runs the parts of a training step that differ between backends, and says how its model and
optimizer state are checkpointed.

The loop calls the same few methods whatever the backend, so it has no backend branches:

* `wrap(model)`: DDP over several processes, FSDP2's `fully_shard`, or the model itself;
* `start(maker, max_steps, wrapped)`: the optimizer and schedule (through the Trainer's overridable
  `create_optimizer_and_scheduler`, or DeepSpeed's engine around them), `torch.compile`, ready to step;
* `accumulate(skip_sync, inputs)`: the context of one micro-batch's forward+backward (no gradient
  sync on accumulation micro-steps; DeepSpeed is told the boundary instead; context parallelism
  replaces `inputs` by this process's sequence shard inside it, `nd_engine.ContextParallelEngine`);
* `backward(loss)`; `clip()` -> the gradient norm (None when not clipped here);
* `step(grad_norm)` -> (applied, grad norm): False when fp16 loss scaling skipped the update;
* `collective_forward`: whether every process must run each forward (a sharded model gathers its
  parameters in it), so evaluation runs a forward on a batch it then drops;
* `full_state_dict(on_every_rank)`: consolidated weights, or None where the module holds them all;
* `checkpoint_parts(optimizer, restore_from=None)`: the model/optimizer state in the backend's own
  format, as parts of the checkpoint mapping (`trainwright.checkpoint.manager`), for a save or for
  restoring a given folder.

Three implementations here: `Engine` (one process or DDP, optional fp16 `GradScaler`, LOMO's fused
backward), `FSDPEngine` (FSDP2: DCP folders), `DeepSpeedEngine` (`deepspeed.py`'s `DeepSpeedRun`);
`nd_engine.NDEngine` (tensor parallel x FSDP2) in its own file. `engines.build_engine` picks one
from the arguments, once per run: a new engine is its file plus its line there.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, Protocol, cast

import torch
from torch import nn

from trainwright.checkpoint.files import SCHEDULER_NAME, WEIGHTS_NAME
from trainwright.checkpoint.weights import load_model_weights
from trainwright.distributed import fsdp
from trainwright.distributed.deepspeed import DeepSpeedRun
from trainwright.optim.extra import is_fused_backward, lomo_backward


class OptimizerMaker(Protocol):
    """The Trainer's overridable optimizer hooks, as an engine calls them."""

    optimizer: torch.optim.Optimizer | None

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None: ...

    def create_optimizer(self) -> torch.optim.Optimizer: ...

    def create_scheduler(
        self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None
    ) -> Any: ...


class Engine:
    """Plain PyTorch: one process or DDP, with the fp16 grad scaler when asked for.

    `model` is what forward runs on (`Trainer.model_wrapped`), `module` the model itself,
    `optimizer` the torch optimizer the schedule drives (`Trainer.optimizer`).
    """

    deepspeed: Any = None  # DeepSpeed's engine object, where one runs
    collective_forward = False

    def __init__(self, args: Any, runtime: Any, module: nn.Module) -> None:
        self.args, self.runtime, self.module = args, runtime, module
        self.model: nn.Module = module
        self.optimizer: torch.optim.Optimizer | None = None
        self.scaler = runtime.grad_scaler(bool(args.fp16))
        max_norm = args.max_grad_norm
        self.max_grad_norm = max_norm if max_norm is not None and max_norm > 0 else None
        accelerator_config: Any = args.accelerator_config
        # sync_each_batch: all-reduce on every micro-batch (less memory, more communication)
        self._skip_sync = runtime.distributed and not accelerator_config.sync_each_batch
        self._parameters: list[nn.Parameter] = []
        # the step's parts, chosen once the optimizer is known (`_choose_step`); before, an error
        self._backward: Callable[[torch.Tensor], None] = _not_started
        self._clip: Callable[[], torch.Tensor | None] = _not_started
        self._step: Callable[[], bool] = _not_started

    # -- set-up ------------------------------------------------------------------------------
    def wrap(self, model: nn.Module) -> nn.Module:
        """The model as training runs it: DistributedDataParallel over several processes."""
        if not self.runtime.distributed:
            return model
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(model, DistributedDataParallel):
            return model
        kwargs: dict[str, Any] = {}
        for arg, option in (
            ("ddp_find_unused_parameters", "find_unused_parameters"),
            ("ddp_bucket_cap_mb", "bucket_cap_mb"),
            ("ddp_broadcast_buffers", "broadcast_buffers"),
            ("ddp_static_graph", "static_graph"),
        ):
            if getattr(self.args, arg, None) is not None:
                kwargs[option] = getattr(self.args, arg)
        kwargs.setdefault("find_unused_parameters", find_unused_default(self.args, model))
        device = self.runtime.device
        device_ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids, **kwargs)

    def start(
        self, maker: OptimizerMaker, max_steps: int, wrapped: nn.Module
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """The optimizer and schedule for `max_steps` (after wrapping: FSDP2 replaced the parameters),
        then compile; returns what forward runs on and the optimizer the schedule drives."""
        maker.create_optimizer_and_scheduler(num_training_steps=max_steps)
        if maker.optimizer is None:
            raise RuntimeError("create_optimizer_and_scheduler() did not create Trainer.optimizer.")
        return self._ready(wrapped, maker.optimizer)

    def _ready(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        args = self.args
        if args.torch_compile:
            # torch.compile of a module returns a module (OptimizedModule); torch types it as any callable
            model = cast(
                nn.Module,
                torch.compile(model, backend=args.torch_compile_backend, mode=args.torch_compile_mode),
            )
        self.model, self.optimizer = model, optimizer
        # Listed once: walking the modules for `model.parameters()` costs ~3 us on every step.
        self._parameters = list(model.parameters())
        self._choose_step(model, optimizer)
        return model, optimizer

    def _choose_step(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """backward / clip / step for this run, decided once: LOMO's fused backward (it clips and
        updates inside it), the fp16 grad scaler's, or plain."""
        scaler, max_norm = self.scaler, self.max_grad_norm
        if is_fused_backward(optimizer):  # LOMO/AdaLOMO update the weights in the backward (no fp16: refused)
            self._backward, self._clip, self._step = partial(lomo_backward, optimizer), _no_clip, _applied
            return
        norm = self._grad_norm(model)
        # without clipping the norm is still measured (an infinite bound), as transformers logs it
        bound = float("inf") if max_norm is None else max_norm
        if scaler is None:
            self._backward, self._step = torch.Tensor.backward, partial(_plain_step, optimizer)
            self._clip = partial(norm, bound)
            return
        self._backward, self._step = (
            partial(_scaled_backward, scaler),
            partial(_scaled_step, scaler, optimizer),
        )
        self._clip = partial(_unscaled_clip, scaler, optimizer, norm, bound)

    def _grad_norm(self, model: nn.Module) -> Callable[[float], torch.Tensor]:
        """Clip the gradients to a norm and return theirs before clipping."""
        own_clip = getattr(model, "clip_grad_norm_", None)  # a wrapper that owns its clipping
        return own_clip if own_clip is not None else partial(torch.nn.utils.clip_grad_norm_, self._parameters)

    # -- the step ----------------------------------------------------------------------------
    def accumulate(self, skip_sync: bool, inputs: Any = None) -> contextlib.AbstractContextManager:
        """The micro-batch's context: no gradient all-reduce on accumulation micro-steps (nothing to
        do on one process); it yields the inputs the step trains on (`inputs` itself here; this
        process's shard of it under context parallelism)."""
        if skip_sync and self._skip_sync:
            return _no_sync(self.model, inputs)
        return contextlib.nullcontext(inputs)

    def backward(self, loss: torch.Tensor) -> None:
        self._backward(loss)

    def clip(self) -> torch.Tensor | None:
        """Clip to `max_grad_norm`; the norm before clipping (measured without clipping where it is 0 or
        None, as transformers logs it), or None where the step clips itself (LOMO)."""
        return self._clip()

    def step(self, grad_norm: Any) -> tuple[bool, Any]:
        """Step the optimizer: (applied, grad norm); not applied when the fp16 scaler skipped it."""
        return self._step(), grad_norm

    # -- checkpoints --------------------------------------------------------------------------
    @property
    def weights_in_own_format(self) -> bool:
        """Whether `checkpoint_parts` holds the weights (then the model files only describe it)."""
        return False

    def full_state_dict(self, on_every_rank: bool = False) -> dict[str, torch.Tensor] | None:
        """Whole weights for a weights file, gathered where the module holds only a part (every
        rank calls it); None when the module's own state dict has them all."""
        return None

    def checkpoint_parts(self, optimizer: bool, restore_from: str | None = None) -> dict[str, Any]:
        """This engine's parts of the checkpoint mapping: here the torch optimizer itself
        (`optimizer.pt`, main process), when the optimizer is saved or restored. A folder written by
        FSDP2 (DCP) restores into any model, sharded or not (DCP reshards)."""
        if restore_from is not None and fsdp.has_sharded_checkpoint(restore_from):
            return {"sharded": _sharded_restore(self.module, self.optimizer, optimizer, restore_from)}
        return {"optimizer": self.optimizer} if optimizer else {}


class FSDPEngine(Engine):
    """FSDP2 (`fully_shard`): weights and optimizer state are DCP folders written by every rank."""

    collective_forward = True

    def wrap(self, model: nn.Module) -> nn.Module:
        if fsdp.is_sharded(model):
            return model  # sharded by an earlier train() call
        return fsdp.shard_model(model, self.args, self.runtime)

    @property
    def weights_in_own_format(self) -> bool:
        return True

    def full_state_dict(self, on_every_rank: bool = False) -> dict[str, torch.Tensor] | None:
        return fsdp.full_state_dict(self.module, on_every_rank=on_every_rank)

    def checkpoint_parts(self, optimizer: bool, restore_from: str | None = None) -> dict[str, Any]:
        if restore_from is None:  # the weights are always saved; the optimizer's folder only with it
            return {"sharded": ShardedState(self.module, self.optimizer if optimizer else None)}
        if not fsdp.has_sharded_checkpoint(restore_from):
            raise ValueError(
                f"Can't resume {restore_from} with fsdp: it holds unsharded weights ({WEIGHTS_NAME}), not the "
                f"DCP folders ({fsdp.MODEL_DIR}/) a sharded model loads. Resume it without fsdp."
            )
        return {"sharded": _sharded_restore(self.module, self.optimizer, optimizer, restore_from)}


class ShardedState:
    """A checkpoint part in DCP's format: model (and optimizer) state, every rank writing its shards."""

    holds_weights = True

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self.model, self.optimizer = model, optimizer

    def save(self, folder: str) -> None:
        fsdp.save_sharded(self.model, self.optimizer, folder)

    def stage(self) -> dict[str, Any]:
        """For a background write (`async_writer.StagedPart`): the sharded state, taken now."""
        return fsdp.sharded_state(self.model, self.optimizer)

    def save_staged(self, folder: str, staged: dict[str, Any], group: Any = None) -> None:
        """`save` from the staged state, on the writer thread, DCP's collectives on `group`."""
        fsdp.write_sharded(staged, folder, group)

    def load(self, folder: str) -> None:
        fsdp.load_sharded(self.model, self.optimizer, folder)


def _sharded_restore(
    module: nn.Module, optimizer: torch.optim.Optimizer | None, with_optimizer: bool, folder: str
) -> ShardedState:
    # DCP's optimizer state comes back with its schedule: without scheduler.pt only the weights do
    restore_optimizer = with_optimizer and os.path.isfile(os.path.join(folder, SCHEDULER_NAME))
    return ShardedState(module, optimizer if restore_optimizer else None)


class DeepSpeedEngine(Engine):
    """DeepSpeed's engine: it wraps the model with the optimizer, reduces at the boundary it is told
    of, clips in its step (`gradient_clipping`), scales fp16 losses itself and checkpoints into
    `deepspeed/`."""

    run: DeepSpeedRun  # built by start()

    def __init__(self, args: Any, runtime: Any, module: nn.Module) -> None:
        super().__init__(args, runtime, module)
        self.scaler = None  # the engine does its own fp16 loss scaling

    def wrap(self, model: nn.Module) -> nn.Module:
        return model  # DeepSpeed's engine wraps it, with the optimizer, in start()

    def start(
        self, maker: OptimizerMaker, max_steps: int, wrapped: nn.Module
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """DeepSpeed's engine over the model with the Trainer's optimizer (or the config's); the
        schedule drives its base torch optimizer."""
        self.run = DeepSpeedRun.start(
            self.args, self.runtime, self.module, maker.optimizer, maker.create_optimizer
        )
        self.deepspeed = self.run.engine
        maker.create_scheduler(max_steps, self.run.base_optimizer)
        return self._ready(self.run.engine, self.run.base_optimizer)

    def accumulate(self, skip_sync: bool, inputs: Any = None) -> contextlib.AbstractContextManager:
        self.run.set_boundary(not skip_sync)
        return contextlib.nullcontext(inputs)

    def backward(self, loss: torch.Tensor) -> None:
        self.run.backward(loss)

    def clip(self) -> torch.Tensor | None:
        return None  # the engine clips inside its step and reports the norm

    def step(self, grad_norm: Any) -> tuple[bool, Any]:
        return self.run.step()

    def full_state_dict(self, on_every_rank: bool = False) -> dict[str, torch.Tensor] | None:
        return self.run.full_state_dict()  # ZeRO-3: gathered on every rank

    def checkpoint_parts(self, optimizer: bool, restore_from: str | None = None) -> dict[str, Any]:
        if restore_from is None:
            return {"deepspeed": self.run} if optimizer else {}
        return {"deepspeed": _EngineCheckpoint(self.run, optimizer)}


class _EngineCheckpoint:
    """Restoring DeepSpeed's engine checkpoint: weights, fp32 masters and (optionally) optimizer state."""

    holds_weights = True

    def __init__(self, run: DeepSpeedRun, with_optimizer: bool) -> None:
        self.run, self.with_optimizer = run, with_optimizer

    def save(self, folder: str) -> None:
        self.run.save(folder)

    def load(self, folder: str) -> None:
        self.run.load(folder, with_optimizer=self.with_optimizer)


def load_weights(model: nn.Module, folder: str) -> None:
    """A checkpoint's weights into `model`: DCP folders (FSDP) or safetensors / bin files."""
    if fsdp.has_sharded_checkpoint(folder):
        fsdp.load_sharded(model, None, folder)
    else:
        load_model_weights(model, folder)


@contextlib.contextmanager
def _no_sync(model: Any, inputs: Any) -> Iterator[Any]:
    """No gradient all-reduce in this micro-batch (DDP's `no_sync`, FSDP2's requires-gradient-sync);
    yields `inputs`."""
    if hasattr(model, "no_sync"):
        with model.no_sync():
            yield inputs
    elif hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
        try:
            yield inputs
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield inputs


# The step's parts (`Engine._choose_step`), as functions bound once per run.
def _not_started(*args: Any) -> Any:
    raise RuntimeError("The engine's step ran before Engine.start() built the optimizer around the model.")


def _no_clip() -> None:
    return None


def _applied() -> bool:
    return True


def _plain_step(optimizer: torch.optim.Optimizer) -> bool:
    optimizer.step()
    return True


def _scaled_backward(scaler: Any, loss: torch.Tensor) -> None:
    scaler.scale(loss).backward()


def _unscaled_clip(
    scaler: Any, optimizer: torch.optim.Optimizer, norm: Callable[[float], torch.Tensor], max_norm: float
) -> torch.Tensor:
    scaler.unscale_(optimizer)
    return norm(max_norm)


def _scaled_step(scaler: Any, optimizer: torch.optim.Optimizer) -> bool:
    """The fp16 scaler's step: False when it skipped the update (inf/NaN gradients lowered the scale)."""
    scale = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    return scaler.get_scale() >= scale


def find_unused_default(args: Any, model: nn.Module) -> bool:
    """DDP's `find_unused_parameters` where `ddp_find_unused_parameters` is not given, as transformers
    decides it: off for a transformers model that checkpoints activations (the two do not go
    together), else on (a library's wrapper may leave parameters out of a step: BERT's pooler under
    a sentence-transformers model)."""
    modeling = sys.modules.get("transformers.modeling_utils")
    if modeling is not None and isinstance(model, modeling.PreTrainedModel):
        checkpointing = getattr(model, "is_activation_checkpointing", None)
        if checkpointing is None:
            checkpointing = getattr(model, "is_gradient_checkpointing", False)
        return not (bool(checkpointing) or bool(args.activation_checkpointing))
    return True
