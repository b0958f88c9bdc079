"""`trainwright.patch_transformers()` and `trainwright run SCRIPT.py`: transformers' Trainer family
replaced in every module for what is imported afterwards (idempotent), refused with the import order
to fix when a library or script took transformers' classes first, and unchanged scripts run as
`python SCRIPT.py` would run them (argv, `__main__`, the script's folder on the path, its exit code),
under torchrun too. Every case runs in a process of its own: the patch is process-wide."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from kit.torchrun import torchrun_command

pytest.importorskip("transformers")

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )


def test_patch_replaces_the_classes_in_every_module_and_is_idempotent():
    proc = python(
        """
        import trainwright
        trainwright.patch_transformers()
        trainwright.patch_transformers()
        import transformers, transformers.trainer, transformers.training_args, transformers.hf_argparser
        import transformers.trainer_seq2seq, transformers.training_args_seq2seq
        for module, name in [(transformers, "Trainer"), (transformers.trainer, "Trainer"),
                             (transformers, "TrainingArguments"), (transformers.training_args, "TrainingArguments"),
                             (transformers, "Seq2SeqTrainer"), (transformers.trainer_seq2seq, "Seq2SeqTrainer"),
                             (transformers.training_args_seq2seq, "Seq2SeqTrainingArguments"),
                             (transformers, "HfArgumentParser"), (transformers.hf_argparser, "HfArgumentParser")]:
            assert getattr(module, name) is getattr(trainwright, name), (module.__name__, name)
        from transformers import Trainer
        assert Trainer is trainwright.Trainer
        from trl import SFTTrainer, SFTConfig
        assert issubclass(SFTTrainer, trainwright.Trainer) and issubclass(SFTConfig, trainwright.TrainingArguments)
        print("patched")
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "patched" in proc.stdout


@pytest.mark.parametrize(
    "first,names",
    [
        ("from transformers import Trainer", "__main__: Trainer"),
        ("import trl; from trl import DPOTrainer", "trl.trainer.dpo_trainer: DPOTrainer"),
    ],
)
def test_a_patch_after_a_library_took_the_classes_is_refused_and_changes_nothing(first, names):
    proc = python(
        f"""
        {first}
        import transformers, trainwright
        try:
            trainwright.patch_transformers()
        except trainwright.PatchTooLateError as exc:
            print("REFUSED", exc)
        assert transformers.trainer.Trainer.__module__ == "transformers.trainer"  # still transformers'
        assert transformers.Trainer is transformers.trainer.Trainer
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "REFUSED" in proc.stdout and names in proc.stdout
    assert "before importing" in proc.stdout and "trainwright run" in proc.stdout


REGISTRY = """
import transformers

TRAINERS = {"hf": transformers.Trainer}
ARGUMENTS = [transformers.TrainingArguments, transformers.Seq2SeqTrainingArguments]


def seq2seq(cls=transformers.Seq2SeqTrainer):
    return cls


def make_trainer(**kwargs):
    return TRAINERS["hf"](**kwargs)
"""


def test_transformers_classes_held_out_of_the_patchs_reach_refuse_to_be_built(tmp_path):
    """A library's registry (a dict, a list, a default argument) keeps transformers' classes where the
    patch's look cannot see them: built after the patch, each refuses, naming the import order (and
    the module building it), instead of training on transformers. A subclass refuses too; the
    package as a script imported it before the patch gives trainwright's classes, and an object
    built before the patch still copies and converts."""
    (tmp_path / "registry.py").write_text(REGISTRY)
    proc = python(
        f"""
        import copy, dataclasses, sys
        sys.path.insert(0, {str(tmp_path)!r})
        import torch, transformers
        import registry
        before = transformers.TrainingArguments(output_dir={str(tmp_path / "o")!r}, report_to="none", use_cpu=True)
        import trainwright
        trainwright.patch_transformers()

        @dataclasses.dataclass
        class Mine(registry.ARGUMENTS[0]):
            mine: int = 1

        model = torch.nn.Linear(1, 1)
        for name, build in {{
            "Trainer": lambda: registry.TRAINERS["hf"](model=model),
            "TrainingArguments": lambda: registry.ARGUMENTS[0](output_dir="x"),
            "Seq2SeqTrainingArguments": lambda: registry.ARGUMENTS[1](output_dir="x"),
            "Seq2SeqTrainer": lambda: registry.seq2seq()(model=model),
            "subclass": lambda: Mine(output_dir="x"),
            "in the registry": lambda: registry.make_trainer(model=model),
        }}.items():
            try:
                build()
                print("BUILT", name)
            except trainwright.PatchTooLateError as exc:
                print("REFUSED", name, "|", exc)
        assert transformers.TrainingArguments is trainwright.TrainingArguments
        assert transformers.Trainer is trainwright.Trainer
        copy.deepcopy(before)
        assert trainwright.Trainer(model=model, args=before).args.use_cpu
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    refused = dict(line.split(" | ") for line in proc.stdout.splitlines() if line.startswith("REFUSED"))
    assert "BUILT" not in proc.stdout and len(refused) == 6, proc.stdout
    for line, message in refused.items():
        assert "after trainwright.patch_transformers()" in message and "trainwright run" in message, line
    assert "Call trainwright.patch_transformers() first thing in the script" in refused["REFUSED Trainer"]
    assert "__main__.Mine is transformers' own TrainingArguments" in refused["REFUSED subclass"]
    assert "before importing registry" in refused["REFUSED in the registry"]


