"""A `transformers.TrainingArguments` handed to trainwright's Trainer: converted field by field, or
refused with the way out.

trainwright's arguments have every field of transformers' (v4 and v5 names), with the same meaning,
so transformers' own classes convert one for one (`Seq2SeqTrainingArguments` to trainwright's), and
the converted arguments are validated as if built here. A subclass with fields of its own (TRL's
`SFTConfig`, `DPOConfig`, ...) belongs to a trainer built on transformers' Trainer: its extra fields
mean something only to that trainer, so it is refused, naming the class and the fix (run the library
on trainwright with `patch_transformers()` or `trainwright run`).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from trainwright.args.training_args import Seq2SeqTrainingArguments, TrainingArguments


def _transformers_classes() -> tuple[type, type] | None:
    transformers = sys.modules.get("transformers")
    if transformers is None:
        return None
    training_args = sys.modules.get("transformers.training_args")
    seq2seq = sys.modules.get("transformers.training_args_seq2seq")
    base = getattr(training_args, "_transformers_TrainingArguments", None) or getattr(
        training_args, "TrainingArguments", None
    )
    s2s = getattr(seq2seq, "_transformers_Seq2SeqTrainingArguments", None) or getattr(
        seq2seq, "Seq2SeqTrainingArguments", None
    )
    if not isinstance(base, type) or issubclass(base, TrainingArguments):
        return None
    return base, s2s if isinstance(s2s, type) else base


def _init_fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if f.init}


def coerce(args: Any) -> TrainingArguments:
    """`args` as trainwright's arguments: itself, a conversion of transformers' own class, or an error
    naming what it is and what to do."""
    if isinstance(args, TrainingArguments):
        return args
    classes = _transformers_classes()
    if classes is None or not isinstance(args, classes[0]):
        raise TypeError(
            f"Trainer(args=...) takes trainwright.TrainingArguments (or transformers'), got {type(args).__name__}."
        )
    base, seq2seq = classes
    own = seq2seq if isinstance(args, seq2seq) else base
    target = Seq2SeqTrainingArguments if own is seq2seq and own is not base else TrainingArguments
    extra = sorted(_init_fields(type(args)) - _init_fields(own))
    if extra:
        raise TypeError(
            f"Trainer(args={type(args).__name__}(...)): {type(args).__module__}.{type(args).__name__} adds "
            f"{', '.join(extra[:6])}{' ...' if len(extra) > 6 else ''} to transformers' TrainingArguments, "
            f"settings of the trainer it belongs to, which trainwright.Trainer would ignore. Run that trainer "
            "on trainwright instead: call trainwright.patch_transformers() before importing its library, or "
            "run the script with `trainwright run SCRIPT.py`."
        )
    fields = _init_fields(target)
    unknown = sorted(_init_fields(own) - fields)
    if unknown:  # a newer transformers than trainwright knows
        raise TypeError(
            f"transformers' TrainingArguments has fields trainwright does not know: {unknown}; build "
            "trainwright.TrainingArguments instead."
        )
    values = {name: getattr(args, name) for name in _init_fields(own)}
    return target(**{k: getattr(v, "value", v) if _is_enum(v) else v for k, v in values.items()})


def _is_enum(value: Any) -> bool:
    import enum

    return isinstance(value, enum.Enum)
