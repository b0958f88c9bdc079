"""`padding_free`: each batch's samples flattened into one row, without padding.

The row is transformers' packed-sequence format (what `DataCollatorWithFlattening` makes):
``input_ids`` and ``labels`` of shape ``(1, total tokens)``, ``position_ids`` restarting at 0 for each
sample, no ``attention_mask``. transformers' models read the restarts: SDPA and eager attention get a
block-diagonal causal mask (``masking_utils.find_packed_sequence_indices``), flash attention its
variable-length kernel (from ``cu_seq_lens_*`` when given, else from the positions), so no token
attends across samples. Each sample's first label is -100: with the labels shifted by one for a
causal LM, the last token of a sample never predicts the first of the next.

A batch still holds the sampler's ``per_device_*_batch_size`` samples, in the sampler's order: the row
is a pure function of them, so the batch geometry (samples per step), an exact resume at any step and
the token-weighted accumulation are those of the padded batches, while the tokens computed, counted
(``num_input_tokens_seen``, tokens/s, FLOPs) and backpropagated are the real ones.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from trainwright.args.checks import feature
from trainwright.core.modules import unwrap_model
from trainwright.data.collators import PaddingCollator, _pad_sequences, default_data_collator
from trainwright.data.columns import forward_arg_names
from trainwright.data.kinds import IGNORE_INDEX

logger = logging.getLogger(__name__)

# keys a token-level sample may carry besides input_ids / labels (flattened with them)
_PER_TOKEN = ("token_type_ids",)
_DROPPED = ("attention_mask", "special_tokens_mask", "length", "position_ids")


def _as_list(value: Any, key: str, index: int) -> list[int]:
    integral = None  # known from a tensor's or array's dtype; a list is looked at value by value
    if isinstance(value, torch.Tensor):
        integral = not (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool)
        value = value.tolist()
    elif isinstance(value, np.ndarray):
        integral = value.dtype.kind in "iu"
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or (value and isinstance(value[0], (list, tuple))):
        raise ValueError(
            f"padding_free: sample {index}'s {key!r} is not one sequence of ids ({type(value).__name__}); "
            "each sample must hold one unpadded sequence."
        )
    if integral is None:
        integral = all(type(v) is int or isinstance(v, np.integer) for v in value)
    if not integral:  # torch.long would turn 3.7 into 3 silently
        wrong = next((v for v in value if type(v) is not int and not isinstance(v, np.integer)), value[:1])
        raise ValueError(
            f"padding_free: sample {index}'s {key!r} holds {wrong!r} ({type(wrong).__name__}), not an integer "
            "id; token ids and labels are integers."
        )
    return list(value)


class PaddingFreeCollator:
    """Flattens a list of samples (mappings with ``input_ids``, optionally ``labels``) into one row.

    ``labels`` default to the ids; a sample's first label becomes ``separator_id``; ids in
    ``ignore_label_ids`` get label -100 where the labels come from the ids (a pad token, as
    `DataCollatorForLanguageModeling` does). A sample's ``attention_mask`` zeros are padding and are
    dropped with their tokens. ``flash_attn_kwargs`` adds ``cu_seq_lens_q/k`` and ``max_length_q/k``
    for flash attention's variable-length kernel.
    """

    def __init__(
        self,
        *,
        separator_id: int = IGNORE_INDEX,
        ignore_label_ids: Sequence[int] = (),
        flash_attn_kwargs: bool = False,
    ) -> None:
        self.separator_id = separator_id
        self.ignore_label_ids = frozenset(int(i) for i in ignore_label_ids)
        self.flash_attn_kwargs = flash_attn_kwargs

    def _sample(self, feature: Any, index: int) -> dict[str, list[int]]:
        if not isinstance(feature, Mapping) or "input_ids" not in feature:
            raise ValueError(
                f"padding_free: sample {index} is a {type(feature).__name__} without 'input_ids'; "
                "padding-free batches are made of tokenized sequences."
            )
        unknown = sorted(set(feature) - {"input_ids", "labels", *_PER_TOKEN, *_DROPPED})
        if unknown:
            raise ValueError(
                f"padding_free: sample {index} has keys {unknown} that cannot be flattened into one row "
                "(only input_ids, labels, token_type_ids); remove them or set padding_free=False."
            )
        ids = _as_list(feature["input_ids"], "input_ids", index)
        out = {"input_ids": ids}
        if feature.get("labels") is not None:
            out["labels"] = _as_list(feature["labels"], "labels", index)
        else:
            out["labels"] = [IGNORE_INDEX if i in self.ignore_label_ids else i for i in ids]
        for key in _PER_TOKEN:
            if feature.get(key) is not None:
                out[key] = _as_list(feature[key], key, index)
        for key, seq in out.items():
            if len(seq) != len(ids):
                raise ValueError(
                    f"padding_free: sample {index}'s {key!r} has {len(seq)} entries for {len(ids)} input_ids."
                )
        mask = feature.get("attention_mask")
        if mask is not None:
            keep = _as_list(mask, "attention_mask", index)
            if len(keep) != len(ids):
                raise ValueError(
                    f"padding_free: sample {index}'s attention_mask does not match its input_ids."
                )
            if not all(keep):  # a padded sample: its padding goes
                out = {k: [v for v, m in zip(seq, keep, strict=True) if m] for k, seq in out.items()}
        if not out["input_ids"]:
            raise ValueError(f"padding_free: sample {index} has no tokens.")
        return out

    def __call__(self, features: Sequence[Any]) -> dict[str, Any]:
        if not features:
            raise ValueError("padding_free: got an empty batch.")
        samples = [self._sample(f, i) for i, f in enumerate(features)]
        keys = set(samples[0])
        if any(set(s) != keys for s in samples):
            raise ValueError("padding_free: the samples of one batch carry different keys.")
        row: dict[str, list[int]] = {k: [] for k in keys}
        row["position_ids"] = []
        lengths = []
        for sample in samples:
            n = len(sample["input_ids"])
            lengths.append(n)
            for key in keys:
                row[key] += sample[key]
            row["labels"][-n] = self.separator_id  # the sample's first label: never a target
            row["position_ids"] += range(n)
        batch: dict[str, Any] = {k: torch.tensor([v], dtype=torch.long) for k, v in row.items()}
        if self.flash_attn_kwargs:
            cu = torch.tensor(np.cumsum([0, *lengths]), dtype=torch.int32)
            batch["cu_seq_lens_q"] = batch["cu_seq_lens_k"] = cu
            batch["max_length_q"] = batch["max_length_k"] = max(lengths)
        return batch


def _is_flattening(collator: Any) -> bool:
    return (
        isinstance(collator, PaddingFreeCollator) or type(collator).__name__ == "DataCollatorWithFlattening"
    )


def _padding_collator_labels(collator: Any) -> tuple[int, ...] | None:
    """For a collator that only pads (its padding-free equivalent is flattening): the label ids it
    masks; None for any other collator."""
    name = type(collator).__name__
    if collator is default_data_collator or isinstance(collator, PaddingCollator):
        return ()
    if getattr(collator, "func", None) is _pad_sequences:  # pad_sequence_collator()
        return ()
    if type(collator).__module__.startswith("transformers."):
        if name in ("DataCollatorWithPadding", "DataCollatorForSeq2Seq", "DefaultDataCollator"):
            return ()
        if name == "DataCollatorForLanguageModeling" and not getattr(collator, "mlm", True):
            pad = getattr(getattr(collator, "tokenizer", None), "pad_token_id", None)
            return (pad,) if pad is not None else ()
    if getattr(collator, "__module__", "").startswith("transformers.") and name == "default_data_collator":
        return ()
    return None


def padding_free_collator(collator: Callable, flash_attention: bool = False) -> Callable:
    """The collator a `padding_free=True` run uses in place of `collator`.

    A flattening collator (`PaddingFreeCollator`, transformers' `DataCollatorWithFlattening`) is kept;
    one that only pads (trainwright's defaults, `DataCollatorWithPadding`, `DataCollatorForSeq2Seq`,
    `DataCollatorForLanguageModeling(mlm=False)`) is replaced by `PaddingFreeCollator` with the same
    labels; any other is refused, naming it (it would be bypassed).
    """
    if _is_flattening(collator):
        return collator
    ignored = _padding_collator_labels(collator)
    if ignored is None:
        raise ValueError(
            f"padding_free=True flattens each batch into one row, and the data collator "
            f"{type(collator).__name__} does more than pad (it would be bypassed). Pass no data_collator "
            "(or DataCollatorWithFlattening / trainwright.data.PaddingFreeCollator), or set padding_free=False."
        )
    logger.info(
        "padding_free=True: batches are flattened into one row instead of %s.", type(collator).__name__
    )
    return PaddingFreeCollator(ignore_label_ids=ignored, flash_attn_kwargs=flash_attention)


def run_collator(args: Any, collator: Callable, model: Any) -> Callable:
    """The collator of a run: `collator`, or with `padding_free` its padding-free replacement (see
    :func:`padding_free_collator`); an encoder-decoder model is refused (its decoder inputs are
    made per sample from the labels)."""
    if not feature(args, "padding_free"):
        return collator
    config = getattr(unwrap_model(model), "config", None)
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(
            f"padding_free=True: {type(unwrap_model(model)).__name__} is an encoder-decoder model, whose "
            "encoder and decoder sequences cannot share one packed row. Set padding_free=False."
        )
    forward = getattr(unwrap_model(model), "forward", None)
    if forward is not None and "position_ids" not in forward_arg_names(model):
        params = inspect.signature(forward).parameters.values()
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            raise ValueError(
                f"padding_free=True: {type(unwrap_model(model)).__name__}'s forward takes no position_ids, "
                "which is how a packed row tells its samples apart. Set padding_free=False."
            )
    attention = str(getattr(config, "_attn_implementation", None) or "")
    return padding_free_collator(collator, flash_attention=attention.startswith("flash_attention"))


def take_samples(batch: Mapping[str, Any], keep: int) -> dict[str, Any] | None:
    """The first `keep` samples of a padding-free row (one row of `position_ids` restarting at 0, no
    attention mask): every per-token tensor cut where sample `keep` starts, `cu_seq_lens_*` cut to
    match. None when `batch` is not such a row."""
    positions = batch.get("position_ids")
    if "attention_mask" in batch or not isinstance(positions, torch.Tensor) or positions.dim() != 2:
        return None
    if positions.shape[0] != 1:
        return None
    starts = (positions[0] == 0).nonzero().flatten().tolist()
    length = positions.shape[1]
    cut = starts[keep] if keep < len(starts) else length
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if key.startswith("cu_seq_lens_") and isinstance(value, torch.Tensor):
            value = value[: keep + 1]
        elif isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[:2] == (1, length):
            value = value[:, :cut]
        out[key] = value
    return out
