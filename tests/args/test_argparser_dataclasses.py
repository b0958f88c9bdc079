"""HfArgumentParser on dataclasses: how each field type becomes an option (bools, enums, literals,
lists, dicts, unions), help and argument groups, construction errors, several dataclasses at once."""

# String annotations on purpose: every dataclass below goes through typing.get_type_hints.
from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Union

import pytest
from args_kit import Choices, Color, Containers, Flags, Model, Scalars, Train, parse

from trainwright.args.parser import HfArg, HfArgumentParser, string_to_bool

# ---------------------------------------------------------------- string_to_bool / HfArg


@pytest.mark.parametrize("text", ["yes", "TRUE", "t", "Y", "1", "True"])
def test_string_to_bool_true(text):
    assert string_to_bool(text) is True


@pytest.mark.parametrize("text", ["no", "False", "F", "n", "0", "NO"])
def test_string_to_bool_false(text):
    assert string_to_bool(text) is False


def test_string_to_bool_rejects_other_strings_and_passes_bools():
    with pytest.raises(argparse.ArgumentTypeError, match="expected a boolean.*'maybe'"):
        string_to_bool("maybe")
    assert string_to_bool(True) is True and string_to_bool(False) is False


def test_hfarg_builds_field_with_metadata():
    f = HfArg(aliases="--x", help="h", default=3, metadata={"k": 1})
    assert f.default == 3 and dict(f.metadata) == {"k": 1, "aliases": "--x", "help": "h"}
    g = HfArg(default_factory=list)
    assert g.default_factory is list and dict(g.metadata) == {}
    with pytest.raises(ValueError):
        HfArg(default=1, default_factory=list)


# ---------------------------------------------------------------- scalars, required, defaults


def test_scalars_defaults_and_conversion():
    (s,) = parse(Scalars, ["--name", "n"])
    assert s == Scalars(name="n")
    (s,) = parse(Scalars, ["--name", "n", "--steps", "3", "--ratio", "2e-1", "--path", "a/b", "--count", "4"])
    assert (s.steps, s.ratio, s.path, s.count) == (3, 0.2, Path("a/b"), 4)


def test_required_field_missing_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit):
        parse(Scalars, [])
    assert "required: --name" in capsys.readouterr().err


def test_bad_int_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit):
        parse(Scalars, ["--name", "n", "--steps", "three"])
    assert "--steps" in capsys.readouterr().err


def test_dash_alias_and_metadata_aliases():
    (s,) = parse(Scalars, ["--name", "n", "--count", "2"])
    (m,) = parse(Model, ["--width", "64"])
    assert m.hidden == 64 and s.count == 2
    (m,) = parse(Model, ["-w", "16", "--dropout", "0.3"])
    assert (m.hidden, m.dropout) == (16, 0.3)
    (t,) = parse(Train, ["--learning-rate", "0.5", "--run-name", "r"])
    assert (t.learning_rate, t.run_name) == (0.5, "r")


def test_init_false_fields_get_no_option():
    parser = HfArgumentParser(Train)
    assert "--internal" not in parser._option_string_actions
    (t,) = parser.parse_args_into_dataclasses([], look_for_args_file=False)
    assert t.internal == 7


def test_default_factory_gives_a_fresh_object_per_parse():
    parser = HfArgumentParser(Containers)
    (a,) = parser.parse_args_into_dataclasses([], look_for_args_file=False)
    (b,) = parser.parse_args_into_dataclasses([], look_for_args_file=False)
    assert a.tags == ["x"] and a.extra == {}
    a.tags.append("mutated")
    assert b.tags == ["x"] and a.tags is not b.tags


# ---------------------------------------------------------------- bools


def test_bool_flag_forms():
    (f,) = parse(Flags, [])
    assert (f.debug, f.verbose, f.bare, f.maybe, f.maybe_on, f.tokens) == (
        False,
        True,
        False,
        None,
        True,
        False,
    )
    (f,) = parse(Flags, ["--debug", "--bare"])
    assert f.debug is True and f.bare is True
    (f,) = parse(Flags, ["--debug", "no", "--verbose", "false"])
    assert f.debug is False and f.verbose is False


