"""The vocabulary of `TrainingArguments` validation: allowed values of choice fields, and the small
checks that name the field and what was expected (`invalid`, `choice`, `check_int`, `one_of`)."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import numbers
import os
import typing
from collections.abc import Hashable
from enum import Enum
from typing import Any, cast

from trainwright.core.files import JSONFileError, read_json_object

LOG_LEVELS = {
    "detail": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "passive": -1,
}
SAMPLING_STRATEGIES = ["random", "sequential", "group_by_length"]
TOKENS_SEEN = ["no", "all", "non_padding"]
METRIC_INPUTS = ["inputs", "loss"]
HALF_PRECISION_BACKENDS = ["auto", "apex", "cpu_amp"]
DDP_BACKENDS = ["nccl", "gloo", "mpi", "xccl", "hccl", "cncl", "mccl", "ccl"]
MP_CONTEXTS = ["fork", "spawn", "forkserver"]
# Fields that hold a dict, given as a dict, a JSON object string (or an object with to_dict()).
DICT_FIELDS = (
    "lr_scheduler_kwargs",
    "fsdp_config",
    "deepspeed",
    "accelerator_config",
    "gradient_checkpointing_kwargs",
    "activation_checkpointing_kwargs",
    "liger_kernel_config",
)
DEFAULT_PREEMPTION_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")
# Dict fields where a string that is not JSON names a file: read here, or (deepspeed) kept as a path.
DICT_FILE_FIELDS = ("fsdp_config", "accelerator_config", "deepspeed")


def is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_finite(value: Any) -> bool:
    return is_number(value) and math.isfinite(value)


def is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def words(value: Any) -> list[Any]:
    """Split "a b,c" or ["a b", "c"] into words; enum members and non-strings pass through."""
    items = [value] if isinstance(value, str) else list(value or [])
    found: list[Any] = []
    for item in items:
        is_plain_str = isinstance(item, str) and not isinstance(item, Enum)
        found.extend(item.replace(",", " ").split() if is_plain_str else [item])
    return found


def invalid(args: Any, name: str, expected: str, value: Any = dataclasses.MISSING) -> ValueError:
    """The error for field `name` of `args`: its value and what was expected (for a number field given
    a number as a string, that it is a string and the number to give instead)."""
    shown = getattr(args, name) if value is dataclasses.MISSING else value
    number = _number_in_string(args, name, shown)
    if number is not None:
        expected = f"it is a string, not a number: give the number, {name}={number!r}"
    return ValueError(f"{type(args).__name__}: {name}={shown!r} is invalid: {expected}")


def _number_in_string(args: Any, name: str, value: Any) -> int | float | None:
    """The number `value` spells when it is a string given to an int or float field, else None."""
    if not isinstance(value, str) or not dataclasses.is_dataclass(args):
        return None
    field = next((f for f in dataclasses.fields(args) if f.name == name), None)
    kinds = set(typing.get_args(field.type) or (field.type,)) - {type(None)} if field is not None else set()
    if not kinds or not kinds <= {int, float}:
        return None
    for kind in (int, float) if float in kinds else (int,):
        try:
            return kind(value.strip())
        except ValueError:
            continue
    return None


def choice(args: Any, name: str, enum_cls: type[Enum], value: Any = dataclasses.MISSING) -> Any:
    """`value` (default: the field's) as a member of `enum_cls`, or the error listing the choices."""
    value = getattr(args, name) if value is dataclasses.MISSING else value
    try:
        return enum_cls(value)
    except ValueError:
        raise invalid(args, name, f"choose one of {[m.value for m in enum_cls]}", value) from None


def check_int(args: Any, name: str, minimum: int, optional: bool = False) -> None:
    value = getattr(args, name)
    if optional and value is None:
        return
    if not is_int(value) or value < minimum:
        raise invalid(args, name, f"expected {'None or ' if optional else ''}an integer >= {minimum}")


def one_of(args: Any, name: str, allowed: list[str], optional: bool = False) -> None:
    value = getattr(args, name)
    if optional and value is None:
        return
    if value not in allowed:
        raise invalid(args, name, f"choose one of {allowed}")


def dict_from_string(args: Any, name: str, text: str) -> dict[str, Any] | str:
    """A dict field given as text: a JSON object, or (for `DICT_FILE_FIELDS`) a JSON file's path."""
    if text.strip().startswith("{"):
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as e:
            raise invalid(args, name, f"not valid JSON ({e.msg} at position {e.pos})") from None
        if not isinstance(parsed, dict):
            raise invalid(args, name, "expected a JSON object")
        return parsed
    if name not in DICT_FILE_FIELDS:
        raise invalid(args, name, "expected a dict or a JSON object string starting with '{'")
    path = os.path.expanduser(text)
    if not os.path.isfile(path):
        raise invalid(
            args, name, f"expected a dict, a JSON object string or an existing JSON file; {path} not found"
        )
    if name == "deepspeed":
        return path  # DeepSpeed reads its own config file
    try:
        return read_json_object(path)
    except JSONFileError as e:
        raise invalid(args, name, str(e)) from None


@functools.cache
def _declared_by_trainwright(cls: Any, name: str) -> bool:
    for klass in cls.__mro__:
        if name in klass.__dict__.get("__annotations__", {}):
            return klass.__module__.startswith("trainwright.")
    return False


def feature(args: Any, name: str) -> bool:
    """Whether trainwright's own feature `name` (padding_free, fused_linear_cross_entropy,
    lean_activations) is on: its field set, and the field trainwright's. A library's subclass of the
    arguments that declares a field of the same name owns it (TRL's SFT and DPO configs have their
    own `padding_free`, which their collators honour): trainwright's feature then stays off."""
    return bool(getattr(args, name, False)) and _declared_by_trainwright(cast(Hashable, type(args)), name)
