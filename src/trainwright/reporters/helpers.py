"""Helpers the reporters share: environment variables read strictly, logged values as numbers,
dashboard key names (`rewrite_logs`), model configs and weights, the checkpoint just written."""

from __future__ import annotations

import dataclasses
import json
import numbers
import os
from collections.abc import Mapping
from typing import Any

from trainwright.core.modules import unwrap_model

TRUE_VALUES = frozenset({"1", "true", "yes", "on", "y"})
FALSE_VALUES = frozenset({"0", "false", "no", "off", "n", ""})

# Keys of the end-of-training summary row: services that have a notion of "one value per run"
# (W&B summary, ClearML single values) get these there instead of in the step history.
SUMMARY_KEYS = frozenset(
    {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "total_flos"}
)


# -- environment ---------------------------------------------------------------------------------
def env_flag(name: str, default: bool = False) -> bool:
    """Read a boolean environment variable; anything but a yes/no spelling is an error."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in TRUE_VALUES:
        return True
    if value in FALSE_VALUES:
        return False
    raise ValueError(f"environment variable {name}={raw!r}: expected one of true/false, 1/0, yes/no, on/off")


def env_choice(
    name: str, choices: tuple[str, ...], default: str, aliases: Mapping[str, str] | None = None
) -> str:
    """Read an environment variable that must be one of `choices` (case-insensitive)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    value = (aliases or {}).get(value, value)
    if value not in choices:
        allowed = ", ".join(choices + tuple(aliases or ()))
        raise ValueError(f"environment variable {name}={raw!r}: expected one of {allowed}")
    return value


def env_int(name: str, minimum: int = 0) -> int | None:
    """Read an optional integer environment variable (>= minimum)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r}: expected an integer") from None
    if value < minimum:
        raise ValueError(f"environment variable {name}={raw!r}: expected an integer >= {minimum}")
    return value


def env_json_dict(name: str) -> dict[str, Any]:
    """Read an environment variable holding a JSON object (empty dict when unset)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"environment variable {name}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"environment variable {name}: expected a JSON object, got {type(value).__name__}")
    return value


# -- values --------------------------------------------------------------------------------------
def as_scalar(value: Any) -> int | float | None:
    """The value as a Python int/float if it is one real number (bools count as 0/1), else None.
    Accepts numpy scalars and one-element tensors/arrays; reading a tensor syncs, which is fine at
    logging time."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    numel = getattr(value, "numel", None)
    if callable(numel):
        if numel() == 1 and not value.is_complex():
            return as_scalar(value.item())
        return None
    if getattr(value, "shape", None) == () and hasattr(value, "item"):
        return as_scalar(value.item())
    return None


def rewrite_logs(logs: Mapping[str, Any]) -> dict[str, Any]:
    """Group keys for dashboards: `eval_x` -> `eval/x`, `test_x` -> `test/x`, keys that already hold
    a `/` (e.g. the SpeedMonitor's `throughput/...`) unchanged, anything else -> `train/x`."""
    out: dict[str, Any] = {}
    for key, value in logs.items():
        if "/" in key:
            out[key] = value
        elif key.startswith("eval_"):
            out["eval/" + key[len("eval_") :]] = value
        elif key.startswith("test_"):
            out["test/" + key[len("test_") :]] = value
        else:
            out["train/" + key] = value
    return out


def flatten_dict(d: Mapping[str, Any], sep: str = ".", prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(flatten_dict(value, sep, name))
        else:
            out[name] = value
    return out


# -- models and checkpoints ----------------------------------------------------------------------
def model_config_dict(model: Any) -> dict[str, Any] | None:
    """The model's `config` as a dict (transformers configs, dataclasses, mappings), else None."""
    config = getattr(unwrap_model(model), "config", None)
    if config is None:
        return None
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if isinstance(config, Mapping):
        return dict(config)
    return None


def export_model(model: Any, directory: str) -> str:
    """Write the model's weights into `directory` (save_pretrained when the model has it, else one
    safetensors file that handles shared tensors) and return the directory."""
    model = unwrap_model(model)
    if model is None:
        raise ValueError("no model was passed to the event, so there is nothing to export")
    os.makedirs(directory, exist_ok=True)
    save_pretrained = getattr(model, "save_pretrained", None)
    if callable(save_pretrained):
        from trainwright.core.third_party import deepspeed_left_unimported

        with deepspeed_left_unimported():
            save_pretrained(directory)
    else:
        from safetensors.torch import save_model

        save_model(model, os.path.join(directory, "model.safetensors"))
    return directory


def saved_checkpoint_dir(args: Any, state: Any) -> str | None:
    """The folder the trainer has just written for `state.global_step`, or None if there is none.
    In a hyperparameter search the trainer puts trials under `output_dir/run-<trial>`."""
    name = f"checkpoint-{state.global_step}"
    candidates = [os.path.join(args.output_dir, name)]
    if getattr(state, "is_hyper_param_search", False) and getattr(state, "trial_name", None):
        trial = str(state.trial_name)
        candidates += [
            os.path.join(args.output_dir, trial, name),
            os.path.join(args.output_dir, f"run-{trial}", name),
        ]
    return next((c for c in candidates if os.path.isdir(c)), None)