@pytest.mark.parametrize("flag", ["--no_verbose", "--no-verbose"])
def test_no_flag_for_true_defaults(flag):
    (f,) = parse(Flags, [flag])
    assert f.verbose is False
    (f,) = parse(Flags, ["--no_maybe_on"])
    assert f.maybe_on is False


def test_no_flag_only_exists_for_true_defaults():
    parser = HfArgumentParser(Flags)
    assert "--no_verbose" in parser._option_string_actions
    assert "--no-maybe-on" in parser._option_string_actions
    assert "--no_debug" not in parser._option_string_actions
    assert "--no_maybe" not in parser._option_string_actions


def test_no_flag_help_does_not_show_a_misleading_default():
    text = " ".join(HfArgumentParser(Flags).format_help().split())
    assert "Set verbose to False (same as --verbose false)." in text
    assert "false). (default" not in text


def test_invalid_bool_value_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit):
        parse(Flags, ["--debug", "perhaps"])
    assert "expected a boolean" in capsys.readouterr().err


def test_optional_bool_with_none_default_needs_a_value(capsys):
    (f,) = parse(Flags, ["--maybe", "YES"])
    assert f.maybe is True
    with pytest.raises(SystemExit):
        parse(Flags, ["--maybe"])
    assert "--maybe" in capsys.readouterr().err


def test_str_unions_keep_their_string_default_as_written():
    (f,) = parse(Flags, [])
    assert f.seen == "no" and f.debug_opts == ""
    (f,) = parse(Flags, ["--seen", "--debug_opts", "green"])
    assert f.seen is True and f.debug_opts == [Color.GREEN]


def test_bool_or_str_union_keeps_non_bool_strings():
    assert parse(Flags, ["--tokens"])[0].tokens is True
    assert parse(Flags, ["--tokens", "false"])[0].tokens is False
    assert parse(Flags, ["--tokens", "all"])[0].tokens == "all"


# ---------------------------------------------------------------- enums and literals


def test_enum_by_value_and_by_name():
    """Upstream: tests/utils/test_hf_argparser.py `test_with_enum`: a given Enum field is its value
    (the string, or 42 for an int value); a default stays what the dataclass says."""
    (c,) = parse(Choices, [])
    assert c.color is Color.RED and c.opt == "a"
    assert c.speed == "slow" and type(c.speed) is str  # a str-mixin default goes through argparse's type
    assert c.mode == "fast" and type(c.mode) is str  # `Mode | str` keeps its string default as written
    (c,) = parse(Choices, ["--color", "green", "--level", "2", "--mode", "slow"])
    assert (c.color, c.level, c.mode) == ("green", 2, "slow")
    assert type(c.color) is str and type(c.level) is int
    (c,) = parse(Choices, ["--color", "GREEN", "--level", "LOW"])  # member names too (trainwright)
    assert (c.color, c.level) == ("green", 1)
    namespace = HfArgumentParser(Choices).parse_args(["--color", "green", "--level", "2"])
    assert (namespace.color, namespace.level) == ("green", 2)
    upstream = pytest.importorskip("transformers").HfArgumentParser(Choices)
    (theirs,) = upstream.parse_args_into_dataclasses(["--color", "green", "--level", "2", "--opt", "3"])
    (ours,) = parse(Choices, ["--color", "green", "--level", "2", "--opt", "3"])
    for name in ("color", "level", "opt", "speed"):
        assert (getattr(ours, name), type(getattr(ours, name))) == (
            getattr(theirs, name),
            type(getattr(theirs, name)),
        ), name


def test_literal_maps_back_to_the_literal_value():
    assert parse(Choices, ["--opt", "3"])[0].opt == 3
    assert parse(Choices, ["--opt", "b"])[0].opt == "b"


