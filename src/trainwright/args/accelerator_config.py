"""`TrainingArguments.accelerator_config`: transformers' `AcceleratorConfig`, read by attribute or as a dict.

trainwright does not build an `accelerate.Accelerator`; each setting is either honoured by the
Trainer itself or refused when the arguments are built (`check`), with the reason:

- `non_blocking`: host-to-device copies of batches are `non_blocking` (warns without pinned memory).
- `gradient_accumulation_kwargs`: `num_steps` becomes `gradient_accumulation_steps` (an error when
  both are set and differ, as upstream); `sync_each_batch=True` all-reduces gradients on every
  micro-batch instead of only the last of each step.
- `split_batches`, `dispatch_batches`, `even_batches`, `use_seedable_sampler`: which process loads
  which batch, as accelerate defines them (`trainwright.data.distribute`).
- `use_configured_state=True`: the processes and device are those of an accelerate `PartialState`
  (or `Accelerator`) the script made before the arguments; without one, the arguments are refused
  as transformers refuses them (`process_state.check_configured_state`).
- `gradient_accumulation_kwargs` `adjust_scheduler` / `sync_with_dataloader`: accepted, with
  transformers' effect, none: its Trainer steps its scheduler itself, once per optimizer step, and
  decides itself where a step ends (the last, shorter step of an epoch updates the weights).

Given as a dict (or JSON), "true"/"false" strings of the True/False settings are read as booleans,
as transformers reads them from a command line's JSON.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["AcceleratorConfig"]

_GRAD_ACC_KEYS = ("num_steps", "adjust_scheduler", "sync_with_dataloader", "sync_each_batch")

_BOOL_KEYS = ("split_batches", "even_batches", "use_seedable_sampler", "non_blocking", "use_configured_state")


def _booleans(values: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """`values` with "true"/"false" strings (any case) of `keys` read as booleans."""
    out = dict(values)
    for key in keys:
        value = out.get(key)
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            out[key] = value.strip().lower() == "true"
    return out


@dataclass(eq=False)
class AcceleratorConfig(Mapping):
    """The settings of upstream's `AcceleratorConfig`; also a read-only mapping (`cfg["split_batches"]`)."""

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = True
    non_blocking: bool = False
    gradient_accumulation_kwargs: dict[str, Any] | None = None
    use_configured_state: bool = False

    # -- mapping view ------------------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        if key not in _NAMES:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_NAMES)

    def __len__(self) -> int:
        return len(_NAMES)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _NAMES}

    def __repr__(self) -> str:
        return f"AcceleratorConfig({', '.join(f'{k}={v!r}' for k, v in self.items())})"

    # -- validation ----------------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], owner: str) -> AcceleratorConfig:
        """Build from a dict; unknown keys, wrong types and refused values raise naming the key."""
        unknown = sorted(set(values) - set(_NAMES))
        if unknown:
            raise ValueError(f"{owner}: accelerator_config has unknown keys {unknown}; known: {list(_NAMES)}")
        values = _booleans(values, (*_BOOL_KEYS, "dispatch_batches"))
        kwargs = values.get("gradient_accumulation_kwargs")
        if isinstance(kwargs, Mapping):
            kwargs = _booleans(kwargs, ("adjust_scheduler", "sync_with_dataloader", "sync_each_batch"))
            steps = kwargs.get("num_steps")
            if isinstance(steps, str) and steps.strip().isdigit():
                kwargs["num_steps"] = int(steps)
            values = {**values, "gradient_accumulation_kwargs": kwargs}
        config = cls(**values)
        config.check(owner)
        return config

    def check(self, owner: str) -> None:
        def bad(key: str, why: str) -> ValueError:
            return ValueError(f"{owner}: accelerator_config[{key!r}]={self[key]!r} is invalid: {why}")

        for key in _BOOL_KEYS:
            if not isinstance(self[key], bool):
                raise bad(key, "expected True or False")
        if self.dispatch_batches is not None and not isinstance(self.dispatch_batches, bool):
            raise bad("dispatch_batches", "expected None, True or False")
        kwargs = self.gradient_accumulation_kwargs
        if kwargs is None:
            return
        if not isinstance(kwargs, Mapping):
            raise bad(
                "gradient_accumulation_kwargs", f"expected a dict with keys from {list(_GRAD_ACC_KEYS)}"
            )
        self.gradient_accumulation_kwargs = kwargs = dict(kwargs)
        unknown = sorted(set(kwargs) - set(_GRAD_ACC_KEYS))
        if unknown:
            raise bad(
                "gradient_accumulation_kwargs", f"unknown keys {unknown}; known: {list(_GRAD_ACC_KEYS)}"
            )
        steps = kwargs.get("num_steps")
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise bad("gradient_accumulation_kwargs", "num_steps must be an integer >= 1")
        for key in ("adjust_scheduler", "sync_with_dataloader", "sync_each_batch"):
            if key in kwargs and not isinstance(kwargs[key], bool):
                raise bad("gradient_accumulation_kwargs", f"{key} must be True or False")

    @property
    def sync_each_batch(self) -> bool:
        """`gradient_accumulation_kwargs["sync_each_batch"]`: all-reduce gradients on every micro-batch."""
        return bool((self.gradient_accumulation_kwargs or {}).get("sync_each_batch", False))


_NAMES = tuple(f.name for f in dataclasses.fields(AcceleratorConfig))
