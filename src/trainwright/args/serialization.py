"""`TrainingArguments` as plain JSON values and back: `to_dict`, `from_dict`, JSON files, the
sanitized dict reporters log. Tokens are redacted on the way out and read back as None."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from enum import Enum
from typing import Any

import torch

from trainwright.args.aliases import REMOVED_V4_ARGS
from trainwright.core.files import read_json_object


def jsonable(value: Any) -> Any:
    """Turn enums, dtypes, paths, tuples and config objects into plain JSON values."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Mapping):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "to_dict") and callable(value.to_dict):
        return jsonable(value.to_dict())
    return value


def redacted(name: str) -> str:
    return f"<{name.upper()}>"


def to_dict(args: Any) -> dict[str, Any]:
    """Plain, JSON-ready values: enums as strings, dtypes as names, tokens redacted."""
    out = {}
    for f in dataclasses.fields(args):
        if not f.init:
            continue
        value = getattr(args, f.name)
        if f.name.endswith("_token") and value is not None:
            value = redacted(f.name)
        out[f.name] = jsonable(value)
    return out


def from_dict_kwargs(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """The constructor arguments of `cls` for `to_dict()` output; unknown keys are an error,
    redacted tokens become None."""
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - known - set(REMOVED_V4_ARGS))
    if unknown:
        raise ValueError(f"{cls.__name__}.from_dict: unknown keys {unknown}")
    return {
        k: (None if k.endswith("_token") and v == redacted(k) else v)
        for k, v in data.items()
        # a removed v4 argument at the value it was always written with (older training_args.json)
        if k in known or v != REMOVED_V4_ARGS[k][0]
    }


def read_json_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object of argument names to values in `path`, with the file named in errors."""
    return read_json_object(path)


def to_sanitized_dict(args: Any) -> dict[str, Any]:
    """`to_dict()` plus the batch sizes, with only int/float/str/bool/Tensor values (others as str)."""
    d = {
        **args.to_dict(),
        "train_batch_size": args.train_batch_size,
        "eval_batch_size": args.eval_batch_size,
    }
    plain = (bool, int, float, str)
    return {k: v if type(v) in plain or isinstance(v, torch.Tensor) else str(v) for k, v in d.items()}


def describe(args: Any) -> str:
    """`TrainingArguments(\\n  name=value,\\n ...)`: its `__str__` and `__repr__`."""
    body = "".join(f"  {k}={v!r},\n" for k, v in args.to_dict().items())
    return f"{type(args).__name__}(\n{body})"