def test_list_of_enums():
    assert parse(Choices, ["--palette", "green", "red"])[0].palette == [Color.GREEN, Color.RED]


@pytest.mark.parametrize(
    ("argv", "allowed"), [(["--color", "blue"], "red, green"), (["--opt", "c"], "a, b, 3")]
)
def test_invalid_choice_lists_allowed_values(capsys, argv, allowed):
    with pytest.raises(SystemExit):
        parse(Choices, argv)
    err = capsys.readouterr().err
    assert argv[0] in err and f"choose from {allowed}" in err


def test_choices_are_shown_by_value_in_help():
    text = HfArgumentParser(Choices).format_help()
    assert "{red,green}" in text and "{1,2}" in text and "{a,b,3}" in text


# ---------------------------------------------------------------- lists and dicts


def test_lists_take_one_or_more_values():
    (c,) = parse(Containers, ["--tags", "a", "b", "--sizes", "1", "2", "3"])
    assert c.tags == ["a", "b"] and c.sizes == [1, 2, 3]


def test_dict_field_parses_json_object():
    (c,) = parse(Containers, ["--extra", '{"a": 1, "b": [2]}'])
    assert c.extra == {"a": 1, "b": [2]}


@pytest.mark.parametrize("bad", ["{not json", "[1, 2]", "plain"])
def test_dict_field_rejects_non_objects(capsys, bad):
    with pytest.raises(SystemExit):
        parse(Containers, ["--extra", bad])
    err = capsys.readouterr().err
    assert "--extra" in err and "expected a JSON object" in err


def test_dict_or_str_field_keeps_paths_and_parses_json():
    assert parse(Containers, ["--cfg", "ds_config.json"])[0].cfg == "ds_config.json"
    assert parse(Containers, ["--cfg", '{"stage": 2}'])[0].cfg == {"stage": 2}
    with pytest.raises(SystemExit):
        parse(Containers, ["--cfg", "{broken"])


def test_int_or_str_union_keeps_non_int_strings():
    assert parse(Containers, ["--budget", "7"])[0].budget == 7
    assert parse(Containers, ["--budget", "auto"])[0].budget == "auto"


# ---------------------------------------------------------------- groups, help, construction errors


def test_argument_group_and_help_metadata():
    parser = HfArgumentParser([Train, Model])
    titles = [g.title for g in parser._action_groups]
    assert "Model options" in titles
    group = next(g for g in parser._action_groups if g.title == "Model options")
    assert {a.dest for a in group._group_actions} == {"hidden", "dropout"}
    text = parser.format_help()
    assert "hidden size (default: 32)" in text and "--dropout P" in text
    assert "--config PATH" in text  # the trainwright config-file note


def test_percent_signs_in_help_do_not_break_help():
    @dataclass
    class Pct:
        warmup: float = HfArg(default=0.1, help="warm up over 10% of steps, %(default)s by default, 50%% max")

    text = " ".join(HfArgumentParser(Pct).format_help().split())
    assert "warm up over 10% of steps, 0.1 by default, 50% max" in text


def test_unsupported_union_names_the_field():
    @dataclass
    class Bad:
        x: Union[int, float] = 1

    with pytest.raises(TypeError, match=r"Bad\.x: the union type"):
        HfArgumentParser(Bad)


def test_unsupported_types_name_the_field():
    @dataclass
    class Bad:
        pair: tuple = (1, 2)

    @dataclass
    class Nested:
        grid: list[list[int]] = field(default_factory=list)

    with pytest.raises(TypeError, match=r"Bad\.pair: type .* is not supported"):
        HfArgumentParser(Bad)
    with pytest.raises(TypeError, match=r"Nested\.grid: type list\[int\] is not supported"):
        HfArgumentParser(Nested)


def test_alias_must_be_an_option_string():
    @dataclass
    class Bad:
        x: int = HfArg(default=1, aliases=["x2"])

    with pytest.raises(ValueError, match=r"Bad\.x: alias 'x2'"):
        HfArgumentParser(Bad)


