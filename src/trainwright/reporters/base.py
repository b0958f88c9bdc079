"""What every reporter shares: the `Reporter` base class (rank gating, lazy set-up, and the rule that
a failing reporter disables itself instead of stopping training), `rewrite_logs`, and small helpers
for environment variables, numbers, model configs and checkpoint folders."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import logging
import numbers
import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from ..events import EVENTS, TrainerCallback

logger = logging.getLogger(__name__)

TRUE_VALUES = frozenset({"1", "true", "yes", "on", "y"})
FALSE_VALUES = frozenset({"0", "false", "no", "off", "n", ""})

# Keys of the end-of-training summary row: services that have a notion of "one value per run"
# (W&B summary, ClearML single values) get these there instead of in the step history.
SUMMARY_KEYS = frozenset(
    {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "total_flos"}
)


class MissingReporterPackageError(ImportError):
    """A reporter was asked for but the package it talks to is not installed."""


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
def unwrap_model(model: Any) -> Any:
    """The user's module behind DDP/DataParallel and torch.compile wrappers."""
    while model is not None:
        cls = type(model).__name__
        if cls in ("DistributedDataParallel", "DataParallel") and hasattr(model, "module"):
            model = model.module
        elif cls == "OptimizedModule" and hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model
    return model


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
        from ..third_party import deepspeed_left_unimported

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


# -- the base class ------------------------------------------------------------------------------
def _guard(event: str, method: Callable) -> Callable:
    """Wrap one event: skip when disabled or not on the reporting process; turn an exception in
    the outermost call into one warning plus `disable()`, so training goes on without the reporter."""

    @functools.wraps(method)
    def guarded(self: Reporter, *args: Any, **kwargs: Any) -> Any:
        if self.disabled:
            return None
        if self._event_depth:  # a subclass calling super(): the outer call handles failures
            return method(self, *args, **kwargs)
        state = args[1] if len(args) > 1 else kwargs.get("state")
        if state is not None and not self._is_reporting_process(state):
            return None
        self._event_depth += 1
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            logger.debug("%s failed in %s", type(self).__name__, event, exc_info=True)
            self._fail(event, exc)
            return None
        finally:
            self._event_depth -= 1

    guarded._reporter_guarded = True  # type: ignore[attr-defined]
    return guarded


class Reporter(TrainerCallback):
    """Base class of the reporting integrations.

    Subclasses set the class attributes below and override events as usual. Every event a subclass
    defines is wrapped once (at class creation): it runs only on the reporting process (world rank 0,
    or each node's local rank 0 when `process_zero = "local"`), does nothing once the reporter is
    disabled, and an exception inside it is logged as one warning, `close_after_failure()` is
    attempted, and the reporter disables itself so that training continues.
    """

    name: ClassVar[str] = ""  # the report_to name
    requires: ClassVar[tuple[str, ...]] = ()  # import names of the packages the reporter talks to
    pip_name: ClassVar[str] = ""  # what to pip install
    extra: ClassVar[str | None] = None  # trainwright extra that installs it, if there is one
    process_zero: ClassVar[str] = "world"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for event in EVENTS:
            method = cls.__dict__.get(event)
            if method is not None and not getattr(method, "_reporter_guarded", False):
                setattr(cls, event, _guard(event, method))

    def __init__(self) -> None:
        type(self).require()
        self.disabled = False
        self._event_depth = 0
        self._dropped_keys: set[str] = set()

    # -- availability (used by the registry) -------------------------------------------------
    @classmethod
    def missing_packages(cls) -> list[str]:
        """Import names in `requires` that cannot be found."""
        missing = []
        for module in cls.requires:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):  # a parent package that is absent or broken
                found = False
            if not found:
                missing.append(module)
        return missing

    @classmethod
    def install_hint(cls) -> str:
        hint = f"pip install {cls.pip_name}"
        if cls.extra:
            hint = f"pip install 'trainwright[{cls.extra}]' or {hint}"
        return hint

    @classmethod
    def require(cls) -> None:
        """Raise MissingReporterPackageError naming what to install if a package is missing."""
        missing = cls.missing_packages()
        if missing:
            raise MissingReporterPackageError(
                f"report_to={cls.name!r} needs the {', '.join(missing)} package: {cls.install_hint()}"
            )

    @classmethod
    def skip_reason(cls) -> str | None:
        """Why `report_to="all"` should leave this reporter out (it would need credentials or an
        environment it does not have), or None when it can run unattended."""
        return None

    # -- state ------------------------------------------------------------------------------
    def _is_reporting_process(self, state: Any) -> bool:
        attr = "is_local_process_zero" if self.process_zero == "local" else "is_world_process_zero"
        return bool(getattr(state, attr, True))

    def disable(self, reason: str, level: int = logging.WARNING) -> None:
        """Stop reporting for the rest of the run, saying why once."""
        if not self.disabled:
            logger.log(level, "The %s reporter is disabled: %s", self.name or type(self).__name__, reason)
        self.disabled = True

    def _fail(self, event: str, exc: BaseException) -> None:
        self.disable(
            f"it failed in {event} ({type(exc).__name__}: {exc}); training continues without it",
            logging.WARNING,
        )
        try:
            self.close_after_failure()
        except Exception:  # the service is likely what failed; nothing more to say
            logger.debug("%s: cleanup after failure failed too", type(self).__name__, exc_info=True)

    def close_after_failure(self) -> None:
        """Release what the reporter holds after it failed (override where there is something)."""

    def split_logs(self, logs: Mapping[str, Any]) -> tuple[dict[str, int | float], dict[str, str]]:
        """Numbers and strings of `logs`; anything else is dropped with one warning per key."""
        scalars: dict[str, int | float] = {}
        texts: dict[str, str] = {}
        for key, value in logs.items():
            number = as_scalar(value)
            if number is not None:
                scalars[key] = number
            elif isinstance(value, str):
                texts[key] = value
            else:
                self.drop_once(key, value)
        return scalars, texts

    def drop_once(self, key: str, value: Any) -> None:
        """Warn (once per key) that a logged value cannot be sent to this service."""
        if key not in self._dropped_keys:
            self._dropped_keys.add(key)
            logger.warning(
                "The %s reporter cannot log %r (a %s); it is dropped (warned once per key).",
                self.name,
                key,
                type(value).__name__,
            )
