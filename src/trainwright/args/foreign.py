"""A `transformers.TrainingArguments` handed to trainwright's Trainer: converted field by field, or
refused with the way out.

trainwright's arguments have every field of transformers' (v4 and v5 names), with the same meaning,
so transformers' own classes convert one for one (`Seq2SeqTrainingArguments` to trainwright's), and
the converted arguments are validated as if built here. A field left at transformers' default is not
a choice, so it takes trainwright's default (`enable_jit_checkpoint=False` is transformers' default:
the preemption save stays on, as for trainwright's own arguments); a value passed to the constructor
is, even if equal to the default (`watch` has transformers' classes note what they are given). The object stays the user's:
`Source.sync` carries its later changes (`args.max_steps = 3` after `Trainer(args=args)`) to the
conversion, as transformers' Trainer, which keeps the object itself, would see them.

A subclass with fields of its own (TRL's `SFTConfig`, `DPOConfig`, ...) belongs to a trainer built on
transformers' Trainer: its extra fields mean something only to that trainer, so it is refused, naming
the class and the fix (run the library on trainwright with `patch_transformers()` or `trainwright
run`). A subclass that overrides a property, a method or `__post_init__` is refused too: a field by
field copy would drop them (and its methods, calling `super()` on transformers' class, cannot move).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import importlib.abc
import inspect
import sys
import weakref
from typing import Any

from trainwright.args.training_args import Seq2SeqTrainingArguments, TrainingArguments
from trainwright.core.import_hooks import spec_from_other_finders

# What `@dataclass` (and `class`) put in a class's namespace: not the subclass's own behaviour.
_CLASS_MADE = {
    "__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__annotations__", "__hash__",
    "__dataclass_fields__", "__dataclass_params__", "__match_args__", "__slots__", "__firstlineno__",
    "__static_attributes__", "__orig_bases__", "__parameters__",
}  # fmt: skip
# Methods `@dataclass` writes (their code compiled from a string); written by hand, they are overrides.
_DATACLASS_METHODS = {"__init__", "__repr__", "__eq__", "__lt__", "__le__", "__gt__", "__ge__", "__setattr__",
                      "__delattr__", "__getstate__", "__setstate__"}  # fmt: skip


# id(transformers' arguments object) -> the fields its constructor was given (`_record_given`)
_GIVEN: dict[int, frozenset[str]] = {}
# transformers' modules whose arguments class records what its constructor is given
_WATCHED = {
    "transformers.training_args": "TrainingArguments",
    "transformers.training_args_seq2seq": "Seq2SeqTrainingArguments",
}


def _record_given(cls: Any) -> None:
    """Make transformers' arguments class `cls` note, per object, the fields passed to its constructor:
    an explicit value equal to transformers' default (`enable_jit_checkpoint=False`) is a choice too.
    The note is kept here, not on the object (whose `vars()` stay transformers'). A call given every
    field (a parser's, `dataclasses.replace`), a subclass with its own dataclass constructor, or a copy
    has none: there only a value other than transformers' default counts."""
    init = vars(cls).get("__init__") if isinstance(cls, type) else None
    if init is None or issubclass(cls, TrainingArguments) or getattr(init, "_trainwright_records", False):
        return
    names = [f.name for f in dataclasses.fields(cls) if f.init]

    @functools.wraps(init)
    def recording(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        given = frozenset(names[: len(args)]) | frozenset(kwargs)
        if given.issuperset(names):  # every field: a copy (HfArgumentParser, dataclasses.replace), no choice
            return
        if id(self) not in _GIVEN:
            weakref.finalize(self, _GIVEN.pop, id(self), None)
        _GIVEN[id(self)] = given

    recording._trainwright_records = True  # type: ignore[attr-defined]
    cls.__init__ = recording


class _RecordOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: the spec other finders give for a module of `_WATCHED` gets a loader that
    wraps the module's class (`_record_given`) as soon as it has executed."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in _WATCHED:
            return None
        spec = spec_from_other_finders(self, name, path, target)
        if spec is None:
            return None
        exec_module = getattr(spec.loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_record(module: Any) -> None:
            exec_module(module)
            _record_given(vars(module).get(_WATCHED[name]))

        spec.loader.exec_module = exec_then_record
        return spec


def watch() -> None:
    """Record the fields given to transformers' arguments classes, those loaded and those to come."""
    for module, name in _WATCHED.items():
        if module in sys.modules:
            _record_given(vars(sys.modules[module]).get(name))
    if not any(isinstance(f, _RecordOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RecordOnImport())


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
    name = f"{type(args).__module__}.{type(args).__name__}"
    extra = sorted(_init_fields(type(args)) - _init_fields(own))
    if extra:
        raise TypeError(
            f"Trainer(args={type(args).__name__}(...)): {name} adds "
            f"{_listed(extra)} to transformers' TrainingArguments, "
            f"settings of the trainer it belongs to, which trainwright.Trainer would ignore. Run that trainer "
            "on trainwright instead: call trainwright.patch_transformers() before importing its library, or "
            "run the script with `trainwright run SCRIPT.py`."
        )
    overridden = _overrides(type(args), own)
    if overridden:
        module = type(args).__module__
        where = "before the class is defined" if module == "__main__" else f"before importing {module}"
        raise TypeError(
            f"Trainer(args={type(args).__name__}(...)): {name} overrides {_listed(overridden)} of transformers' "
            f"{own.__name__}; trainwright.Trainer converts transformers' arguments field by field, so it would "
            f"drop them. Subclass trainwright.{target.__name__} instead (the same fields), or call "
            f"trainwright.patch_transformers() {where} (or run the script with `trainwright run SCRIPT.py`), "
            "so that the class subclasses trainwright's."
        )
    fields = _init_fields(target)
    unknown = sorted(_init_fields(own) - fields)
    if unknown:  # a newer transformers than trainwright knows
        raise TypeError(
            f"transformers' TrainingArguments has fields trainwright does not know: {unknown}; build "
            "trainwright.TrainingArguments instead."
        )
    given = _GIVEN.get(id(args), frozenset())
    chosen = {}
    for f in dataclasses.fields(own):
        if not f.init:
            continue
        value = getattr(args, f.name)
        value = value.value if isinstance(value, enum.Enum) else value
        # a field left at transformers' default is no choice: trainwright's default applies
        if f.name in given or not _is_default(value, f):
            chosen[f.name] = value
    return target(**chosen)


def _listed(names: list[str]) -> str:
    return f"{', '.join(names[:6])}{' ...' if len(names) > 6 else ''}"


def _overrides(cls: type, own: type) -> list[str]:
    """What `cls` defines between itself and transformers' class `own`: properties, methods, class
    attributes (not its fields, nor what `@dataclass` generates)."""
    fields = {f.name for f in dataclasses.fields(own)}
    names = set()
    for klass in cls.__mro__:
        if klass in own.__mro__:
            continue
        for name, value in vars(klass).items():
            if name in fields or name in _CLASS_MADE:
                continue
            code = getattr(inspect.unwrap(value), "__code__", None) if callable(value) else None
            if name in _DATACLASS_METHODS and getattr(code, "co_filename", None) == "<string>":
                continue
            names.add(name)
    return sorted(names)


def _is_default(value: Any, f: dataclasses.Field) -> bool:
    if f.default is not dataclasses.MISSING:
        default = f.default
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    else:
        return False
    default = default.value if isinstance(default, enum.Enum) else default
    return type(value) is type(default) and _same(value, default)


def _same(a: Any, b: Any) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:  # a value whose == is not a truth value
        return False


def _values(args: Any) -> dict[str, Any]:
    """The init fields of `args`, each copied (a list or dict changed in place shows as a change)."""
    values = {}
    for name in _init_fields(type(args)):
        value = getattr(args, name)
        try:
            values[name] = copy.deepcopy(value)
        except Exception:  # a value that cannot be copied: compared as it is
            values[name] = value
    return values


class Source:
    """The arguments object the user handed to `Trainer(args=...)` when it was transformers', and
    trainwright's conversion of it (the Trainer's `args`).

    transformers' Trainer keeps the object itself, so a change made to it after `Trainer(...)`
    (`args.max_steps = 3`) counts at the next `train()`. `sync` does the same for the conversion: where
    the object's fields changed since the last look, it is converted (and validated) again and the
    fields of the conversion that come out differently are set on the Trainer's arguments; the
    Trainer's own changes to its arguments are left alone."""

    def __init__(self, source: Any, converted: TrainingArguments):
        self.source, self.converted = source, converted
        self.seen = _values(source)
        self.made = _values(converted)

    def sync(self, args: TrainingArguments) -> None:
        """Carry the source's changes since the last call to `args` (the Trainer's arguments, unless
        they were replaced since: then nothing)."""
        if args is not self.converted:
            return
        now = _values(self.source)
        if now.keys() == self.seen.keys() and all(_same(v, self.seen[k]) for k, v in now.items()):
            return
        fresh = coerce(self.source)
        made = _values(fresh)
        for name, value in made.items():
            if name not in self.made or not _same(value, self.made[name]):
                setattr(args, name, getattr(fresh, name))
        self.seen, self.made = now, made


def convert(args: Any) -> tuple[TrainingArguments, Source | None]:
    """`coerce(args)`, and the `Source` that keeps the conversion up to date when it is one."""
    converted = coerce(args)
    return converted, None if converted is args else Source(args, converted)
