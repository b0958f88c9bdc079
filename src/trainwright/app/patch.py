"""`patch_transformers()`: transformers' Trainer family becomes trainwright's, for the libraries and
scripts imported afterwards.

Libraries built on the Trainer (TRL, a user's own package) subclass `transformers.Trainer` and
`transformers.TrainingArguments` when they are imported, so the classes must be replaced before
that: in the package itself (`transformers.Trainer`, lazily resolved) and in every transformers
module that holds them (`transformers.trainer.Trainer` is what `import transformers.trainer` code
reads). `HfArgumentParser` is replaced too: transformers' parser cannot read trainwright's argument
dataclasses (a field typed `str | bool | None` is not callable).

Called after such a library already bound transformers' classes, the patch could not reach it: the
library would train on transformers without a word. So the patch looks first, and refuses naming
the modules and the fix (import them after the patch), changing nothing.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

# (transformers module that defines it, name): the classes the patch replaces
_REPLACED = (
    ("transformers.trainer", "Trainer"),
    ("transformers.training_args", "TrainingArguments"),
    ("transformers.trainer_seq2seq", "Seq2SeqTrainer"),
    ("transformers.training_args_seq2seq", "Seq2SeqTrainingArguments"),
    ("transformers.hf_argparser", "HfArgumentParser"),
)


class PatchTooLateError(RuntimeError):
    """Modules outside transformers already hold transformers' Trainer classes (imported before the patch)."""


def _ours() -> dict[str, Any]:
    from trainwright.args.parser import HfArgumentParser
    from trainwright.args.training_args import Seq2SeqTrainingArguments, TrainingArguments
    from trainwright.loop.seq2seq import Seq2SeqTrainer
    from trainwright.loop.trainer import Trainer

    return {
        "Trainer": Trainer,
        "TrainingArguments": TrainingArguments,
        "Seq2SeqTrainer": Seq2SeqTrainer,
        "Seq2SeqTrainingArguments": Seq2SeqTrainingArguments,
        "HfArgumentParser": HfArgumentParser,
    }


def _originals() -> dict[str, Any]:
    """transformers' own classes (from their defining modules, before or after a patch)."""
    found = {}
    for module_name, name in _REPLACED:
        module = importlib.import_module(module_name)
        found[name] = module.__dict__.get(f"_transformers_{name}", getattr(module, name))
    return found


def is_patched() -> bool:
    """Whether `transformers.trainer.Trainer` is trainwright's (importing transformers if needed)."""
    return importlib.import_module("transformers.trainer").Trainer is _ours()["Trainer"]


def _holders(originals: dict[str, Any]) -> dict[str, list[str]]:
    """{module: names} of the modules outside transformers and trainwright whose globals hold one of
    transformers' classes or a subclass of one defined there."""
    bases = tuple(originals.values())
    holders: dict[str, list[str]] = {}
    seen: set[int] = set()
    for module_name, module in list(sys.modules.items()):
        if not isinstance(module, ModuleType) or module_name.split(".")[0] in ("transformers", "trainwright"):
            continue
        if id(module) in seen:  # an alias (multiprocessing's __mp_main__ for __main__)
            continue
        seen.add(id(module))
        names = []
        for attr, value in list(vars(module).items()):
            # type(value), not isinstance: some module attributes warn when their class is asked for
            if any(value is base for base in bases) or (
                issubclass(type(value), type) and issubclass(value, bases) and value.__module__ == module_name
            ):
                names.append(attr)
        if names:
            holders[module_name] = sorted(names)
    return holders


def _too_late(holders: dict[str, list[str]]) -> PatchTooLateError:
    packages = sorted({name.split(".")[0] for name in holders})
    shown = "; ".join(f"{m}: {', '.join(n)}" for m, n in sorted(holders.items())[:6])
    more = f" (and {len(holders) - 6} more modules)" if len(holders) > 6 else ""
    return PatchTooLateError(
        f"trainwright.patch_transformers() came after {', '.join(packages)} took transformers' Trainer "
        f"classes ({shown}{more}); those would keep training on transformers. Call "
        f"trainwright.patch_transformers() before importing {', '.join(packages)} (first thing in the "
        "script), or run the script unchanged with `trainwright run SCRIPT.py`."
    )


def patch_transformers() -> None:
    """Make trainwright's `Trainer`, `TrainingArguments`, `Seq2SeqTrainer`, `Seq2SeqTrainingArguments`
    and `HfArgumentParser` the ones every transformers module exposes, so code imported afterwards
    (TRL, a script's `from transformers import Trainer`) runs on trainwright. Idempotent.

    Raises `PatchTooLateError`, changing nothing, when a module outside transformers already holds
    one of transformers' classes (it was imported first and would not be reached)."""
    originals = _originals()
    ours = _ours()
    holders = _holders(originals)
    if holders:
        raise _too_late(holders)
    for module_name, name in _REPLACED:  # the originals stay reachable for the check above
        importlib.import_module(module_name).__dict__.setdefault(f"_transformers_{name}", originals[name])
    for module in [
        m for n, m in list(sys.modules.items()) if n == "transformers" or n.startswith("transformers.")
    ]:
        if not isinstance(module, ModuleType):
            continue
        for name, original in originals.items():
            if module.__dict__.get(name) is original:
                setattr(module, name, ours[name])
    package = sys.modules["transformers"]
    for name, cls in ours.items():  # the lazily resolved package attributes
        setattr(package, name, cls)
