"""N-D parallelism on PyTorch's own engine: `parallelism_config` as one DeviceMesh, the model's
tensor-parallel plan applied with `parallelize_module`, FSDP2 `fully_shard` over the data-parallel
dimensions, gradient clipping over DTensors, and what a checkpoint's layout was.

The mesh has accelerate's dimensions in its order, tensor parallel innermost (neighbouring ranks,
the fastest links): ("dp_replicate", "dp_shard", "cp", "tp"). Processes that differ only in their
"cp"/"tp" coordinates read the same batch: the data-parallel ranks are the flattened
("dp_replicate", "dp_shard") dimension ("dp", as accelerate names it), and `Runtime.layout` tells
the data loaders, the item counts and the evaluation which rank and group that is. The layout is the
Trainer's, not the process's: `with_layout` gives each Trainer its own view of the process runtime,
so two Trainers in one process train on their own layouts. With
`cp_size > 1`, ("dp_shard", "cp") flattened is "dp_shard_cp", the dimension FSDP2 shards over (as
accelerate and torchtitan do: the context-parallel processes hold different tokens of one batch,
so their gradients are reduced like data-parallel ones).

The model (`parallelize`):

- `tp_size > 1`: the model's own plan (`model.tp_plan`: the class's `_tp_plan` with
  `config.base_model_tp_plan`, as transformers resolves it; `*` stands for a layer number) mapped onto
  torch's `ColwiseParallel` / `RowwiseParallel` (transformers' style names: colwise, rowwise,
  colwise_rep, colwise_gather_output, rowwise_rep, rowwise_split_input, embedding_rowwise,
  embedding_colwise). A model without a plan, or a style torch has no equivalent of, is refused by name.
  Tied parameters (input embeddings and LM head) stay one parameter.
- data-parallel size > 1 (or `cp_size > 1`): FSDP2 `fully_shard` per decoder layer and the root,
  on "dp_shard_cp" (("dp_shard", "cp") flattened; "dp_shard" alone without cp), or with
  `dp_replicate_size > 1` on ("dp_replicate", that) as HSDP (replicas all-reduce what each shard
  group reduce-scattered). `fsdp` / `fsdp_config` options (offload, reshard_after_forward, the layer
  classes) and bf16/fp16 mixed precision apply as for `fsdp`.
- `cp_size > 1`: on CUDA, each micro-batch's sequences are split over the "cp" processes and
  attention runs as PyTorch's ring attention (`context_parallel.py`); refused elsewhere: on CPU
  PyTorch's context-parallel attention has no sharding rule for the CPU SDPA kernel
  (`aten._scaled_dot_product_flash_attention_for_cpu`); see `check_context_parallel`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainwright.args.parallelism import MESH_DIMS, ParallelismSizes, parse
from trainwright.core.runtime import Layout

logger = logging.getLogger(__name__)

# the flattened mesh dimensions (accelerate's names) and the dimensions each one joins
FLATTENED = {"dp": ("dp_replicate", "dp_shard"), "dp_shard_cp": ("dp_shard", "cp")}
LAYOUT_MARK = "_trainwright_layout"  # set on a model `parallelize` sharded: its sizes
# one mesh per process group, device type and sizes: its process groups are made once
_LAYOUTS: dict[tuple, tuple[Any, Layout]] = {}


# ---------------------------------------------------------------------------------- the mesh
def requested(args: Any, runtime: Any) -> ParallelismSizes | None:
    """The layout `args.parallelism_config` asks for over this runtime's processes, checked against
    the world size; None where there is none to build (all sizes 1: plain DDP, as accelerate)."""
    sizes = parse(getattr(args, "parallelism_config", None))
    if sizes is None or sizes.total_size == 1:
        return None
    if sizes.total_size != runtime.world_size:
        product = " x ".join(f"{name}_size={n}" for name, n in sizes.sizes.items())
        raise ValueError(
            f"parallelism_config: {product} = {sizes.total_size} processes, but this job has "
            f"{runtime.world_size} (WORLD_SIZE). The sizes must multiply to the number of processes torchrun "
            "starts (--nnodes x --nproc_per_node): change dp_replicate_size, dp_shard_size, tp_size or cp_size."
        )
    check_context_parallel(sizes, runtime.device)
    return sizes


def check_context_parallel(sizes: ParallelismSizes, device: torch.device) -> None:
    """cp_size > 1 where PyTorch cannot split attention over the sequence: an error saying why."""
    if sizes.cp_size == 1:
        return
    if device.type != "cuda":
        raise ValueError(
            f"parallelism_config: cp_size={sizes.cp_size} on {device.type}: PyTorch's context parallelism "
            "(torch.distributed.tensor.experimental.context_parallel) splits the attention of CUDA's SDPA "
            f"kernels only; on {device.type} it has no sharding rule for the SDPA kernel "
            "(aten._scaled_dot_product_flash_attention_for_cpu). Train with cp_size=1 here, on GPUs for cp_size > 1."
        )
    try:
        from torch.distributed.tensor.experimental import context_parallel  # noqa: F401
        from torch.distributed.tensor.experimental._attention import set_rotate_method  # noqa: F401
    except ImportError as err:
        raise ValueError(
            f"parallelism_config: cp_size={sizes.cp_size}: this torch ({torch.__version__}) has no context "
            f"parallelism ({err}); install torch >= 2.7 or set cp_size=1."
        ) from None


def loaded_layout(model: Any, runtime: Any) -> ParallelismSizes | None:
    """The layout a model already has because transformers sharded it when loading it
    (`from_pretrained(tp_plan="auto")` under torchrun), or None for any other model. Adopted as it
    is: tensor parallel over every process; another loaded layout is refused naming the way out."""
    if not getattr(model, "_is_distributed_loading_by_transformers", False):
        return None
    mesh = getattr(model, "_device_mesh", None) or getattr(model, "device_mesh", None)
    dims = dict(zip(getattr(mesh, "mesh_dim_names", None) or (), getattr(mesh, "shape", None) or ()))
    tp = dims.get("tp", 0)
    if tp != runtime.world_size or any(n > 1 for name, n in dims.items() if name != "tp"):
        raise ValueError(
            f"{type(model).__name__} was sharded when it was loaded, on a mesh {dims or '?'} of "
            f"{runtime.world_size} processes: trainwright adopts a model loaded with tp_plan over every "
            "process (tensor parallel only). Load it that way, or without tp_plan / distributed_config and "
            'pass parallelism_config={"tp_size": N, "dp_shard_size": M}.'
        )
    return ParallelismSizes(tp_size=tp)


def layout_asked(args: Any, runtime: Any, model: Any = None) -> ParallelismSizes | None:
    """The layout of a run: the one a model was loaded with, else `parallelism_config`'s (both at
    once must agree)."""
    loaded = loaded_layout(model, runtime)
    sizes = requested(args, runtime)
    if loaded is not None and sizes is not None and sizes.sizes != loaded.sizes:
        raise ValueError(
            f"parallelism_config asks for {sizes.describe()}, but {type(model).__name__} was loaded sharded as "
            f"{loaded.describe()} (from_pretrained(tp_plan=...)): give only one of them."
        )
    return loaded or sizes


def with_layout(args: Any, runtime: Any, model: Any = None) -> Any:
    """The runtime a Trainer runs on: the process's `runtime` itself without a layout (every process
    one data-parallel rank), else a view of it holding the layout asked for (`layout_asked`; the
    process group stays the process runtime's to tear down). Every process calls it."""
    sizes = layout_asked(args, runtime, model)
    if sizes is None:
        return runtime
    return dataclasses.replace(runtime, layout=layout_of(sizes, runtime), _owns_group=False)


def layout_of(sizes: ParallelismSizes, runtime: Any) -> Layout:
    """The mesh of `sizes` over the process group, with its data-parallel view (built once)."""
    key = (runtime.device.type, tuple(sizes.sizes.values()))
    world = dist.group.WORLD  # a new process group (after a teardown) needs a new mesh
    cached = _LAYOUTS.get(key)
    if cached is None or cached[0] is not world:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(runtime.device.type, tuple(sizes.sizes.values()), mesh_dim_names=MESH_DIMS)
        data = mesh[("dp_replicate", "dp_shard")]._flatten("dp")
        leaders = tuple(int(r) for r in mesh.mesh[:, :, 0, 0].flatten().tolist())
        layout = Layout(
            mesh=mesh,
            sizes=sizes.sizes,
            data_rank=data.get_local_rank(),
            data_world_size=data.size(),
            data_group=data.get_group(),
            data_leaders=leaders,
            shard_mesh=_shard_mesh(mesh, sizes),
        )
        cached = _LAYOUTS[key] = (world, layout)
        logger.info(
            "N-D parallel layout %s over %d processes: mesh %s; %d data-parallel ranks (this process: %d)",
            sizes.describe(),
            runtime.world_size,
            dict(sizes.sizes),
            data.size(),
            data.get_local_rank(),
        )
    return cached[1]


def _shard_mesh(mesh: Any, sizes: ParallelismSizes) -> Any:
    """The mesh FSDP2 shards over: "dp_shard", or with cp_size > 1 "dp_shard_cp" (("dp_shard", "cp")
    flattened), with the replicas as HSDP's outer dimension."""
    shard = mesh["dp_shard"] if sizes.cp_size == 1 else mesh[("dp_shard", "cp")]._flatten("dp_shard_cp")
    if sizes.dp_replicate_size == 1:
        return shard
    if sizes.cp_size == 1:
        return mesh[("dp_replicate", "dp_shard")]
    join = getattr(type(mesh), "_concatenate", None)  # torch >= 2.9: a flattened mesh is bookkept directly
    if join is not None:
        return join([mesh["dp_replicate"], shard])
    return mesh[("dp_replicate", "dp_shard_cp")]  # older torch: sliced from the root by its name


def data_parallel_mesh(layout: Layout) -> Any:
    """The mesh FSDP2 shards over (`_shard_mesh`, built with the layout)."""
    return layout.shard_mesh


# ---------------------------------------------------------------------------------- tensor parallel
_LINEAR_OR_EMBEDDING = (nn.Linear, nn.Embedding)


def _style(name: str) -> Any:
    """torch's ParallelStyle for transformers' style `name` (None: torch has no equivalent here)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    styles = {
        "colwise": lambda: ColwiseParallel(),
        "rowwise": lambda: RowwiseParallel(),
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
        "rowwise_split_input": lambda: RowwiseParallel(input_layouts=Replicate()),
        "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),
        "embedding_colwise": lambda: ColwiseParallel(output_layouts=Replicate()),
    }
    make = styles.get(name)
    return make() if make is not None else None


def model_tp_plan(model: nn.Module) -> dict[str, str]:
    """The model's tensor-parallel rules {module pattern: style}: transformers' resolved `tp_plan`,
    else the class's `_tp_plan` with its config's `base_model_tp_plan` (under `base_model_prefix`)."""
    plan = getattr(model, "tp_plan", None)
    if isinstance(plan, dict) and plan:
        return dict(plan)
    plan = dict(getattr(model, "_tp_plan", None) or {})
    base = getattr(getattr(model, "config", None), "base_model_tp_plan", None) or {}
    prefix = getattr(model, "base_model_prefix", "")
    inner = prefix and hasattr(model, prefix) and getattr(model, prefix) is not model
    plan.update({(f"{prefix}.{k}" if inner else k): v for k, v in base.items()})
    return plan


def tensor_parallel_plan(model: nn.Module, tp_size: int) -> dict[str, Any]:
    """{module name: torch ParallelStyle} for `model`'s own plan; refuses what can't be honoured."""
    rules = model_tp_plan(model)
    name = type(model).__name__
    if not rules:
        raise ValueError(
            f"parallelism_config: tp_size={tp_size}, but {name} has no tensor-parallel plan (no `tp_plan` / "
            "`_tp_plan`, no `config.base_model_tp_plan`). Tensor parallelism splits a model by its own plan: "
            f"give {name} one (e.g. model._tp_plan = {{'layers.*.mlp.up_proj': 'colwise', ...}}) or set tp_size=1."
        )
    _check_heads(model, tp_size)
    modules = dict(model.named_modules())
    plan: dict[str, Any] = {}
    unmatched = []
    for pattern, style_name in rules.items():
        regex = re.compile(re.escape(pattern).replace(r"\*", r"\d+"))
        hits = [m for m in modules if m and regex.fullmatch(m)]
        if not hits:
            unmatched.append(pattern)
        for module_name in hits:
            style = _style(style_name)
            if style is None:
                raise ValueError(
                    f"parallelism_config: {name}'s tensor-parallel plan gives {module_name} the style "
                    f"{style_name!r}, which has no torch ParallelStyle here (supported: colwise, rowwise, "
                    "colwise_rep, colwise_gather_output, rowwise_rep, rowwise_split_input, embedding_rowwise, "
                    "embedding_colwise). Use tp_size=1 for this model."
                )
            if not isinstance(modules[module_name], _LINEAR_OR_EMBEDDING):
                raise ValueError(
                    f"parallelism_config: {name}'s tensor-parallel plan gives {module_name} "
                    f"({type(modules[module_name]).__name__}) the style {style_name!r}; torch shards only "
                    "nn.Linear and nn.Embedding that way. Use tp_size=1 for this model."
                )
            plan[module_name] = style
    if unmatched:
        logger.warning("Tensor-parallel rules of %s that match no module (not applied): %s", name, unmatched)
    return plan


def _check_heads(model: nn.Module, tp_size: int) -> None:
    """Attention heads must split evenly: each rank reshapes its slice of a projection into whole heads."""
    config = getattr(model, "config", None)
    get_text = getattr(config, "get_text_config", None)
    config = get_text() if callable(get_text) else config
    for field in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(config, field, None)
        if isinstance(heads, int) and heads % tp_size:
            raise ValueError(
                f"parallelism_config: tp_size={tp_size} does not divide the model's {field}={heads}: each "
                "tensor-parallel rank holds whole attention heads. Choose a tp_size that divides it."
            )


def apply_tensor_parallel(model: nn.Module, tp_mesh: Any, tp_size: int) -> int:
    """Shard `model` by its plan over `tp_mesh` (in place); returns the number of modules sharded."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    plan = tensor_parallel_plan(model, tp_size)
    shared: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        shared.setdefault(id(param), []).append(name)
    parallelize_module(model, tp_mesh, plan)
    for names in (n for n in shared.values() if len(n) > 1):  # tied: one parameter again
        params = [model.get_parameter(n) for n in names]
        layouts = {(type(p).__name__, getattr(p, "placements", None)) for p in params}
        if len(layouts) > 1 and any(isinstance(p, DTensor) for p in params):
            raise ValueError(
                f"parallelism_config: the tied parameters {names} get different layouts from the "
                f"tensor-parallel plan ({sorted(map(str, layouts))}); untie them or use tp_size=1."
            )
        for n in names[1:]:
            owner, _, attr = n.rpartition(".")
            setattr(model.get_submodule(owner), attr, params[0])
    return len(plan)


# ---------------------------------------------------------------------------------- gradients
def clip_grad_norm_(
    parameters: Iterable[nn.Parameter], max_norm: float, layout: Layout, norm_type: float = 2.0
) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` for a model laid out on `layout`'s mesh: gradients are DTensors
    on sub-meshes of it (tensor parallel on one, FSDP on another) or plain tensors copied on every
    process. Each process adds up its own shards once (a copy counts on the first process holding
    it), and one all-reduce over every process makes the total, the same bits on all of them (DTensor's
    own reduction runs one all-reduce per mesh dimension, in an order that differs between ranks, and
    replicated weights would drift apart); every gradient is scaled by the same factor. Returns the
    total norm."""
    from torch.distributed.tensor import DTensor

    groups: dict[Any, list[nn.Parameter]] = {}
    mine: list[torch.Tensor] = []
    for p in parameters:
        grad = p.grad
        if grad is None:
            continue
        key = (grad.device_mesh, grad.placements) if isinstance(grad, DTensor) else None
        groups.setdefault(key, []).append(p)
        if _counts_here(grad, layout):
            mine.append(grad.to_local() if isinstance(grad, DTensor) else grad)
    if not groups:
        return torch.zeros(())
    device = next(iter(groups.values()))[0].device
    if norm_type == float("inf"):
        part = (
            torch.stack([g.detach().abs().max() for g in mine]).max()
            if mine
            else torch.zeros((), device=device)
        )
        dist.all_reduce(part, op=dist.ReduceOp.MAX)
        total = part
    else:
        part = torch.zeros((), dtype=torch.float32, device=device)
        for g in mine:
            part += torch.linalg.vector_norm(g.detach().float(), norm_type) ** norm_type
        dist.all_reduce(part)
        total = part ** (1.0 / norm_type)
    for params in groups.values():  # one mesh at a time: a foreach op can't mix meshes
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def _counts_here(grad: torch.Tensor, layout: Layout) -> bool:
    """Whether this process's copy of `grad` is the one that counts in the norm: on every mesh
    dimension it is replicated over (not named by its mesh, or Replicate there), this process is first."""
    from torch.distributed.tensor import DTensor

    coordinate = dict(zip(MESH_DIMS, layout.mesh.get_coordinate() or ()))
    replicated = set(MESH_DIMS)
    if isinstance(grad, DTensor):
        names = grad.device_mesh.mesh_dim_names or ()
        for name, placement in zip(names, grad.placements):
            if not placement.is_replicate():  # a flattened dimension shards over each of its parts
                replicated -= set(FLATTENED.get(name, (name,)))
    return all(coordinate.get(dim, 0) == 0 for dim in replicated)


# ---------------------------------------------------------------------------------- checkpoints' layouts
def checkpoint_layout(folder: str, writers: int) -> str:
    """How the checkpoint in `folder` was laid out, from its training_args.json and the number of
    processes that wrote its DCP shards."""
    saved: dict[str, Any] = {}
    path = os.path.join(folder, "training_args.json")
    if os.path.isfile(path):
        with open(path) as f:
            saved = json.load(f)
    sizes = parse(saved.get("parallelism_config"))
    if sizes is not None and sizes.total_size == writers:
        return f"{sizes.describe()} ({writers} processes)"
    return _plain_layout(writers, sharded=bool(saved.get("fsdp")))


def current_layout(model: nn.Module) -> str:
    """How `model` is laid out over the processes now."""
    sizes = getattr(model, LAYOUT_MARK, None)
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if sizes is not None:
        return (
            f"{ParallelismSizes(**{f'{k}_size': v for k, v in sizes.items()}).describe()} ({world} processes)"
        )
    from torch.distributed.tensor import DTensor

    return _plain_layout(world, sharded=any(isinstance(p, DTensor) for p in model.parameters()))


def _plain_layout(processes: int, sharded: bool) -> str:
    if processes == 1:
        return "one process"
    return f"{'dp_shard' if sharded else 'dp_replicate'}={processes} ({processes} processes)"


def note_layout_change(folder: str, writers: int, model: nn.Module) -> None:
    """A checkpoint restored into another layout: one warning saying what still holds and what does not."""
    saved, now = checkpoint_layout(folder, writers), current_layout(model)
    if saved == now:
        return
    logger.warning(
        "Loading %s, written by %s, into %s: DCP reshards the weights and optimizer state, and a resumed "
        "run's data position is rescaled to the new data-parallel ranks, so training continues on the same "
        "samples with the same loss up to float rounding. What changes: the run is no longer bit-for-bit "
        "the uninterrupted one (sums are reduced in another order and grouping), and each process's random "
        "streams come from the saved file of its own rank number where one exists (else they start afresh), "
        "so dropout and other random draws differ from the saved run's.",
        folder,
        saved,
        now,
    )
