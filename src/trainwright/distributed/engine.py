"""The engine: how one backend runs the parts of a training step that differ between backends, and
checkpoints its model and optimizer.

The loop calls the same few methods whatever the backend, so it has no backend branches:

* `accumulate(skip_sync)`: the context of one micro-batch's forward+backward (no gradient sync on
  accumulation micro-steps; DeepSpeed is told the boundary instead);
* `backward(loss)`; `clip()` -> the gradient norm (None when not clipped here);
* `step(grad_norm)` -> (applied, grad norm): False when fp16 loss scaling skipped the update;
* `full_state_dict(on_every_rank)`: consolidated weights, or None where the module holds them all;
* `checkpoint_parts(optimizer)`: the model/optimizer state in the backend's own format, as parts of
  the checkpoint mapping (`trainwright.checkpoint.manager`); `load(folder, optimizer)` reads them back.

Three implementations: `Engine` (one process or DDP, optional fp16 `GradScaler`, LOMO's fused
backward), `FSDPEngine` (FSDP2: DCP folders), `DeepSpeedEngine` (`deepspeed.py`'s `DeepSpeedRun`).
`build_engine` picks one from the arguments and the wrapped model.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from trainwright.checkpoint.files import SCHEDULER_NAME, WEIGHTS_NAME
from trainwright.distributed import fsdp
from trainwright.distributed.deepspeed import DeepSpeedRun
from trainwright.distributed.runtime import Runtime
from trainwright.optim.extra import is_fused_backward, lomo_backward

_NO_CONTEXT = contextlib.nullcontext()  # reusable: nullcontext keeps no state


class Engine:
    """Plain PyTorch: one process or DDP, with the fp16 grad scaler when asked for.

    `model` is what forward runs on (`Trainer.model_wrapped`), `module` the model itself,
    `optimizer` the torch optimizer the schedule drives (`Trainer.optimizer`).
    """

    owns_optimizer = False  # True: the engine builds the optimizer around the model (`start`)
    plain_boundary = True  # `accumulate(False)` does nothing: the loop may skip the call
    deepspeed: Any = None  # DeepSpeed's engine object, where one runs

    def __init__(self, args: Any, runtime: Runtime, module: nn.Module, wrapped: nn.Module) -> None:
        self.args, self.runtime, self.module = args, runtime, module
        self.model: nn.Module = wrapped
        self.optimizer: torch.optim.Optimizer | None = None
        self.scaler = runtime.grad_scaler(bool(args.fp16))
        max_norm = args.max_grad_norm
        self.max_grad_norm = max_norm if max_norm is not None and max_norm > 0 else None
        accelerator_config: Any = args.accelerator_config
        # sync_each_batch: all-reduce on every micro-batch (less memory, more communication)
        self._skip_sync = runtime.distributed and not accelerator_config.sync_each_batch
        self._fused = False
        self._parameters: list[nn.Parameter] = []
        self._own_clip: Callable[[float], torch.Tensor] | None = None

    def start(
        self, optimizer: torch.optim.Optimizer | None, create_optimizer: Callable[[], torch.optim.Optimizer]
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """For an engine that `owns_optimizer`: build it around the model and `optimizer` (made by
        `create_optimizer` when None). Returns what forward runs on and the optimizer the schedule
        drives; here the model as wrapped and the Trainer's optimizer."""
        return self.model, optimizer if optimizer is not None else create_optimizer()

    def attach(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """What forward runs on and what the schedule steps, once both exist (after wrapping,
        compiling and creating the optimizer)."""
        self.model, self.optimizer = model, optimizer
        self._fused = is_fused_backward(optimizer)  # LOMO/AdaLOMO update the weights in the backward
        # Listed once: walking the modules for `model.parameters()` costs ~3 us on every step.
        self._parameters = list(model.parameters())
        self._own_clip = getattr(model, "clip_grad_norm_", None)  # FSDP owns its clipping

    # -- the step ----------------------------------------------------------------------------
    def accumulate(self, skip_sync: bool) -> contextlib.AbstractContextManager:
        """No gradient all-reduce on accumulation micro-steps (nothing to do on one process)."""
        if skip_sync and self._skip_sync:
            return self.runtime.no_sync(self.model, skip_sync=True)
        return _NO_CONTEXT

    def backward(self, loss: torch.Tensor) -> None:
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        elif self._fused:
            lomo_backward(self.optimizer, loss)
        else:
            loss.backward()

    def clip(self) -> torch.Tensor | None:
        """Clip to `max_grad_norm`; the norm before clipping, or None when nothing was clipped here."""
        if self.max_grad_norm is None or self._fused:  # LOMO clipped inside its backward
            return None
        if self.scaler is not None:
            assert self.optimizer is not None  # attached before training
            self.scaler.unscale_(self.optimizer)
        if self._own_clip is not None:
            return self._own_clip(self.max_grad_norm)
        return torch.nn.utils.clip_grad_norm_(self._parameters, self.max_grad_norm)

    def step(self, grad_norm: Any) -> tuple[bool, Any]:
        """Step the optimizer: (applied, grad norm); not applied when the fp16 scaler skipped it."""
        if self._fused:
            return True, grad_norm  # LOMO stepped inside the backward
        assert self.optimizer is not None  # attached before training
        if self.scaler is None:
            self.optimizer.step()
            return True, grad_norm
        scale = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return self.scaler.get_scale() >= scale, grad_norm

    # -- checkpoints --------------------------------------------------------------------------
    @property
    def weights_in_own_format(self) -> bool:
        """Whether `checkpoint_parts` holds the weights (then the model files only describe it)."""
        return False

    def full_state_dict(self, on_every_rank: bool = False) -> dict[str, torch.Tensor] | None:
        """Whole weights for a weights file, gathered where the module holds only a part (every
        rank calls it); None when the module's own state dict has them all."""
        return None

    def checkpoint_parts(self, optimizer: bool) -> dict[str, Any]:
        """This engine's parts of the checkpoint mapping when the optimizer is saved: here the torch
        optimizer itself (`optimizer.pt`, written by the main process)."""
        return {"optimizer": self.optimizer} if optimizer else {}

    def load(self, folder: str, optimizer: bool) -> bool:
        """Load model (and optimizer) state written in a backend's own format; False when the folder
        holds plain files (weights file, optimizer.pt) for the caller to load. DCP folders load into
        any model, sharded or not (DCP reshards)."""
        if not fsdp.has_sharded_checkpoint(folder):
            return False
        # DCP's optimizer state comes back with its schedule: without scheduler.pt only the weights do
        with_optimizer = optimizer and os.path.isfile(os.path.join(folder, SCHEDULER_NAME))
        fsdp.load_sharded(self.module, self.optimizer if with_optimizer else None, folder)
        return True


class FSDPEngine(Engine):
    """FSDP2 (`fully_shard`): weights and optimizer state are DCP folders written by every rank."""

    @property
    def weights_in_own_format(self) -> bool:
        return True

    def full_state_dict(self, on_every_rank: bool = False) -> dict[str, torch.Tensor] | None:
        return fsdp.full_state_dict(self.module, on_every_rank=on_every_rank)

    def checkpoint_parts(self, optimizer: bool) -> dict[str, Any]:
        # the weights are always saved: without the optimizer only the model's DCP folder is written
        return {"sharded": ShardedState(self.module, self.optimizer if optimizer else None)}

    def load(self, folder: str, optimizer: bool) -> bool:
        if not super().load(folder, optimizer):
            raise ValueError(
                f"Can't resume {folder} with fsdp: it holds unsharded weights ({WEIGHTS_NAME}), not the DCP "
                f"folders ({fsdp.MODEL_DIR}/) a sharded model loads. Resume it without fsdp."
            )
        return True


class ShardedState:
    """A checkpoint part in DCP's format: model (and optimizer) state, every rank writing its shards."""

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


class DeepSpeedEngine(Engine):
    """DeepSpeed's engine: it reduces at the boundary it is told of, clips in its step
    (`gradient_clipping`), scales fp16 losses itself and checkpoints into `deepspeed/`."""

    owns_optimizer = True
    plain_boundary = False  # the engine must be told of every micro-batch's boundary
    run: DeepSpeedRun  # built by start()

    def __init__(self, args: Any, runtime: Runtime, module: nn.Module, wrapped: nn.Module) -> None:
        super().__init__(args, runtime, module, wrapped)
        self.scaler = None  # the engine does its own fp16 loss scaling

    def start(
        self, optimizer: torch.optim.Optimizer | None, create_optimizer: Callable[[], torch.optim.Optimizer]
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Build DeepSpeed's engine over the model with `optimizer` (or the config's); returns what
        forward runs on and the base torch optimizer the schedule drives."""
        self.run = DeepSpeedRun.start(self.args, self.runtime, self.module, optimizer, create_optimizer)
        self.deepspeed = self.run.engine
        return self.run.engine, self.run.base_optimizer

    def accumulate(self, skip_sync: bool) -> contextlib.AbstractContextManager:
        self.run.set_boundary(not skip_sync)
        return _NO_CONTEXT

    def backward(self, loss: torch.Tensor) -> None:
        self.run.backward(loss)

    def clip(self) -> torch.Tensor | None:
        return None  # the engine clips inside its step and reports the norm

    def step(self, grad_norm: Any) -> tuple[bool, Any]:
        return self.run.step()

    def full_state_dict(self, on_every_rank: bool = False) -> dict[str, torch.Tensor] | None:
        return self.run.full_state_dict()  # ZeRO-3: gathered on every rank

    def checkpoint_parts(self, optimizer: bool) -> dict[str, Any]:
        return {"deepspeed": self.run} if optimizer else {}

    def load(self, folder: str, optimizer: bool) -> bool:
        self.run.load(folder, with_optimizer=optimizer)  # weights, fp32 masters, optimizer state
        return True


def build_engine(args: Any, runtime: Runtime, module: nn.Module, wrapped: nn.Module) -> Engine:
    """The engine for these arguments and this (already wrapped) model."""
    kind = DeepSpeedEngine if args.deepspeed else FSDPEngine if fsdp.is_sharded(wrapped) else Engine
    return kind(args, runtime, module, wrapped)
