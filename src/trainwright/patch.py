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
the modules and the fix (import them after the patch), changing nothing. A class held where the
look does not reach (a registry dict, a list, a default argument) is caught when it is used: after
the patch, transformers' own Trainer, TrainingArguments and their Seq2Seq kinds (and every subclass
of them) refuse to be built, with the same error and fix. Nothing in transformers builds them once
patched (its modules' globals, which its own code reads, are trainwright's then); copies of an
object built before the patch still work (a copy does not call `__init__`).
"""

from __future__ import annotations

import importlib
import sys
from types import FrameType, ModuleType
from typing import Any

# (transformers module that defines it, name): the classes the patch replaces
_REPLACED = (
    ("transformers.trainer", "Trainer"),
    ("transformers.training_args", "TrainingArguments"),
    ("transformers.trainer_seq2seq", "Seq2SeqTrainer"),
    ("transformers.training_args_seq2seq", "Seq2SeqTrainingArguments"),
    ("transformers.hf_argparser", "HfArgumentParser"),
)


# transformers' classes that refuse to be built after the patch (HfArgumentParser stays usable: it
# trains nothing, and parses a user's own dataclasses as well as it did)
_REFUSED = ("Trainer", "TrainingArguments", "Seq2SeqTrainer", "Seq2SeqTrainingArguments")
# modules whose frames stand between the code building a refused class and the refusal
_PASSED = ("transformers", "dataclasses", "copy", __name__)


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


def _builder() -> str:
    """The module of the code building a refused class: the first frame up from the refusal outside
    transformers, dataclasses and this module."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if not any(name == p or name.startswith(p + ".") for p in _PASSED):
            return name
        frame = frame.f_back
    return "__main__"


def _built_too_late(cls: type, original: str) -> PatchTooLateError:
    builder = _builder()
    where = (
        "first thing in the script" if builder == "__main__" else f"before importing {builder.split('.')[0]}"
    )
    return PatchTooLateError(
        f"{cls.__module__}.{cls.__qualname__} is transformers' own {original} (or a subclass of it), built "
        f"by {builder} after trainwright.patch_transformers() replaced it: it was taken before the patch and "
        "kept where the patch cannot reach (a registry, a list, a default argument), and would train on "
        f"transformers. Call trainwright.patch_transformers() {where}, or run the script unchanged with "
        "`trainwright run SCRIPT.py`."
    )


def _refuse_to_build(originals: dict[str, Any]) -> None:
    """transformers' own classes (and so their subclasses) raise `PatchTooLateError` when built: their
    `__init__`, and the `__post_init__` that a dataclass subclass's own `__init__` calls."""
    for name in _REFUSED:
        cls = originals[name]
        for method in ("__init__", "__post_init__"):
            if method in vars(cls) and not getattr(vars(cls)[method], "_trainwright_refuses", False):
                setattr(cls, method, _refusal(name))


def _refusal(original: str) -> Any:
    def refuse(self: Any, *args: Any, **kwargs: Any) -> None:
        raise _built_too_late(type(self), original)

    refuse._trainwright_refuses = True  # type: ignore[attr-defined]
    return refuse


def patch_transformers() -> None:
    """Make trainwright's `Trainer`, `TrainingArguments`, `Seq2SeqTrainer`, `Seq2SeqTrainingArguments`
    and `HfArgumentParser` the ones every transformers module exposes, so code imported afterwards
    (TRL, a script's `from transformers import Trainer`) runs on trainwright. Idempotent.

    Raises `PatchTooLateError`, changing nothing, when a module outside transformers already holds
    one of transformers' classes (it was imported first and would not be reached). Afterwards
    transformers' own classes raise it when built (held somewhere else, they were not reached either)."""
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
    for package in [sys.modules["transformers"], *_left_behind()]:
        for name, cls in ours.items():  # the lazily resolved package attributes
            setattr(package, name, cls)
    _refuse_to_build(originals)


def _left_behind() -> list[ModuleType]:
    """transformers package objects that modules still hold but `sys.modules` no longer has: importing
    `transformers.processing_utils` runs the package's `__init__` again (`direct_transformers_import`),
    so a script's `import transformers` made before the patch holds the first one, whose attributes
    already looked up would still be transformers' classes."""
    current = sys.modules["transformers"]
    found: dict[int, ModuleType] = {}
    for module in list(sys.modules.values()):
        if not isinstance(module, ModuleType):
            continue
        for value in list(vars(module).values()):
            # type() and vars() only: some attributes warn when asked for their class, and a lazy
            # module's attributes import what they name
            if (
                issubclass(type(value), ModuleType)
                and value is not current
                and vars(value).get("__name__") == "transformers"
            ):
                found[id(value)] = value
    return list(found.values())