def test_unresolvable_string_annotation_names_the_dataclass():
    @dataclass
    class Bad:
        x: NotDefinedAnywhere = None  # noqa: F821

    with pytest.raises(TypeError, match="cannot resolve the annotations of dataclass .*Bad"):
        HfArgumentParser(Bad)


def test_non_dataclass_is_rejected():
    with pytest.raises(TypeError, match="expects dataclass types"):
        HfArgumentParser([int])


def test_runtime_annotations_work_too():
    # make_dataclass stores real type objects instead of strings.
    Real = dataclasses.make_dataclass(
        "Real", [("n", int), ("on", bool, field(default=True)), ("xs", list[float], field(default=None))]
    )
    (r,) = parse(Real, ["--n", "2", "--no_on", "--xs", "1", "2.5"])
    assert (r.n, r.on, r.xs) == (2, False, [1.0, 2.5])


# ---------------------------------------------------------------- parse_args_into_dataclasses


def test_several_dataclasses_in_order_and_extra_namespace():
    parser = HfArgumentParser([Train, Model])
    parser.add_argument("--extra_flag", type=int, default=0)
    t, m, ns = parser.parse_args_into_dataclasses(
        ["--epochs", "2", "--hidden", "8", "--extra_flag", "5"], look_for_args_file=False
    )
    assert isinstance(t, Train) and isinstance(m, Model)
    assert (t.epochs, m.hidden) == (2, 8) and ns == argparse.Namespace(extra_flag=5)


def test_unknown_strings_raise_or_are_returned():
    with pytest.raises(ValueError, match=r"not used by the HfArgumentParser: \['--bogus', '1'\]"):
        parse(Train, ["--epochs", "2", "--bogus", "1"])
    t, remaining = parse(Train, ["--epochs", "2", "--bogus", "1"], return_remaining_strings=True)
    assert t.epochs == 2 and remaining == ["--bogus", "1"]


def test_default_argv_is_sys_argv(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "prog.py"), "--epochs", "4"])
    (t,) = HfArgumentParser(Train).parse_args_into_dataclasses()
    assert t.epochs == 4


def test_a_union_of_str_and_several_types_is_read_as_text_as_upstream():
    """sentence-transformers' `prompts: Union[str, None, dict[str, str], dict[str, dict[str, str]]]` and
    transformers' `trackio_static_space_id: Union[str, None, Literal[False]]`: the text as given (the
    dataclass parses a JSON object itself)."""

    @dataclass
    class Library:
        prompts: Union[str, None, dict[str, str], dict[str, dict[str, str]]] = None  # noqa: UP007
        space: Union[str, None, Literal[False]] = None  # noqa: UP007

    (got,) = HfArgumentParser(Library).parse_args_into_dataclasses(
        ["--prompts", '{"q": "query: "}', "--space", "s"]
    )
    assert got.prompts == '{"q": "query: "}' and got.space == "s"
    (default,) = HfArgumentParser(Library).parse_args_into_dataclasses([])
    assert default.prompts is None and default.space is None


@pytest.mark.parametrize("parser_module", ["transformers.hf_argparser", "trl.scripts._hf_argparser"])
def test_upstreams_parsers_read_trainwrights_arguments(parser_module):
    """TRL's scripts parse their configs with their own copy of transformers' parser: every field of
    trainwright's arguments is declared so that it reads them, as it reads transformers'."""
    from trainwright import Seq2SeqTrainingArguments, TrainingArguments

    module = pytest.importorskip(parser_module)
    for cls in (TrainingArguments, Seq2SeqTrainingArguments):
        (args,) = module.HfArgumentParser(cls).parse_args_into_dataclasses(
            [
                "--output_dir",
                "x",
                "--lr_scheduler_kwargs",
                '{"num_cycles": 2}',
                "--gradient_checkpointing",
                "true",
            ]
        )
        assert isinstance(args, cls) and args.lr_scheduler_kwargs == {"num_cycles": 2}
        assert args.gradient_checkpointing is True and args.activation_checkpointing is True
