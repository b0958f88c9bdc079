"""HfArgumentParser's other sources of values: args files, a config file on the command line, and
parse_dict / parse_json_file / parse_yaml_file, with their precedence and errors."""

import json
import sys
from dataclasses import dataclass

import pytest
import yaml
from args_kit import Choices, Color, Containers, Mode, Model, Scalars, Train, parse

from trainwright.args.parser import HfArgumentParser

# ---------------------------------------------------------------- args files


def test_script_args_file_is_read_and_command_line_wins(monkeypatch, tmp_path):
    (tmp_path / "train.args").write_text("# defaults\n--epochs 3 --run_name 'from file'\n")
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "train.py")])
    parser = HfArgumentParser(Train)
    (t,) = parser.parse_args_into_dataclasses(["--epochs", "9"])
    assert (t.epochs, t.run_name) == (9, "from file")
    (t,) = parser.parse_args_into_dataclasses([], look_for_args_file=False)
    assert (t.epochs, t.run_name) == (1, "run")


def test_args_filename_replaces_the_script_file(monkeypatch, tmp_path):
    (tmp_path / "train.args").write_text("--epochs 3")
    (tmp_path / "other.args").write_text("--learning_rate 0.25")
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "train.py")])
    (t,) = HfArgumentParser(Train).parse_args_into_dataclasses([], args_filename=tmp_path / "other.args")
    assert (t.epochs, t.learning_rate) == (1, 0.25)


def test_args_file_flag_files_later_override_earlier_and_cli_wins(tmp_path):
    (tmp_path / "a.args").write_text("--epochs 2 --learning_rate 0.1 --run_name a")
    (tmp_path / "b.args").write_text("--epochs 3 --learning_rate 0.2")
    argv = [
        "--args_file",
        str(tmp_path / "a.args"),
        f"--args_file={tmp_path / 'b.args'}",
        "--learning_rate",
        "0.3",
    ]
    (t,) = parse(Train, argv, args_file_flag="--args_file")
    assert (t.epochs, t.learning_rate, t.run_name) == (3, 0.3, "a")


def test_missing_named_args_file_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="args file not found: .*nope.args"):
        parse(Train, [], args_filename=tmp_path / "nope.args")
    with pytest.raises(FileNotFoundError, match="nope2.args"):
        parse(Train, ["--af", str(tmp_path / "nope2.args")], args_file_flag="--af")


# ---------------------------------------------------------------- config file on the command line


def test_positional_yaml_config_with_flag_override(tmp_path):
    cfg = tmp_path / "config.yaml"
    # YAML reads 1e-4 as a string; the float field still gets a float.
    cfg.write_text("learning_rate: 1e-4\nepochs: 5\nhidden: 12\n")
    t, m = parse([Train, Model], [str(cfg), "--epochs", "6"])
    assert (t.learning_rate, t.epochs, m.hidden) == (1e-4, 6, 12)
    assert isinstance(t.learning_rate, float)


@pytest.mark.parametrize("form", ["separate", "equals"])
def test_config_flag_with_json(tmp_path, form):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"epochs": 8, "run_name": "cfg"}))
    argv = ["--config", str(cfg)] if form == "separate" else [f"--config={cfg}"]
    (t,) = parse(Train, [*argv, "--run_name", "cli"])
    assert (t.epochs, t.run_name) == (8, "cli")


def test_config_supplies_required_fields_and_enum_strings(tmp_path):
    cfg = tmp_path / "c.yml"
    cfg.write_text("name: from-config\ncolor: green\nsteps: '4'\n")
    s, c = parse([Scalars, Choices], [str(cfg)])
    assert (s.name, s.steps, c.color) == ("from-config", 4, "green")
    # Required-ness is restored afterwards.
    with pytest.raises(SystemExit):
        parse([Scalars, Choices], [])


