"""The command line: demo, train from a config with flag overrides, help."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from trainwright.app.cli import main


def test_help_and_unknown_command(capsys):
    assert main(["--help"]) == 0
    assert "demo" in capsys.readouterr().out
    assert main(["frobnicate"]) == 2


def test_demo_runs_a_real_short_training(tmp_path):
    from trainwright.app.demo import run_demo

    summary = run_demo(
        output_dir=str(tmp_path / "demo"), max_steps=30, eval_steps=30, save_steps=30, logging_steps=10
    )
    assert summary["steps"] == 30
    assert summary["eval_loss_after"] < summary["eval_loss_before"] - 1.0  # bytes: ~5.5 -> clearly lower
    with open(os.path.join(tmp_path, "demo", "trainer_state.json")) as f:
        evaluations = [r["step"] for r in json.load(f)["log_history"] if "eval_loss" in r]
    assert evaluations == [30]  # the one at the last step, not run (and printed) a second time
    for name in (
        "model.safetensors",
        "trainer_state.json",
        "all_results.json",
        "logs.jsonl",
        "checkpoint-30",
    ):
        assert os.path.exists(os.path.join(tmp_path, "demo", name)), name


def test_train_command_from_yaml_with_flag_override(tmp_path):
    text = "the quick brown fox jumps over the lazy dog. " * 200
    (tmp_path / "train.txt").write_text(text)
    with open(tmp_path / "valid.jsonl", "w") as f:
        for i in range(20):
            f.write(json.dumps({"text": f"the lazy dog number {i} sleeps. " * 3}) + "\n")
    config = {
        "model_type": "tinygpt",
        "model_config": {"n_layer": 1, "n_embd": 32, "n_head": 2, "dropout": 0.0},
        "train_file": str(tmp_path / "train.txt"),
        "validation_file": str(tmp_path / "valid.jsonl"),
        "block_size": 32,
        "output_dir": str(tmp_path / "run"),
        "max_steps": 100,
        "per_device_train_batch_size": 8,
        "learning_rate": 3e-3,
        "report_to": "none",
        "disable_tqdm": True,
        "save_strategy": "no",
        "use_cpu": True,
    }
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "trainwright", "train", str(cfg_path), "--max_steps", "12"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "run" / "all_results.json") as f:
        results = json.load(f)
    assert "eval_loss" in results and "train_loss" in results
    with open(tmp_path / "run" / "trainer_state.json") as f:
        assert json.load(f)["global_step"] == 12  # the flag overrode the file's 100


def test_train_command_reports_a_missing_file(tmp_path):
    from trainwright.app.train_script import run_train

    with pytest.raises(FileNotFoundError, match="nope.txt"):
        run_train(
            [
                "--train_file",
                str(tmp_path / "nope.txt"),
                "--output_dir",
                str(tmp_path / "o"),
                "--report_to",
                "none",
                "--use_cpu",
            ]
        )


# -- user errors: one line and exit 2; bugs (or --debug): a traceback ------------------------------


def _trainwright(*argv, cwd=None, code: str | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", code] if code else [sys.executable, "-m", "trainwright"]
    return subprocess.run(
        [*command, *argv], capture_output=True, text=True, timeout=300, cwd=cwd, env={**os.environ}
    )


def _config(tmp_path, **values) -> str:
    (tmp_path / "train.txt").write_text("the quick brown fox jumps over the lazy dog. " * 50)
    config = {
        "model_config": {"n_layer": 1, "n_embd": 16, "n_head": 2},
        "train_file": str(tmp_path / "train.txt"),
        "block_size": 16,
        "output_dir": str(tmp_path / "run"),
        "max_steps": 2,
        "report_to": "none",
        **values,
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _one_error_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("trainwright train: error: ")]
    assert len(errors) == 1, proc.stderr
    for needle in needles:
        assert needle in errors[0]
    return errors[0]


def test_a_misspelled_config_key_is_one_line_naming_it(tmp_path):
    proc = _trainwright("train", _config(tmp_path, learnin_rate=0.1))
    _one_error_line(proc, "learnin_rate", "'learning_rate'?", "run.yaml")


def test_an_invalid_value_is_one_line_naming_the_field(tmp_path):
    proc = _trainwright("train", _config(tmp_path), "--learning_rate", "-1")
    _one_error_line(proc, "learning_rate=-1.0 is invalid")


def test_a_missing_data_file_is_one_line_naming_it(tmp_path):
    proc = _trainwright("train", _config(tmp_path, train_file=str(tmp_path / "nope.txt")))
    _one_error_line(proc, "nope.txt")
    proc = _trainwright("train", str(tmp_path / "missing.yaml"))
    _one_error_line(proc, "config file not found", "missing.yaml")


@pytest.mark.parametrize("where", ["before the command", "after the command"])
def test_debug_shows_the_traceback_of_a_user_error_which_still_exits_2(tmp_path, where):
    config = _config(tmp_path, train_file=str(tmp_path / "nope.txt"))
    argv = ("--debug", "train", config) if where == "before the command" else ("train", "--debug", config)
    proc = _trainwright(*argv)
    assert proc.returncode == 2, proc.stderr[-3000:]  # a mistake in the input, shown with its traceback
    assert "Traceback" in proc.stderr and "FileNotFoundError" in proc.stderr and "nope.txt" in proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1].startswith("trainwright train: error: ")
    assert "debug=" not in proc.stderr  # not read as TrainingArguments' debug field


def test_debug_with_one_of_its_options_is_the_training_arguments_field():
    from trainwright.app.cli import _debug_flag

    argv = ["train", "run.yaml", "--debug", "underflow_overflow", "--max_steps", "3"]
    assert _debug_flag(argv) == (False, argv)
    assert _debug_flag(["train", "run.yaml", "--debug", "--max_steps", "3"]) == (
        True,
        ["train", "run.yaml", "--max_steps", "3"],
    )
    assert _debug_flag(["run", "script.py", "--debug"]) == (False, ["run", "script.py", "--debug"])
    assert _debug_flag(["--debug", "train", "--debug", "run.yaml"]) == (True, ["train", "run.yaml"])
    assert _debug_flag(["--debug", "run", "script.py", "--debug"]) == (True, ["run", "script.py", "--debug"])


def test_a_yaml_syntax_error_is_one_line_naming_the_file_line_and_column(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("model_type: gpt2\nmodel_config: {n_layer: 1\ntrain_file: train.txt\n")
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"trainwright train: error: {path} is not valid YAML at line 3 column 11: expected ',' or '}}', but "
        "got ':' (while parsing a flow mapping at line 2 column 15)"
    ]


def test_a_tokenizer_folder_without_a_tokenizer_is_one_line_naming_it(tmp_path, capsys):
    pytest.importorskip("transformers")
    (tmp_path / "empty").mkdir()
    model = tmp_path / "model"  # a model's folder: transformers makes a tokenizer of 1 token from it
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    for folder, holds in ((tmp_path / "empty", "the folder is empty"), (model, "it holds config.json")):
        assert main(["train", _config(tmp_path, tokenizer_name_or_path=str(folder))]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line == (
            f"trainwright train: error: tokenizer_name_or_path={str(folder)!r} holds no tokenizer: none of "
            f"tokenizer.json, tokenizer_config.json or a vocabulary file is there ({holds}). Give the folder "
            "a tokenizer's save_pretrained(folder) wrote."
        )
    # a tokenizer config without its vocabulary: a tokenizer of one token, or transformers' 5-line reason
    for name, config, says in (
        ("one_token", {"tokenizer_class": "GPT2Tokenizer"}, "the tokenizer loaded from it has 1 token(s)"),
        ("unloadable", {}, "transformers cannot load a tokenizer from this folder: Couldn't instantiate"),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tokenizer_config.json").write_text(json.dumps(config))
        assert main(["train", _config(tmp_path, tokenizer_name_or_path=str(tmp_path / name))]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f"trainwright train: error: tokenizer_name_or_path={str(tmp_path / name)!r}: ")
        assert says in line


def test_a_bug_keeps_its_traceback(tmp_path):
    code = (
        "import sys\n"
        "import trainwright.app.cli as cli\n"
        "def broken(rest):\n"
        "    raise AttributeError('a bug in trainwright')\n"
        "cli.COMMANDS['train'] = broken\n"
        "raise SystemExit(cli.main(sys.argv[1:]))\n"
    )
    proc = _trainwright("train", "x.yaml", code=code)
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "AttributeError: a bug in trainwright" in proc.stderr


def test_plot_of_a_missing_folder_is_one_line(tmp_path):
    proc = _trainwright("plot", str(tmp_path / "nope"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"trainwright plot: error: {tmp_path / 'nope'} is not a folder."
    ]


def test_train_help_shows_the_config_keys_first():
    proc = _trainwright("train", "--help")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "usage: trainwright train CONFIG.yaml|json [--KEY VALUE ...]"
    text = proc.stdout
    keys = text.index("config keys (docs/train_config.md")
    groups = [
        text.index(title)
        for title in ("model (config keys):", "data (config keys):", "training (config keys")
    ]
    assert keys < groups[0] < groups[1] < groups[2] < text.index("--learning_rate")
    for key in ("model_type", "model_config", "train_file", "validation_file", "block_size"):
        assert text.index(key) < groups[0]  # named in the summary at the top


GPT2_SMALL = {"n_layer": 1, "n_embd": 16, "n_head": 2, "n_positions": 32}


@pytest.mark.parametrize(
    ("values", "needles"),
    [
        ({"report_to": 5}, ["report_to=5 is invalid"]),
        ({"output_dir": 123}, ["output_dir=123 is invalid"]),
        ({"block_size": 0}, ["block_size=0", "integer >= 1"]),
        ({"block_size": -4}, ["block_size=-4"]),
        (
            {"model_type": "gpt2", "model_config": GPT2_SMALL, "block_size": 64},
            ["block_size=64", "32 positions"],
        ),
        ({"model_type": "gpt2", "model_config": {"n_layerz": 1}}, ["n_layerz", "'n_layer'?", "gpt2"]),
        ({"model_config": {"n_layerz": 1}}, ["n_layerz", "'n_layer'?", "tinygpt"]),
        ({"model_type": "gpt2", "model_config": {"n_embd": 15, "n_head": 2}}, ["divisible"]),
        (
            {"model_type": "gpt2", "model_config": {"n_layer": 1, "n_embd": 16, "n_head": 3}},
            ["model_type='gpt2'", "'n_embd': 16, 'n_head': 3", "divisible"],
        ),
        (  # transformers 5's config validators: huggingface_hub's error of several lines, exit 1
            {
                "model_type": "llama",
                "model_config": {"num_hidden_layers": 1, "hidden_size": 16, "num_attention_heads": 3},
            },
            ["'hidden_size': 16, 'num_attention_heads': 3", "The hidden size (16) is not a multiple"],
        ),
        ({"model_type": "gpt2", "model_config": {"n_embd": "abc"}}, ["Field 'n_embd' expected int"]),
        (
            {"model_type": "gpt2", "model_config": {"n_head": 0}},
            ["'n_head': 0", "division or modulo by zero"],
        ),
        (
            {"model_config": {"n_layer": 1, "n_embd": 16, "n_head": 3}},  # tinygpt: was a 36-line traceback
            ["model_type='tinygpt'", "n_embd=16 is not divisible by n_head=3"],
        ),
        ({"model_config": {"n_layer": 0}}, ["n_layer=0 is invalid"]),
        ({"model_config": 5}, ["model_config=5", "mapping"]),
        ({"model_type": "gtp2"}, ["model_type='gtp2'", "'gpt2'"]),
        ({"model_type": "tinygtp"}, ["model_type='tinygtp'", "'tinygpt'"]),
        ({"model_type": "notamodel"}, ["model_type='notamodel'", "causal-LM", "(tinygpt, gpt2, llama"]),
        ({"model_type": "t5"}, ["model_type='t5' has no causal language model"]),
    ],
    ids=lambda v: str(v)[:40],
)
def test_input_mistakes_are_one_line_and_exit_2(tmp_path, capsys, values, needles):
    pytest.importorskip("transformers")
    assert main(["train", _config(tmp_path, **values)]) == 2  # a bug would raise out of main instead
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("trainwright train: error: ")]
    assert len(errors) == 1, err[-2000:]
    assert all(n in errors[0] for n in needles), errors[0]
    assert len(errors[0]) < 400  # not a list of every model type
    assert "Evolla" not in errors[0]  # suggestions are causal-LM types (EvollaModel is a config key)


def test_an_existing_file_as_output_dir_is_one_line(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert main(["train", _config(tmp_path, output_dir=str(tmp_path / "afile"))]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_version(capsys):
    from trainwright.core.version import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"trainwright {__version__}"


def test_a_hub_name_as_tokenizer_is_refused_in_one_line(tmp_path, capsys):
    pytest.importorskip("transformers")
    assert main(["train", _config(tmp_path, tokenizer_name_or_path="gpt2")]) == 2
    assert "tokenizer_name_or_path='gpt2' is not a local folder" in capsys.readouterr().err


def test_a_model_takes_its_special_tokens_from_the_tokenizer_and_documents_end_with_eos(tmp_path):
    transformers = pytest.importorskip("transformers")
    from kit import hf

    from trainwright.app.train_script import encode_documents

    tok_dir = str(tmp_path / "tok")
    tok = hf.train_tokenizer(tok_dir)
    with open(tmp_path / "train.jsonl", "w") as f:
        for i in range(40):
            f.write(json.dumps({"text": f"the quick brown fox number {i} jumps over the lazy dog"}) + "\n")
    small = {"n_layer": 1, "n_embd": 16, "n_head": 2, "n_positions": 32}
    config = _config(
        tmp_path,
        model_type="gpt2",
        model_config=small,
        tokenizer_name_or_path=tok_dir,
        train_file=str(tmp_path / "train.jsonl"),
    )
    assert main(["train", config]) == 0
    saved = transformers.AutoConfig.from_pretrained(str(tmp_path / "run"))
    ids = (saved.bos_token_id, saved.eos_token_id, saved.pad_token_id)
    assert ids == (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    assert all(i < saved.vocab_size for i in ids)  # not GPT-2's 50256 beside a 300-token vocabulary
    model = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "run"))
    assert model.generation_config.eos_token_id == tok.eos_token_id
    # generate() stops at EOS: make EOS the likeliest token (tied embeddings: the longest row wins when
    # the final norm outputs that row), and greedy decoding ends after one token, not at max_new_tokens
    with torch.no_grad():
        wte = model.transformer.wte.weight
        wte[tok.eos_token_id] = wte[tok.eos_token_id] * (
            10 * wte.norm(dim=1).max() / wte[tok.eos_token_id].norm()
        )
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.copy_(wte[tok.eos_token_id])
    prompt = torch.tensor([tok("the quick brown fox")["input_ids"]])
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False)
    assert out[0, prompt.shape[1] :].tolist() == [tok.eos_token_id]
    ids = encode_documents(["first text", "second text"], tok)
    assert ids.count(tok.eos_token_id) == 2 and ids[-1] == tok.eos_token_id


def test_resume_from_checkpoint_alone_takes_the_newest_and_speed_monitor_logs_throughput(tmp_path):
    config = _config(tmp_path, save_steps=1, logging_steps=2, speed_monitor=True)
    assert main(["train", config]) == 0
    assert main(["train", config, "--max_steps", "4", "--resume_from_checkpoint"]) == 0
    with open(tmp_path / "run" / "checkpoint-4" / "data_state.json") as f:
        assert json.load(f)["cursor"]["first_step_of_call"] == 2  # continued checkpoint-2
    with open(tmp_path / "run" / "trainer_state.json") as f:
        rows = json.load(f)["log_history"]
    assert any("throughput/tokens_per_sec" in r for r in rows)
    assert main(["train", config, "--max_steps", "6", "--resume_from_checkpoint", "last"]) == 0
    with open(tmp_path / "run" / "checkpoint-6" / "data_state.json") as f:
        assert json.load(f)["cursor"]["first_step_of_call"] == 4


def test_resuming_the_newest_checkpoint_of_another_run_is_refused_naming_what_differs(tmp_path, capsys):
    config = _config(tmp_path, save_steps=1)
    assert main(["train", config]) == 0
    capsys.readouterr()
    values = yaml.safe_load(open(config))
    other = str(tmp_path / "other.yaml")  # the same output_dir, another model
    with open(other, "w") as f:
        yaml.safe_dump({**values, "model_config": {"n_layer": 1, "n_embd": 32, "n_head": 2}}, f)
    checkpoint = os.path.join(str(tmp_path / "run"), "checkpoint-2")
    for argv, differs in (
        ([other], "model_config {'n_embd': 16, 'n_head': 2, 'n_layer': 1} there, {'n_embd': 32"),
        ([config, "--optim", "sgd"], "optim 'adamw_torch_fused' there, 'sgd' here"),
        ([config, "--block_size", "8"], "block_size 16 there, 8 here"),
    ):
        assert main(["train", *argv, "--max_steps", "4", "--resume_from_checkpoint", "last"]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(
            f"trainwright train: error: --resume_from_checkpoint last: {checkpoint}, the newest checkpoint in "
            f"{tmp_path / 'run'}, is another run's, written with other settings: "
        )
        assert differs in line and "another output_dir" in line
    # this run's own checkpoint resumes, and other arguments may change on a resume
    assert (
        main(["train", config, "--max_steps", "3", "--logging_steps", "1", "--resume_from_checkpoint"]) == 0
    )
    # a checkpoint named by its path resumes without the comparison, and the run records its own keys
    assert (
        main(
            [
                "train",
                config,
                "--text_column",
                "body",
                "--max_steps",
                "4",
                "--resume_from_checkpoint",
                checkpoint,
            ]
        )
        == 0
    )
    with open(tmp_path / "run" / "checkpoint-4" / "trainer_state.json") as f:
        assert json.load(f)["stateful_callbacks"]["RunRecord"]["args"]["record"]["text_column"] == "body"
