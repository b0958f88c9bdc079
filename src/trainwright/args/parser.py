"""Dataclass-driven command-line parsing, compatible with transformers' ``HfArgumentParser``.

Every init field of the given dataclasses becomes one option (``--field_name`` and ``--field-name``).
The field's annotation picks how the string is converted; the same converters are reused by
``parse_dict`` / ``parse_json_file`` / ``parse_yaml_file`` so that a YAML ``lr: 1e-4`` (which YAML
reads as a string) becomes a float exactly as it would on the command line.

trainwright addition: a YAML/JSON file given as the first command-line argument, or with
``--config PATH``, supplies defaults that flags on the command line override.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import enum
import json
import os
import re
import shlex
import sys
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from trainwright.core.files import read_json_object

__all__ = ["HfArg", "HfArgumentParser", "string_to_bool"]

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
CONFIG_FLAG = "--config"

_TRUE_STRINGS = frozenset({"yes", "true", "t", "y", "1"})
_FALSE_STRINGS = frozenset({"no", "false", "f", "n", "0"})
# Field metadata is shared with other tools; only these keys are meant for argparse.
_ARGPARSE_METADATA_KEYS = frozenset({"help", "metavar", "choices", "nargs", "type", "const", "required"})
_UNSUPPORTED_CLASSES = (list, tuple, set, frozenset)  # containers other than list[X] / dict


def string_to_bool(v: str | bool) -> bool:
    """Read yes/true/t/y/1 as True and no/false/f/n/0 as False (case-insensitive)."""
    if isinstance(v, bool):
        return v
    lowered = v.strip().lower()
    if lowered in _TRUE_STRINGS:
        return True
    if lowered in _FALSE_STRINGS:
        return False
    raise argparse.ArgumentTypeError(
        f"expected a boolean (yes/no, true/false, t/f, y/n, 1/0; any case), got {v!r}"
    )


def HfArg(
    *,
    aliases: str | list[str] | None = None,
    help: str | None = None,
    default: Any = dataclasses.MISSING,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    metadata: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """Build a ``dataclasses.field`` whose metadata carries command-line ``aliases`` and ``help``."""
    meta = dict(metadata or {})
    if aliases is not None:
        meta["aliases"] = aliases
    if help is not None:
        meta["help"] = help
    return dataclasses.field(metadata=meta, default=default, default_factory=default_factory, **kwargs)


@dataclasses.dataclass(frozen=True)
class _Conversion:
    """How one field turns strings into values; shared by the command line and the dict/file paths."""

    convert: Callable[[str], Any]
    is_list: bool
    accepts_str: bool

    def coerce(self, value: Any) -> Any:
        # A field whose annotation admits str keeps strings as given (the dataclass decides).
        if self.accepts_str:
            return value
        if self.is_list and isinstance(value, (list, tuple)):
            return [self.convert(v) if isinstance(v, str) else v for v in value]
        if isinstance(value, str) and not isinstance(value, enum.Enum):  # a member given is kept
            return self.convert(value)
        return value


def _split_union(where: str, hint: Any) -> tuple[Any, bool, bool]:
    """Reduce ``X | None`` and ``X | str`` to X, a union of str and several others to str; return
    (X, is_optional, accepts_str)."""
    if typing.get_origin(hint) not in (Union, types.UnionType):
        return hint, False, hint is str
    members = typing.get_args(hint)
    non_none = [m for m in members if m is not type(None)]
    optional = len(non_none) < len(members)
    if len(non_none) == 1:
        return non_none[0], optional, non_none[0] is str
    if len(non_none) == 2 and str in non_none:
        other = non_none[0] if non_none[1] is str else non_none[1]
        if typing.get_origin(other) is Literal and all(isinstance(v, bool) for v in typing.get_args(other)):
            return str, optional, True  # `str | Literal[False]`: a text, or the flag value the code sets
        return other, optional, True
    if str in non_none:  # str among several types: the text as given, as upstream (the dataclass decides)
        return str, optional, True
    raise TypeError(
        f"{where}: the union type {hint} is not supported; use Optional[X], X | None, X | str or a union with str"
    )


def _choice_text(choice: Any) -> str:
    return str(choice.value) if isinstance(choice, enum.Enum) else str(choice)


def _choice_converter(choices: list[Any], enum_values: bool = False) -> Callable[[Any], Any]:
    """Text to one of `choices` (an Enum member by its value or name). With `enum_values`, a member
    is given as its value, as upstream gives a scalar Enum field ("green", not Color.GREEN; the
    dataclass's `__post_init__` makes the member if it wants one)."""
    lookup: dict[str, Any] = {c.name: c for c in choices if isinstance(c, enum.Enum)}
    lookup.update({_choice_text(c): c for c in choices})  # value spellings win over member names
    allowed = ", ".join(_choice_text(c) for c in choices)

    def choice(text: Any) -> Any:
        # argparse also passes str-mixin enum defaults through here, so members map to themselves.
        if isinstance(text, enum.Enum) and text in choices:
            found = text
        else:
            try:
                found = lookup[str(text)]
            except KeyError:
                raise argparse.ArgumentTypeError(f"invalid choice {text!r} (choose from {allowed})") from None
        return found.value if enum_values and isinstance(found, enum.Enum) else found

    return choice


def _json_object_converter(keep_plain_strings: bool) -> Callable[[str], Any]:
    def json_object(text: str) -> Any:
        # With `dict | str`, a string that is not JSON is left to the dataclass (e.g. a file path).
        if keep_plain_strings and not text.lstrip().startswith("{"):
            return text
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({e.msg})") from None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"expected a JSON object, got {type(value).__name__}: {text!r}")
        return value

    return json_object


def _or_keep_string(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert_or_keep(text: str) -> Any:
        try:
            return convert(text)
        except (argparse.ArgumentTypeError, ValueError, TypeError):
            return text

    convert_or_keep.__name__ = getattr(convert, "__name__", "value")
    return convert_or_keep


def _escape_percent(text: str) -> str:
    # argparse %-formats help text; a lone "%" ("10% of steps") would crash --help.
    return re.sub(r"%%|%\(|%", lambda m: m.group() if len(m.group()) == 2 else "%%", text)


def _keep_string_default(convert: Callable[[str], Any], default: str) -> Callable[[str], Any]:
    def convert_unless_default(text: str) -> Any:
        return text if text == default else convert(text)

    convert_unless_default.__name__ = getattr(convert, "__name__", "value")
    return convert_unless_default


def _converter(
    where: str, tp: Any, accepts_str: bool, element: bool = False
) -> tuple[Callable[[str], Any], list[Any] | None]:
    """Return (string converter, choices or None) for a non-list, non-union type (`element`: of a list).

    An Enum gives its value for a field and its member for a list's element, as upstream (which
    converts a list's elements with the Enum class itself).
    """
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = list(typing.get_args(tp))
        return _choice_converter(choices), choices
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        members = list(tp)
        return _choice_converter(members, enum_values=not element), (
            members if element else [m.value for m in members]
        )
    if tp is dict or origin is dict or origin is Mapping:
        return _json_object_converter(keep_plain_strings=accepts_str), None
    if tp is Any or tp is str:
        return str, None
    if tp is bool:
        return (_or_keep_string(string_to_bool) if accepts_str else string_to_bool), None
    if origin is None and isinstance(tp, type) and not issubclass(tp, _UNSUPPORTED_CLASSES):
        return (_or_keep_string(tp) if accepts_str else tp), None
    raise TypeError(
        f"{where}: type {tp!r} is not supported on the command line "
        "(use str, int, float, bool, an Enum, a Literal, list[X], dict or a class built from one string)"
    )


def _load_mapping(path: str | os.PathLike[str], fmt: str) -> dict[str, Any]:
    """Read a JSON or YAML file whose top level must be a mapping."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"config file not found: {p}")
    if fmt == "json":
        return read_json_object(p)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ValueError(_yaml_error(p, e)) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{p}: expected a mapping of field names to values, got {type(data).__name__}")
    return data


def _yaml_error(path: Path, error: yaml.YAMLError) -> str:
    """One line: the file, the line and column where YAML stopped, and why (PyYAML's own message
    spans several lines, each mark quoting the text)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
    context, start = getattr(error, "context", None), getattr(error, "context_mark", None)
    opened = f" ({context} at line {start.line + 1} column {start.column + 1})" if context and start else ""
    return f"{path} is not valid YAML{where}: {problem}{opened}"


def _pop_option(argv: list[str], flag: str) -> tuple[list[str], list[str]]:
    """Remove every ``flag VALUE`` / ``flag=VALUE`` from argv (up to ``--``); return (values, rest)."""
    values: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            rest.extend(argv[i:])
            break
        if token == flag:
            if i + 1 >= len(argv):
                raise ValueError(f"{flag} expects a file path")
            values.append(argv[i + 1])
            i += 2
            continue
        if token.startswith(flag + "="):
            values.append(token[len(flag) + 1 :])
        else:
            rest.append(token)
        i += 1
    return values, rest


def _args_file_tokens(path: Path) -> list[str]:
    # shlex keeps quoted values (e.g. JSON with spaces) whole and allows `#` comments.
    return shlex.split(path.read_text(encoding="utf-8"), comments=True)


class HfArgumentParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` that builds its options from dataclasses and returns instances.

    Args:
        dataclass_types: one dataclass type or several; each init field becomes an option.
        **argparse_kwargs: passed to ``argparse.ArgumentParser`` (the default ``formatter_class``
            shows defaults in ``--help``).
    """

    def __init__(
        self,
        dataclass_types: type | Iterable[type] | None = None,
        **argparse_kwargs: Any,
    ) -> None:
        argparse_kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(**argparse_kwargs)
        if dataclass_types is None:
            dataclass_types = []
        elif dataclasses.is_dataclass(dataclass_types) or not isinstance(dataclass_types, Iterable):
            dataclass_types = [dataclass_types]
        self.dataclass_types: list[type] = list(dataclass_types)
        self._conversions: dict[str, _Conversion] = {}
        self._factory_defaults: dict[str, Any] = {}
        for dtype in self.dataclass_types:
            self._add_dataclass_arguments(dtype)
        if self.epilog is None and CONFIG_FLAG not in self._option_string_actions:
            self.epilog = (
                "Defaults may also come from a YAML or JSON file given as the first argument or with "
                "--config PATH; options on the command line override it."
            )

    # ----------------------------------------------------------------- building the options

    def _add_dataclass_arguments(self, dtype: type) -> None:
        if not (isinstance(dtype, type) and dataclasses.is_dataclass(dtype)):
            raise TypeError(f"HfArgumentParser expects dataclass types, got {dtype!r}")
        container = self._argument_container(dtype)
        try:
            hints = typing.get_type_hints(dtype)
        except (NameError, TypeError, AttributeError) as e:
            raise TypeError(
                f"cannot resolve the annotations of dataclass {dtype.__qualname__}: {e} "
                "(types named in string annotations must be importable from its module)"
            ) from e
        for f in dataclasses.fields(dtype):
            if f.init:
                self._add_field_argument(container, dtype, f, hints[f.name])

    def _argument_container(self, dtype: type) -> argparse._ActionsContainer:
        """Where `dtype`'s options go: a group titled by its `_argument_group_name`, else the parser."""
        group_name = getattr(dtype, "_argument_group_name", None)
        return self.add_argument_group(group_name) if group_name else self

    def _add_field_argument(
        self, container: argparse._ActionsContainer, dtype: type, f: dataclasses.Field, hint: Any
    ) -> None:
        where = f"{dtype.__qualname__}.{f.name}"
        meta = dict(f.metadata)
        aliases = meta.get("aliases") or []
        if isinstance(aliases, str):
            aliases = [aliases]
        for alias in aliases:
            if not (isinstance(alias, str) and alias.startswith("-")):
                raise ValueError(f"{where}: alias {alias!r} must be an option string such as '--lr' or '-l'")
        dashed = f.name.replace("_", "-")
        option_strings = [f"--{f.name}"] + ([f"--{dashed}"] if dashed != f.name else []) + list(aliases)

        tp, optional, accepts_str = _split_union(where, hint)
        is_list = tp is list or typing.get_origin(tp) is list
        if is_list:
            element = (typing.get_args(tp) or (str,))[0]
            convert, choices = _converter(where, element, accepts_str=False, element=True)
        else:
            convert, choices = _converter(where, tp, accepts_str)

        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
            self._factory_defaults[f.name] = default
        else:
            default = f.default
        if accepts_str and isinstance(default, str):
            # argparse runs string defaults through `type`; a field that admits str keeps its default
            # as written (`str | bool = "no"` stays "no", `str | list[X] = ""` stays "").
            convert = _keep_string_default(convert, default)
        # `bool` is a flag (`--x` means True); `bool | None` only when its default is not None.
        is_flag = tp is bool and not is_list and (not optional or (has_default and default is not None))

        kwargs: dict[str, Any] = {"dest": f.name, "type": convert}
        if choices is not None:
            kwargs["choices"] = choices
            kwargs["metavar"] = "{" + ",".join(_choice_text(c) for c in choices) + "}"
        if is_list:
            kwargs["nargs"] = "+"
        if is_flag:
            # Like upstream, a bool without a default is an off-by-default flag rather than required.
            kwargs.update(nargs="?", const=True, default=default if has_default else False)
        elif has_default:
            kwargs["default"] = default
        else:
            kwargs["required"] = True
        kwargs.update({k: v for k, v in meta.items() if k in _ARGPARSE_METADATA_KEYS})
        if isinstance(kwargs.get("help"), str):
            kwargs["help"] = _escape_percent(kwargs["help"])

        container.add_argument(*option_strings, **kwargs)
        if is_flag and default is True:
            container.add_argument(
                f"--no_{f.name}",
                f"--no-{dashed}",
                action="store_false",
                dest=f.name,
                default=argparse.SUPPRESS,  # the value's default belongs to --{name}, shown there
                help=f"Set {f.name} to False (same as --{f.name} false).",
            )
        self._conversions[f.name] = _Conversion(kwargs["type"], is_list, accepts_str)

    # ----------------------------------------------------------------- shared helpers

    def _init_field_names(self) -> set[str]:
        return {f.name for d in self.dataclass_types for f in dataclasses.fields(d) if f.init}

    def _coerce(self, name: str, value: Any, source: str) -> Any:
        conversion = self._conversions.get(name)
        if conversion is None:
            return value
        try:
            return conversion.coerce(value)
        except (argparse.ArgumentTypeError, ValueError, TypeError) as e:
            raise ValueError(f"{source}: invalid value {value!r} for {name!r}: {e}") from e

    @staticmethod
    def _unknown_keys_error(source: str, unknown: Iterable[str], known: Iterable[str]) -> ValueError:
        unknown = sorted(unknown)
        known = list(known)
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, known, n=1)
            if close:
                hints.append(f"{key!r} -> {close[0]!r}?")
        suggestion = f"; did you mean {', '.join(hints)}" if hints else ""
        return ValueError(
            f"Some keys are not used by the HfArgumentParser: {unknown} (in {source}{suggestion})"
        )

    def _build_dataclasses(self, values: dict[str, Any]) -> list[Any]:
        """Instantiate each dataclass from (and remove) the matching keys of ``values``."""
        outputs = []
        for dtype in self.dataclass_types:
            names = {f.name for f in dataclasses.fields(dtype) if f.init}
            inputs = {k: values.pop(k) for k in list(values) if k in names}
            for k in list(inputs):
                # Untouched default_factory values are left out so every instance gets a fresh object.
                if k in self._factory_defaults and inputs[k] is self._factory_defaults[k]:
                    del inputs[k]
            outputs.append(dtype(**inputs))
        return outputs

    def _from_mapping(self, data: Any, allow_extra_keys: bool, source: str) -> tuple[Any, ...]:
        if not isinstance(data, Mapping):
            raise TypeError(
                f"{source}: expected a mapping of field names to values, got {type(data).__name__}"
            )
        known = self._init_field_names()
        unknown = [k for k in data if k not in known]
        if unknown and not allow_extra_keys:
            raise self._unknown_keys_error(source, unknown, known)
        values = {k: self._coerce(k, v, source) for k, v in data.items() if k in known}
        return tuple(self._build_dataclasses(values))

    # ----------------------------------------------------------------- command line

    def _collect_args_files(
        self,
        cli: list[str],
        look_for_args_file: bool,
        args_filename: str | os.PathLike[str] | None,
        args_file_flag: str | None,
    ) -> tuple[list[str], list[str]]:
        """Return (tokens read from args files, command line without the args-file flags)."""
        files: list[tuple[Path, bool]] = []  # (path, must_exist)
        if args_filename is not None:
            files.append((Path(args_filename), True))
        elif look_for_args_file and sys.argv and Path(sys.argv[0]).name:
            files.append((Path(sys.argv[0]).with_suffix(".args"), False))
        if args_file_flag:
            flagged, cli = _pop_option(cli, args_file_flag)
            files.extend((Path(p), True) for p in flagged)
        tokens: list[str] = []
        for path, must_exist in files:
            if path.is_file():
                tokens += _args_file_tokens(path)
            elif must_exist:
                raise FileNotFoundError(f"args file not found: {path}")
        return tokens, cli

    def _config_defaults(self, paths: list[str]) -> dict[str, Any]:
        known = {a.dest for a in self._actions if a.dest not in (argparse.SUPPRESS, "help")}
        defaults: dict[str, Any] = {}
        for path in paths:
            fmt = "json" if path.lower().endswith(".json") else "yaml"
            data = _load_mapping(path, fmt)
            unknown = [k for k in data if k not in known]
            if unknown:
                raise self._unknown_keys_error(path, unknown, known)
            defaults.update({k: self._coerce(k, v, path) for k, v in data.items()})
        return defaults

    @contextlib.contextmanager
    def _not_required(self, dests: Iterable[str]) -> Iterator[None]:
        # A required field supplied by a config file must not be demanded again on the command line.
        relaxed = [a for a in self._actions if a.required and a.dest in set(dests)]
        for action in relaxed:
            action.required = False
        try:
            yield
        finally:
            for action in relaxed:
                action.required = True

    def parse_args_into_dataclasses(
        self,
        args: list[str] | None = None,
        return_remaining_strings: bool = False,
        look_for_args_file: bool = True,
        args_filename: str | os.PathLike[str] | None = None,
        args_file_flag: str | None = None,
    ) -> tuple[Any, ...]:
        """Parse the command line into one instance per dataclass (in the order given).

        Precedence, lowest first: field defaults, config file (first argument or ``--config``),
        args files (``<script>.args`` or ``args_filename``, then files named by ``args_file_flag``
        in order), the command line. Namespace keys that belong to no dataclass (options added
        with ``add_argument``) come back as one extra ``argparse.Namespace``; with
        ``return_remaining_strings`` the unparsed strings come back last, otherwise they raise.
        """
        cli = list(sys.argv[1:] if args is None else args)
        file_tokens, cli = self._collect_args_files(cli, look_for_args_file, args_filename, args_file_flag)
        config_paths: list[str] = []
        has_positionals = any(not a.option_strings for a in self._actions)
        if (
            cli
            and not has_positionals
            and not cli[0].startswith("-")
            and cli[0].lower().endswith(CONFIG_SUFFIXES)
        ):
            config_paths.append(cli.pop(0))
        argv = file_tokens + cli
        if CONFIG_FLAG not in self._option_string_actions:
            flagged, argv = _pop_option(argv, CONFIG_FLAG)
            config_paths += flagged
        defaults = self._config_defaults(config_paths)

        with self._not_required(defaults):
            namespace, remaining = self.parse_known_args(argv, namespace=argparse.Namespace(**defaults))
        values = vars(namespace)
        outputs = self._build_dataclasses(values)
        if values:
            outputs.append(argparse.Namespace(**values))
        if return_remaining_strings:
            return (*outputs, remaining)
        if remaining:
            raise ValueError(f"Some specified arguments are not used by the HfArgumentParser: {remaining}")
        return tuple(outputs)

    # ----------------------------------------------------------------- dicts and files

    def parse_dict(self, args: Mapping[str, Any], allow_extra_keys: bool = False) -> tuple[Any, ...]:
        """Build the dataclasses from a mapping; unknown keys raise unless ``allow_extra_keys``."""
        return self._from_mapping(args, allow_extra_keys, source="the dict given to parse_dict")

    def parse_json_file(
        self, json_file: str | os.PathLike[str], allow_extra_keys: bool = False
    ) -> tuple[Any, ...]:
        """Build the dataclasses from a JSON file holding one object."""
        return self._from_mapping(_load_mapping(json_file, "json"), allow_extra_keys, source=str(json_file))

    def parse_yaml_file(
        self, yaml_file: str | os.PathLike[str], allow_extra_keys: bool = False
    ) -> tuple[Any, ...]:
        """Build the dataclasses from a YAML file holding one mapping."""
        return self._from_mapping(_load_mapping(yaml_file, "yaml"), allow_extra_keys, source=str(yaml_file))