SCRIPT = """
import sys
from dataclasses import dataclass, field

import torch
from transformers import HfArgumentParser, Trainer, TrainingArguments

import helper  # beside the script: its folder is first on sys.path


@dataclass
class Extra:
    exit_code: int = field(default=0)


class Line(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x, labels=None):
        return {"loss": ((x * self.w - labels) ** 2).mean()}


assert __name__ == "__main__"
extra, args = HfArgumentParser((Extra, TrainingArguments)).parse_args_into_dataclasses()
torch.manual_seed(0)
data = [{"x": torch.tensor(float(i)), "labels": torch.tensor(2.0 * i)} for i in range(16)]
trainer = Trainer(model=Line(), args=args, train_dataset=data)
trainer.train()
print("TRAINER", type(trainer).__module__, helper.NAME, flush=True)
print("LOSSES", [round(r["loss"], 6) for r in trainer.state.log_history if "loss" in r], flush=True)
sys.exit(extra.exit_code)
"""


@pytest.fixture
def script(tmp_path):
    (tmp_path / "helper.py").write_text("NAME = 'helper'\n")
    (tmp_path / "train.py").write_text(SCRIPT)
    return str(tmp_path / "train.py")


def _flags(tmp_path, name: str) -> list[str]:
    return [
        "--output_dir",
        str(tmp_path / name),
        "--max_steps",
        "4",
        "--per_device_train_batch_size",
        "4",
        "--logging_steps",
        "1",
        "--report_to",
        "none",
        "--use_cpu",
        "--save_strategy",
        "no",
        "--learning_rate",
        "0.01",
    ]


def _lines(out: str, tag: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(tag))


