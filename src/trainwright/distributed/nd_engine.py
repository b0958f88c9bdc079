"""The N-D parallel engine: `parallelism_config`'s layout (`parallelism.py`) as the run's engine.

It is FSDP2's engine (`FSDPEngine`: DCP checkpoints, consolidated weights for `save_model`,
`set_requires_gradient_sync` on accumulation micro-steps, collective forwards) with:

* `wrap`: the model's tensor-parallel plan over the mesh's "tp" dimension, then `fully_shard` over
  its data-parallel dimensions (HSDP with replicas), every rank starting from rank 0's weights;
* `clip`: the gradient norm over DTensors that live on different meshes (`parallelism.clip_grad_norm_`).

`ContextParallelEngine` (`cp_size > 1`, CUDA) adds the sequence split to the micro-batch context.

What the loop needs besides is a fact of the Trainer's runtime layout, set when the Trainer is built
(`parallelism.with_layout`): the data loaders deal batches per data-parallel rank (tensor-parallel peers
read the same batch), item counts are summed over the data-parallel ranks, and FLOPs, samples and
tokens are counted once per data-parallel rank.

`engines.build_engine` picks it for a `parallelism_config` layout.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from trainwright.checkpoint.files import WEIGHTS_NAME
from trainwright.distributed import context_parallel, engine, fsdp, parallelism

logger = logging.getLogger(__name__)


class NDEngine(engine.FSDPEngine):
    """Tensor parallel x FSDP2 (x HSDP replicas) over one DeviceMesh; see the module docstring."""

    def __init__(self, args: Any, runtime: Any, module: nn.Module) -> None:
        super().__init__(args, runtime, module)
        self.layout = runtime.layout

    def wrap(self, model: nn.Module) -> nn.Module:
        return parallelize(model, self.args, self.runtime, self.layout)

    def _grad_norm(self, model: nn.Module) -> Callable[[float], torch.Tensor]:
        """The norm over every mesh dimension (DTensor gradients of several placements)."""
        return lambda max_norm: parallelism.clip_grad_norm_(self._parameters, max_norm, self.layout)

    def checkpoint_parts(self, optimizer: bool, restore_from: str | None = None) -> dict[str, Any]:
        if restore_from is not None and not fsdp.has_sharded_checkpoint(restore_from):
            raise ValueError(
                f"Can't resume {restore_from} with parallelism_config: it holds unsharded weights ({WEIGHTS_NAME}), "
                f"not the DCP folders ({fsdp.MODEL_DIR}/) a tensor-parallel or sharded model loads. Resume it "
                "without parallelism_config, or start from its weights (from_pretrained) without resuming."
            )
        return super().checkpoint_parts(optimizer, restore_from)


class LoadedLayoutEngine(NDEngine):
    """A model transformers sharded when loading it (`from_pretrained(tp_plan="auto")` under torchrun):
    its DTensors and tensor-parallel mesh are taken as they are (`parallelism.loaded_layout`), and the
    run is NDEngine's on that layout: nothing is sharded again, weights are not broadcast (every
    process loaded its own shard), DCP checkpoints, the clip over DTensors."""

    def wrap(self, model: nn.Module) -> nn.Module:
        setattr(model, parallelism.LAYOUT_MARK, dict(self.layout.sizes))
        return model


class ContextParallelEngine(NDEngine):
    """`cp_size > 1`: NDEngine whose micro-batch context splits the micro-batch's sequences over the
    mesh's "cp" processes and runs attention as PyTorch's ring attention (`context_parallel.py`).
    Chosen once per run (`engines.build_engine`); the model is checked once, here."""

    def __init__(self, args: Any, runtime: Any, module: nn.Module) -> None:
        super().__init__(args, runtime, module)
        context_parallel.check_model(module)
        sizes = parallelism.requested(args, runtime)
        assert sizes is not None  # build_engine chose this engine for a layout
        self.cp_mesh = self.layout.mesh["cp"]
        self.rotate_method = sizes.cp_comm_strategy
        logger.info(
            "Context parallel over cp=%d (%s rotation): each micro-batch's sequences are split for training; "
            "evaluation and prediction run each sequence whole on every process of a cp group (exact, with "
            "a whole sequence's activations)",
            sizes.cp_size,
            self.rotate_method,
        )

    def accumulate(self, skip_sync: bool, inputs: Any = None) -> contextlib.AbstractContextManager:
        return context_parallel.micro_batch(
            inputs, self.cp_mesh, self.rotate_method, self.runtime.device, super().accumulate(skip_sync)
        )


def parallelize(model: nn.Module, args: Any, runtime: Any, layout: Any) -> nn.Module:
    """Tensor parallel by the model's plan, then FSDP2 over the data-parallel dimensions; every rank
    starts from rank 0's weights (unless fsdp_config["sync_module_states"] is False). Returns the
    same module, sharded; a model sharded by an earlier train() call for this layout is returned."""
    done = getattr(model, parallelism.LAYOUT_MARK, None)
    if done is not None:
        if done != layout.sizes:
            raise ValueError(
                f"parallelism_config: this model was sharded for {done} by an earlier train() call; it can't "
                f"be sharded again for {layout.sizes}. Build the model again for the new layout."
            )
        return model
    if dict(getattr(args, "fsdp_config", None) or {}).get("sync_module_states", True):
        fsdp.broadcast_from_rank0(model)
    sizes = layout.sizes
    tp_modules = 0
    if sizes["tp"] > 1:
        tp_modules = parallelism.apply_tensor_parallel(model, layout.mesh["tp"], sizes["tp"])
    if sizes["dp_replicate"] * sizes["dp_shard"] * sizes["cp"] > 1:
        fsdp.shard_model(model, args, runtime, mesh=parallelism.data_parallel_mesh(layout))
    setattr(model, parallelism.LAYOUT_MARK, dict(sizes))
    logger.info(
        "Parallelized %s: %d module(s) tensor-parallel over tp=%d; FSDP2 over %s",
        type(model).__name__,
        tp_modules,
        sizes["tp"],
        {k: sizes[k] for k in ("dp_replicate", "dp_shard", "cp")},
    )
    return model
