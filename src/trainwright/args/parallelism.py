"""`TrainingArguments.parallelism_config`: the sizes of an N-D parallel layout, read from accelerate's
`ParallelismConfig` or a plain dict (or its JSON) with the same field names.

The fields (accelerate 1.15's names):

- `dp_replicate_size`: copies of the model that each hold all of it (DDP, or HSDP's replicas);
- `dp_shard_size`: processes one copy is sharded over (FSDP2 `fully_shard` on that mesh dimension);
- `tp_size`: processes each layer's weights are split over by the model's tensor-parallel plan;
- `cp_size`: processes each sequence is split over (context parallel attention; CUDA only);
- `sp_size` / `sp_backend`: DeepSpeed's Ulysses sequence parallelism: refused (not provided);
- `cp_backend` ("torch"), `tp_handler` (`enable_async_tp`), `cp_handler` (`cp_comm_strategy`: how
  ring attention passes keys and values, "allgather" or "alltoall", given to torch's `set_rotate_method`).

The product of the four sizes must be the number of processes; that is checked when the mesh is
built (`trainwright.distributed.parallelism`), where the world is known. All sizes 1 is accelerate's
"plain DDP over every process". The value is normalised to `ParallelismSizes` (so it serialises to
`training_args.json`), with the same attribute names as accelerate's class. `check(args)` does that
when the arguments are validated, and refuses what the layout cannot be combined with (deepspeed,
fsdp hybrid_shard, auto_find_batch_size; with `cp_size > 1` the arguments whose loss or batches the
sequence split would change).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from trainwright.args.checks import feature, invalid

SIZE_FIELDS = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size")
_OTHER_FIELDS = ("sp_size", "cp_backend", "sp_backend", "cp_comm_strategy", "enable_async_tp")
# mesh dimension names (accelerate's), in the order the mesh lays them out: tensor parallel innermost
MESH_DIMS = ("dp_replicate", "dp_shard", "cp", "tp")


@dataclass(frozen=True)
class ParallelismSizes:
    """The layout `parallelism_config` asks for (accelerate's field names; see the module docstring)."""

    dp_replicate_size: int = 1
    dp_shard_size: int = 1
    tp_size: int = 1
    cp_size: int = 1
    cp_comm_strategy: str = "allgather"

    @property
    def total_size(self) -> int:
        return self.dp_replicate_size * self.dp_shard_size * self.tp_size * self.cp_size

    @property
    def data_parallel_size(self) -> int:
        """Processes that read different batches (the others of a group share one)."""
        return self.dp_replicate_size * self.dp_shard_size

    @property
    def sizes(self) -> dict[str, int]:
        """{mesh dimension: size}, in mesh order."""
        return {dim: getattr(self, f"{dim}_size") for dim in MESH_DIMS}

    def describe(self) -> str:
        """The dimensions above 1, as "dp_shard=2 x tp=2" ("one process" when there are none)."""
        used = [f"{dim}={n}" for dim, n in self.sizes.items() if n > 1]
        return " x ".join(used) if used else "one process"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse(value: Any, owner: str = "TrainingArguments") -> ParallelismSizes | None:
    """The sizes `value` asks for: accelerate's `ParallelismConfig`, a dict, its JSON (or a JSON
    file), or `ParallelismSizes`; None for None. A value that can't be honoured is an error naming
    `parallelism_config` and the field."""
    if value is None or isinstance(value, ParallelismSizes):
        return value
    fields = _fields_of(value, owner)
    sizes = {}
    for name in SIZE_FIELDS:
        size = fields.get(name)
        size = 1 if size is None else size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise _error(owner, f"{name}={size!r}: a size is an integer >= 1")
        sizes[name] = size
    _refuse_unsupported(fields, owner)
    strategy = fields.get("cp_comm_strategy") or "allgather"
    if strategy not in ("allgather", "alltoall"):
        raise _error(owner, f"cp_handler.cp_comm_strategy={strategy!r}: expected 'allgather' or 'alltoall'")
    return ParallelismSizes(**sizes, cp_comm_strategy=strategy)


def _fields_of(value: Any, owner: str) -> dict[str, Any]:
    """The fields of an accelerate ParallelismConfig, or of a dict / JSON object with its names."""
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        try:
            if os.path.isfile(text):
                with open(text) as f:
                    value = json.load(f)
            else:
                value = json.loads(text)
        except (OSError, ValueError) as exc:
            raise _error(owner, f"{text!r} is neither a JSON object nor a JSON file ({exc})") from None
    if isinstance(value, Mapping):
        fields = dict(value)
        for handler in ("tp_handler", "cp_handler"):  # nested as accelerate serialises them
            nested = fields.pop(handler, None)
            if isinstance(nested, Mapping):
                fields.update(nested)
            elif nested is not None:
                fields.update(_attributes(nested))
        unknown = sorted(set(fields) - set(SIZE_FIELDS) - set(_OTHER_FIELDS))
        if unknown:
            raise _error(owner, f"unknown key(s) {unknown}; the fields are {[*SIZE_FIELDS, *_OTHER_FIELDS]}")
        return fields
    if all(hasattr(value, name) for name in SIZE_FIELDS):  # accelerate's ParallelismConfig
        fields = {name: getattr(value, name) for name in (*SIZE_FIELDS, "sp_size", "cp_backend")}
        for handler in ("tp_handler", "cp_handler"):
            fields.update(_attributes(getattr(value, handler, None)))
        return fields
    raise _error(
        owner,
        f"got a {type(value).__name__}: give accelerate's ParallelismConfig or a dict of its sizes "
        f"({', '.join(SIZE_FIELDS)})",
    )


def _attributes(handler: Any) -> dict[str, Any]:
    if handler is None:
        return {}
    return {k: getattr(handler, k) for k in ("cp_comm_strategy", "enable_async_tp") if hasattr(handler, k)}


def _refuse_unsupported(fields: dict[str, Any], owner: str) -> None:
    sp = fields.get("sp_size")
    if sp not in (None, 1):
        raise _error(
            owner,
            f"sp_size={sp!r}: DeepSpeed's Ulysses sequence parallelism (sp_backend='deepspeed') is not "
            "provided; split sequences with cp_size (context parallelism, on CUDA) or set sp_size=1",
        )
    backend = fields.get("cp_backend")
    if backend not in (None, "torch"):
        raise _error(owner, f"cp_backend={backend!r}: only 'torch' (PyTorch's context parallel) exists")
    if fields.get("enable_async_tp"):
        raise _error(
            owner,
            "tp_handler.enable_async_tp=True: asynchronous tensor parallelism (torch.compile's micro-pipelined "
            "collectives) is not provided (accelerate ignores it too); leave it False",
        )


def _error(owner: str, message: str) -> ValueError:
    return ValueError(f"{owner}: parallelism_config is invalid: {message}")


def check(args: Any) -> None:
    """`parallelism_config` normalised to `ParallelismSizes`; what it cannot be combined with."""
    if args.parallelism_config is None:
        return
    args.parallelism_config = parse(args.parallelism_config, type(args).__name__)
    reason = None
    if args.deepspeed:
        reason = "deepspeed is also set; the N-D layout runs on PyTorch's own engine, choose one"
    elif any(str(getattr(w, "value", w)).startswith("hybrid_shard") for w in args.fsdp or []):
        reason = "fsdp hybrid_shard is also set; give the replicas as dp_replicate_size instead"
    elif args.auto_find_batch_size:
        reason = "auto_find_batch_size would re-shard a model the failed try already sharded"
    if reason is not None:
        raise invalid(args, "parallelism_config", reason)
    if args.parallelism_config.cp_size > 1:
        _check_context_parallel(args)


# the arguments context parallelism (a sequence split over processes) cannot honour exactly, and why
_NOT_WITH_CP = {
    "label_smoothing_factor": "the label smoother shifts a sequence shard's labels itself (a shard's last target "
    "is in the next shard), set label_smoothing_factor=0",
    "average_tokens_across_devices": "each shard's loss is its targets' sum over the step's targets on every "
    "process, counted across devices; set average_tokens_across_devices=True",
    "fused_linear_cross_entropy": "its one-batch check runs forwards that the processes of a context-parallel "
    "group would not run together; set fused_linear_cross_entropy=False",
    "padding_free": "packed rows need a per-sequence mask that ring attention does not take; set "
    "padding_free=False and give one sequence per row",
    "use_liger_kernel": "Liger's patched forward and loss are not checked on sequence shards; set "
    "use_liger_kernel=False",
    "lean_activations": "its attention computes each shard's attention itself, not the ring attention torch "
    "puts in place of scaled_dot_product_attention; set lean_activations=False",
    "torch_compile": "torch replaces torch.nn.functional.scaled_dot_product_attention by its ring attention "
    "while each micro-batch runs, which a compiled forward may not see; set torch_compile=False",
}


def _check_context_parallel(args: Any) -> None:
    """`cp_size > 1` with an argument whose loss or batches the sequence split would change."""
    unsupported = {
        "label_smoothing_factor": bool(args.label_smoothing_factor),
        "average_tokens_across_devices": not args.average_tokens_across_devices,
        "fused_linear_cross_entropy": feature(args, "fused_linear_cross_entropy"),
        "padding_free": feature(args, "padding_free"),
        "use_liger_kernel": bool(args.use_liger_kernel),
        "lean_activations": feature(args, "lean_activations"),
        "torch_compile": bool(args.torch_compile),
    }
    for name, refused in unsupported.items():
        if refused:
            cp = args.parallelism_config.cp_size
            raise invalid(
                args,
                name,
                f"not with parallelism_config cp_size={cp} (context parallelism): {_NOT_WITH_CP[name]}",
            )