def test_precedence_defaults_config_argsfile_cli(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("epochs: 2\nlearning_rate: 0.2\nrun_name: cfg\n")
    af = tmp_path / "x.args"
    af.write_text("--learning_rate 0.3 --run_name file")
    (t,) = parse(Train, [str(cfg), "--run_name", "cli"], args_filename=af)
    assert (t.epochs, t.learning_rate, t.run_name) == (2, 0.3, "cli")


def test_config_unknown_keys_name_file_and_keys(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("learning_rat: 0.1\nzzz: 1\n")
    with pytest.raises(ValueError, match=r"\['learning_rat', 'zzz'\].*bad\.yaml.*'learning_rate'"):
        parse(Train, [str(cfg)])


def test_config_bad_value_and_bad_file(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("epochs: many\n")
    with pytest.raises(ValueError, match=r"c\.yaml: invalid value 'many' for 'epochs'"):
        parse(Train, [str(cfg)])
    cfg.write_text("- a list\n")
    with pytest.raises(ValueError, match=r"c\.yaml: expected a mapping"):
        parse(Train, [str(cfg)])
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        parse(Train, [str(tmp_path / "missing.yaml")])


def test_config_field_named_config_is_a_normal_option(tmp_path):
    @dataclass
    class WithConfig:
        config: str = "none"

    (w,) = parse(WithConfig, ["--config", "x.yaml"])
    assert w.config == "x.yaml"


def test_user_positional_is_not_taken_for_a_config(tmp_path):
    parser = HfArgumentParser(Train)
    parser.add_argument("data")
    t, ns = parser.parse_args_into_dataclasses(["data.json", "--epochs", "2"], look_for_args_file=False)
    assert ns.data == "data.json" and t.epochs == 2


# ---------------------------------------------------------------- parse_dict / json / yaml


def test_parse_dict_builds_and_coerces():
    t, c = HfArgumentParser([Train, Choices]).parse_dict(
        {"learning_rate": "2e-5", "color": "green", "mode": "slow", "palette": ["green"]}
    )
    assert t.learning_rate == 2e-5 and c.color == "green" and c.palette == [Color.GREEN]
    # `Mode | str` accepts strings, so the dataclass receives the string as given.
    assert c.mode == "slow"
    (c,) = HfArgumentParser(Choices).parse_dict({"speed": Mode.FAST})
    assert c.speed is Mode.FAST


def test_parse_dict_extra_keys():
    parser = HfArgumentParser(Train)
    with pytest.raises(ValueError, match=r"not used by the HfArgumentParser: \['epoch', 'internal'\]"):
        parser.parse_dict({"epoch": 3, "internal": 1})
    (t,) = parser.parse_dict({"epochs": 3, "unrelated": 1}, allow_extra_keys=True)
    assert t.epochs == 3


def test_parse_dict_errors_name_field_and_type():
    parser = HfArgumentParser(Choices)
    with pytest.raises(ValueError, match=r"invalid value 'blue' for 'color'.*red, green"):
        parser.parse_dict({"color": "blue"})
    with pytest.raises(TypeError, match="expected a mapping"):
        parser.parse_dict(["color"])


def test_parse_json_file(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"epochs": 4, "hidden": 2}))
    t, m = HfArgumentParser([Train, Model]).parse_json_file(path)
    assert (t.epochs, m.hidden) == (4, 2)
    path.write_text(json.dumps({"epochs": 4, "nope": 1}))
    with pytest.raises(ValueError, match=r"\['nope'\].*a\.json"):
        HfArgumentParser(Train).parse_json_file(path)
    assert HfArgumentParser(Train).parse_json_file(path, allow_extra_keys=True)[0].epochs == 4
    path.write_text("{oops")
    with pytest.raises(ValueError, match=r"a\.json is not valid JSON"):
        HfArgumentParser(Train).parse_json_file(path)


def test_parse_yaml_file(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump({"learning_rate": 0.5, "tags": ["p", "q"], "extra": {"k": 1}}))
    t, c = HfArgumentParser([Train, Containers]).parse_yaml_file(str(path))
    assert t.learning_rate == 0.5 and c.tags == ["p", "q"] and c.extra == {"k": 1}
    path.write_text("epochs: 2\nbogus: 1\n")
    with pytest.raises(ValueError, match=r"\['bogus'\]"):
        HfArgumentParser(Train).parse_yaml_file(path)
    assert HfArgumentParser(Train).parse_yaml_file(path, allow_extra_keys=True)[0].epochs == 2
    path.write_text("")
    assert HfArgumentParser(Train).parse_yaml_file(path)[0] == Train()


# ---------------------------------------------------------------- TrainingArguments round trip


def test_training_arguments_round_trip(tmp_path):
    args_mod = pytest.importorskip("trainwright.args.training_args")
    parser = HfArgumentParser(args_mod.TrainingArguments)
    out = str(tmp_path / "out")
    (ta,) = parser.parse_args_into_dataclasses(
        [
            "--output_dir",
            out,
            "--learning_rate",
            "3e-4",
            "--eval_strategy",
            "steps",
            "--no_remove_unused_columns",
            "--report_to",
            "none",
        ],
        look_for_args_file=False,
    )
    assert ta.output_dir == out
    assert ta.learning_rate == 3e-4
    assert str(getattr(ta.eval_strategy, "value", ta.eval_strategy)) == "steps"
    assert ta.remove_unused_columns is False
    assert ta.report_to == []
    (again,) = parser.parse_dict(ta.to_dict())
    assert again.to_dict() == ta.to_dict()
