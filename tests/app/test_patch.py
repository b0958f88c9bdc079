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


def test_trainwright_run_module_form_errors_and_usage(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "job.py").write_text(
        "import sys, transformers, trainwright\n"
        "assert __name__ == '__main__' and transformers.Trainer is trainwright.Trainer\n"
        "print('ARGV', sys.argv[1:])\n"
        "raise RuntimeError('the script failed')\n"
    )
    entry = os.path.join(os.path.dirname(sys.executable), "trainwright")
    proc = subprocess.run(
        [entry, "run", "-m", "pkg.job", "a", "--b"],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
        cwd=tmp_path,
    )
    assert "ARGV ['a', '--b']" in proc.stdout
    assert proc.returncode == 1 and "RuntimeError: the script failed" in proc.stderr  # as python reports it
    missing = subprocess.run(
        [entry, "run", str(tmp_path / "nope.py")], capture_output=True, text=True, env=ENV
    )
    assert missing.returncode == 2 and "nope.py: no such file" in missing.stderr
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
