"""Context parallelism (`parallelism_config` `cp_size > 1`, CUDA only): every sequence of a batch is
split along its length over the processes of the mesh's "cp" dimension, and attention runs as
PyTorch's ring attention over them (`torch.distributed.tensor.experimental.context_parallel`).

The processes of one "cp" group read the same batch (they are one data-parallel rank). The parts:

* `prepare(batch, cp_size)`, pure (CPU): the batch made splittable so that the shards' losses add
  up to the unsplit loss, or refused. Position ids are made explicit (a shard's rotary positions are
  its tokens' places in the whole sequence); the labels are shifted before the split into
  transformers' `shift_labels`, which a causal LM's loss uses as given (shifting inside a shard would
  pair each shard's last position with nothing and drop its first label); a right-padding
  attention mask is dropped (causal attention already keeps every real token from the padding after
  it) and replaced by ones, so that transformers builds no mask and SDPA runs with `is_causal=True`;
  the length is padded at the end to a multiple of 2 x cp_size (the head-tail load balancing cuts
  each sequence into that many chunks) with positions that carry no target and that no real token
  can attend to. Left padding, padding with targets, packed sequences (position ids that restart)
  and other per-token inputs are refused by name: dropping their mask would change the loss.
* `check_model(model)`: what ring attention needs of the model: SDPA attention, a causal LM,
  full causal attention in every layer (no sliding window), no router loss over a shard, a loss that
  divides by `num_items_in_batch` (a shard may hold no target: a mean over it would be NaN).
  `check_loss_function` / `refuse_mean_loss`: the Trainer's side of that; the arguments that can't
  be honoured (label smoothing, `fused_linear_cross_entropy`, ...) are refused in `args/parallelism.py`.
* `split(batch, cp_mesh, rotate_method, device)`, the CUDA path: the prepared batch on the device,
  then torch's `context_parallel` shards input ids, labels, shifted labels, position ids and the
  mask in place (its head-tail load balancer: rank r keeps chunks r and 2*cp_size-1-r, so every rank
  gets the same share of the causal work) and replaces SDPA with its ring attention (`set_rotate_method`:
  `cp_comm_strategy`, "allgather" or "alltoall") for the micro-batch's forward and backward.
  `micro_batch` is that as the training loop's micro-batch context (`nd_engine.ContextParallelEngine.
  accumulate`): the loop's micro-batch mapping holds the shard inside it and its own contents after.

The loss of a shard is `sum of its targets' losses / N`, N being the step's targets over every
data-parallel rank (counted on the unsplit batches); FSDP2 averages gradients over the
dp_shard x cp processes it shards over, so the Trainer multiplies the loss by
data-parallel size x cp_size (`Runtime.gradient_average_size`), and the logged loss, the mean over
every process of that, is the step's loss. Token counts, FLOPs and `num_input_tokens_seen` are
counted on the unsplit batch, once per data-parallel rank.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainwright.modeling.loss import is_causal_lm, model_accepts_loss_kwargs

IGNORE_INDEX = -100
SPLIT = ("input_ids", "labels", "shift_labels", "position_ids", "attention_mask")  # split along dim 1
_PAD = {"labels": IGNORE_INDEX, "shift_labels": IGNORE_INDEX, "input_ids": 0, "attention_mask": 1}


def _refuse(reason: str) -> ValueError:
    return ValueError(f"parallelism_config cp_size > 1 (context parallelism): {reason}")


# ---------------------------------------------------------------------------------- the batch (pure)
def prepare(batch: Mapping[str, Any], cp_size: int) -> dict[str, Any]:
    """`batch` (a dict or `BatchEncoding` of a causal LM, on the CPU) as its `cp_size` sequence
    shards need it: explicit position ids, `shift_labels`, no padding mask, a length that is a
    multiple of 2 x cp_size; see the module docstring. A new dict: `batch` is not changed."""
    ids = batch.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise _refuse(
            "each batch needs `input_ids` of shape (batch, sequence) to split along the sequence; "
            f"this one has {sorted(batch)}"
        )
    rows, length = ids.shape
    out = dict(batch)
    for key, value in out.items():
        per_token = (
            isinstance(value, torch.Tensor) and value.dim() >= 2 and tuple(value.shape[:2]) == (rows, length)
        )
        if per_token and key not in SPLIT:
            raise _refuse(
                f"the batch's {key!r} has one entry per token, and only {list(SPLIT)} are split along "
                "the sequence; remove it from the batch (the collator or remove_unused_columns)"
            )
    out["shift_labels"] = _shift_labels(out, rows, length)
    out["position_ids"] = _positions(out.get("position_ids"), rows, length, ids.device)
    _check_padding(out.pop("attention_mask", None), out["shift_labels"])
    out["attention_mask"] = torch.ones_like(ids)
    extra = -length % (2 * cp_size)
    if extra:
        out = _pad_end(out, extra)
    return out


def _shift_labels(batch: Mapping[str, Any], rows: int, length: int) -> torch.Tensor:
    """The targets of each position, made before the split (a shard's last position's target is the
    next shard's first label): the batch's own `shift_labels`, else its labels moved one left."""
    given = batch.get("shift_labels")
    labels = batch.get("labels") if given is None else given
    name = "labels" if given is None else "shift_labels"
    if not isinstance(labels, torch.Tensor):
        raise _refuse(
            "the batch has no `labels`: a causal LM's next-token loss is what context parallelism splits"
        )
    if tuple(labels.shape) != (rows, length):
        raise _refuse(
            f"the batch's {name} have shape {tuple(labels.shape)}, not input_ids' {(rows, length)}: "
            "one label per token is split with the tokens"
        )
    if given is not None:
        return given
    return F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)


def _positions(positions: Any, rows: int, length: int, device: torch.device) -> torch.Tensor:
    """Explicit position ids, one row per sequence; positions that do not advance by one are refused."""
    if positions is None:
        return torch.arange(length, device=device).expand(rows, length).clone()
    positions = torch.as_tensor(positions, device=device).expand(rows, length)
    if length > 1 and not bool((positions.diff(dim=1) == 1).all()):
        raise _refuse(
            "the batch's position_ids restart or jump inside a row (packed sequences, e.g. padding_free or "
            "DataCollatorWithFlattening): ring attention has no per-sequence mask; give one sequence per row"
        )
    return positions.clone()


def _check_padding(mask: Any, shift_labels: torch.Tensor) -> None:
    """A padding mask can be dropped when it only pads at the end of each row (causal attention keeps
    the real tokens from the padding) and no padding position has a target."""
    if mask is None:
        return
    mask = torch.as_tensor(mask, device=shift_labels.device)
    if mask.dim() != 2 or mask.shape != shift_labels.shape:
        raise _refuse(
            f"attention_mask of shape {tuple(mask.shape)}: only a (batch, sequence) padding mask is taken"
        )
    real = mask != 0
    if not bool((real[:, 1:] <= real[:, :-1]).all()):
        raise _refuse(
            "the attention_mask pads at the start of a row or leaves holes (left padding): ring attention takes no "
            "mask, so only padding at the end of a row is exact; pad on the right (tokenizer.padding_side='right')"
        )
    if bool((shift_labels[~real] != IGNORE_INDEX).any()):
        raise _refuse(
            "some padding positions (attention_mask 0) have a label target: set their labels to -100 "
            "(DataCollatorForLanguageModeling does), the padding mask is dropped under context parallelism"
        )


def _pad_end(batch: dict[str, Any], extra: int) -> dict[str, Any]:
    """`extra` positions after each row: no target, and no real token attends to them (causal)."""
    out = dict(batch)
    for key in SPLIT:
        value = out.get(key)
        if not isinstance(value, torch.Tensor):
            continue
        if key == "position_ids":
            tail = value[:, -1:] + torch.arange(1, extra + 1, dtype=value.dtype, device=value.device)
            out[key] = torch.cat([value, tail], dim=1)
        else:
            out[key] = F.pad(value, (0, extra), value=_PAD[key])
    return out


# ---------------------------------------------------------------------------------- the model
def check_model(model: nn.Module) -> None:
    """Refuse, by name, a model that ring attention can't run exactly (see the module docstring)."""
    name = type(model).__name__
    config = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation != "sdpa":
        raise _refuse(
            f"{name} computes attention with {implementation!r}; ring attention replaces PyTorch's SDPA only: "
            'load the model with attn_implementation="sdpa" (or set model.config._attn_implementation = "sdpa")'
        )
    if not is_causal_lm(model):
        raise _refuse(
            f"{name} is not a causal LM: the split relies on causal attention and next-token labels"
        )
    get_text = getattr(config, "get_text_config", None)
    text = get_text() if callable(get_text) else config
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None:
        other = sorted({t for t in layer_types if t != "full_attention"})
    else:
        other = ["sliding_attention"] if getattr(text, "sliding_window", None) else []
    if other:
        raise _refuse(
            f"{name} has attention layers of type {other} (config.layer_types / config.sliding_window); ring "
            "attention computes full causal attention only: use a model with full attention in every layer "
            "(or, where every sequence is shorter than the window, set config.sliding_window=None)"
        )
    if getattr(text, "output_router_logits", False):
        raise _refuse(
            f"{name} adds a router load-balancing loss (output_router_logits=True), which each process would "
            "compute over its shard of the tokens only: set config.output_router_logits=False"
        )
    if model_accepts_loss_kwargs(model) is False:
        raise _refuse(
            f"{name}'s loss does not take num_items_in_batch (accepts_loss_kwargs=False): a shard's loss must be "
            "the sum over its targets divided by the step's targets (a shard may hold none, and a mean over none "
            "is NaN); use a model whose loss divides by num_items_in_batch (transformers' causal LMs do)"
        )


def check_loss_function(compute_loss_func: Any) -> None:
    """A Trainer's `compute_loss_func` gets a shard's labels, unshifted: refused (see `prepare`)."""
    if compute_loss_func is not None:
        raise _refuse(
            "compute_loss_func gets the labels of a sequence shard and would shift them itself (a shard's last "
            "position's target is in the next shard); remove it and let the causal LM compute its loss "
            "(it takes the pre-shifted `shift_labels` each shard is given)"
        )


def refuse_mean_loss(model_name: str) -> ValueError:
    """A model found (measured) to ignore `num_items_in_batch`: its mean over a shard without targets is NaN."""
    return _refuse(
        f"{model_name} ignores num_items_in_batch (measured on the first batch): its loss is a mean over a "
        "shard's targets, and a shard may hold none (NaN); use a model whose loss divides by num_items_in_batch "
        "(transformers' causal LMs do)"
    )


# ---------------------------------------------------------------------------------- the CUDA path
@contextlib.contextmanager
def split(
    batch: Mapping[str, Any], cp_mesh: Any, rotate_method: str, device: torch.device
) -> Iterator[dict[str, Any]]:
    """This process's shard of `batch` (prepared, on `device`) while torch's ring attention replaces
    SDPA; the forward and the backward run inside. Every process of `cp_mesh` enters it together."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    prepared = prepare(batch, cp_mesh.size())
    # torch shards the buffers in place: copies on the device, never the caller's tensors
    local = {k: v.to(device, copy=True) if isinstance(v, torch.Tensor) else v for k, v in prepared.items()}
    buffers = [local[k] for k in SPLIT if isinstance(local.get(k), torch.Tensor)]
    set_rotate_method(rotate_method)
    with context_parallel(
        cp_mesh, buffers=buffers, buffer_seq_dims=[1] * len(buffers), no_restore_buffers=set(buffers)
    ):
        yield local


@contextlib.contextmanager
def micro_batch(
    batch: Any,
    cp_mesh: Any,
    rotate_method: str,
    device: torch.device,
    inner: contextlib.AbstractContextManager,
) -> Iterator[dict[str, Any]]:
    """The training loop's micro-batch context under context parallelism: `inner` (the engine's own,
    gradient sync) around `split`; it yields this process's shard of `batch`, which the loop's
    training step trains on (the loop's batch itself is left as it is)."""
    if not isinstance(batch, Mapping):
        raise _refuse(
            f"the training batches are {type(batch).__name__}, not a dict of tensors: context parallelism "
            "splits the input_ids and labels of a dict batch (the collator's output) along the sequence"
        )
    with inner, split(batch, cp_mesh, rotate_method, device) as local:
        yield local