def test_trainwright_run_runs_an_unchanged_script_as_python_does(script, tmp_path):
    plain = subprocess.run(
        [sys.executable, script, *_flags(tmp_path, "hf")],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    ours = subprocess.run(
        [sys.executable, "-m", "trainwright", "run", script, *_flags(tmp_path, "tw"), "--exit_code", "3"],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert ours.returncode == 3, ours.stderr[-3000:]  # the script's own exit code
    assert _lines(plain.stdout, "TRAINER") == "TRAINER transformers.trainer helper"
    assert _lines(ours.stdout, "TRAINER") == "TRAINER trainwright.loop.trainer helper"
    assert _lines(ours.stdout, "LOSSES") == _lines(plain.stdout, "LOSSES")


PROBE = """
import json, os, sys

here = os.path.dirname(__file__)
os.chdir(os.path.dirname(here))  # a script that changes folder finds its neighbours by __file__
with open(os.path.join(here, "neighbour.txt")) as f:
    neighbour = f.read()
seen = {"argv": sys.argv, "file": __file__, "path": sys.path, "name": __name__, "neighbour": neighbour,
        "spec": getattr(__spec__, "name", None), "package": __package__}
print("PROBE", json.dumps(seen))
transformers = sys.modules.get("transformers")
print("TRAINER", transformers.Trainer.__module__ if transformers else None, flush=True)


def fail():
    raise RuntimeError("the script failed")


if "--fail" in sys.argv:
    fail()
"""


def _traceback(stderr: str) -> str:
    return stderr[stderr.index("Traceback (most recent call last):") :]


@pytest.mark.parametrize(
    "launcher,target",
    [("entry", ["sub/probe.py"]), ("module", ["-m", "pkg.probe"]), ("entry", ["appdir"])],
    ids=["script", "module", "folder"],
)
def test_trainwright_run_sets_the_script_up_and_reports_its_error_as_python_does(tmp_path, launcher, target):
    """`python SCRIPT.py`, `python -m MODULE`, `python DIR` beside `trainwright run` of the same, from
    the console script and from `python -m trainwright`: the same sys.argv, absolute `__file__`,
    sys.path (the script's folder, the working folder, the folder, in place of trainwright's own),
    `__spec__`, traceback (no frame of trainwright's or runpy's that Python does not show) and exit
    code, with transformers' Trainer trainwright's."""
    for folder, name in [("sub", "probe.py"), ("pkg", "probe.py"), ("appdir", "__main__.py")]:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / name).write_text(PROBE)
        (tmp_path / folder / "neighbour.txt").write_text(folder)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    ours = {
        "entry": [os.path.join(os.path.dirname(sys.executable), "trainwright"), "run"],
        "module": [sys.executable, "-m", "trainwright", "run"],
    }[launcher]
    runs = {
        who: subprocess.run(
            [*command, *target, "a", "--fail"],
            capture_output=True,
            text=True,
            timeout=300,
            env=ENV,
            cwd=tmp_path,
        )
        for who, command in [("python", [sys.executable]), ("trainwright", ours)]
    }
    python_run, our_run = runs["python"], runs["trainwright"]
    assert python_run.returncode == our_run.returncode == 1, our_run.stderr[-3000:]
    assert _lines(our_run.stdout, "PROBE") == _lines(python_run.stdout, "PROBE")
    assert _lines(our_run.stdout, "TRAINER") == "TRAINER trainwright.loop.trainer"
    assert _traceback(our_run.stderr) == _traceback(python_run.stderr)
    assert (
        _traceback(our_run.stderr).count("File ")
        == (2 if launcher == "module" or target == ["appdir"] else 0) + 2
    )


def test_trainwright_run_errors_and_usage(tmp_path):
    """A module that is not there (in a package that is, or not even its package): python's one line
    and exit code 1; a missing script: one line, 2."""
    entry = os.path.join(os.path.dirname(sys.executable), "trainwright")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    for module in ["pkg.nothere", "nothere.either"]:
        runs = [
            subprocess.run(
                [*command, "-m", module], capture_output=True, text=True, timeout=300, env=ENV, cwd=tmp_path
            )
            for command in [[sys.executable], [entry, "run"]]
        ]
        python_run, our_run = runs
        said = python_run.stderr.strip().removeprefix(f"{sys.executable}: ")
        assert python_run.returncode == our_run.returncode == 1 and module in said
        # (the last line: importing transformers may log a line of its own before)
        assert our_run.stderr.strip().splitlines()[-1] == f"trainwright run: error: {said}"
        assert "Traceback" not in our_run.stderr
    missing = subprocess.run(
        [entry, "run", str(tmp_path / "nope.py")], capture_output=True, text=True, env=ENV
    )
    assert (
        missing.returncode == 2
        and missing.stderr.strip() == f"trainwright run: error: {tmp_path / 'nope.py'}: no such file"
    )
    assert subprocess.run([entry, "run"], capture_output=True, text=True, env=ENV).returncode == 2


def test_trainwright_run_under_torchrun(script, tmp_path):
    proc = subprocess.run(
        [
            *torchrun_command(),
            f"--log-dir={tmp_path / 'logs'}",
            "--redirects=1",  # each rank's stdout in a file of its own: lines from two processes interleave in one pipe
            "-m",
            "trainwright",
            "run",
            script,
            *_flags(tmp_path, "ddp"),
            "--ddp_backend",
            "gloo",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**ENV, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    outs = [path.read_text() for path in sorted((tmp_path / "logs").rglob("stdout.log"))]
    assert len(outs) == 2
    for out in outs:  # both processes
        assert _lines(out, "TRAINER") == "TRAINER trainwright.loop.trainer helper"
