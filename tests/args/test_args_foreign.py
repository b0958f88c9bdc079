"""transformers' own `TrainingArguments` handed to trainwright's Trainer (`args/foreign.py`): what the
user set is honoured and what they left at transformers' default takes trainwright's (the preemption
save stays on), changes made to the object after `Trainer(...)` count as they do on transformers'
Trainer, and a subclass that overrides behaviour is refused rather than copied without it."""

from __future__ import annotations

import dataclasses
import os
import signal

import pytest
from kit import faults

from trainwright import Trainer
from trainwright import TrainingArguments as OurArguments

transformers = pytest.importorskip("transformers")


def hf_args(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        max_steps=6,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        learning_rate=0.01,
    )
    return transformers.TrainingArguments(**{**base, **kw})


def test_transformers_arguments_keep_the_preemption_save_unless_turned_off(tmp_path, jobs):
    """transformers' `enable_jit_checkpoint=False` is its default, not a choice: SIGTERM from outside
    saves a checkpoint and exits 0, as with trainwright's own arguments. Passed explicitly, it is the
    user's: the run dies of the signal, as on transformers. (Both jobs run at once.)"""
    runs = {
        "default": jobs({"output_dir": str(tmp_path / "default"), "max_steps": 400, "step_sleep": 0.02, "hf_args": {}}),
        "off": jobs(
            {"output_dir": str(tmp_path / "off"), "max_steps": 400, "step_sleep": 0.02,
             "hf_args": {"enable_jit_checkpoint": False}}
        ),
    }  # fmt: skip
    for job in runs.values():
        job.wait_for("STEP 4")
        os.kill(job.proc.pid, signal.SIGTERM)
    code, _, stderr = runs["default"].finish()
    assert code == 0 and "Preempted by SIGTERM: checkpoint written, exiting." in stderr, stderr[-3000:]
    assert len([p for p in os.listdir(tmp_path / "default") if p.startswith("checkpoint-")]) == 1
    code, _, stderr = runs["off"].finish()
    assert code == -signal.SIGTERM, stderr[-3000:]
    assert not (tmp_path / "off").exists() or not os.listdir(tmp_path / "off")


def test_changes_to_the_arguments_after_the_trainer_is_built_count(tmp_path):
    """`args.max_steps = 3` after `Trainer(args=args)`: transformers' Trainer (which keeps the object)
    trains 3 steps, and so does trainwright's; the Trainer's own change to its arguments stays, and a
    bad change is refused naming the field."""
    data = faults.Data(64)
    theirs = hf_args(tmp_path / "hf")
    upstream = transformers.Trainer(model=faults.Net(8), args=theirs, train_dataset=data)
    theirs.max_steps = 3
    assert upstream.train().global_step == 3

    args = hf_args(tmp_path)
    trainer = Trainer(model=faults.Net(8), args=args, train_dataset=data, eval_dataset=faults.Data(8))
    trainer.args.logging_steps = 2  # set on the Trainer's arguments: left alone by the user's changes
    args.max_steps = 3
    args.learning_rate = 0.5
    assert trainer.train().global_step == 3
    assert trainer.args.learning_rate == 0.5 and trainer.args.logging_steps == 2
    args.per_device_eval_batch_size = 2
    trainer.evaluate()
    assert trainer.args.per_device_eval_batch_size == 2
    args.save_strategy = "sometimes"
    with pytest.raises(ValueError, match="save_strategy"):
        trainer.train()


def test_a_subclass_that_overrides_behaviour_is_refused_naming_it(tmp_path):
    """A field by field copy would drop a subclass's property or method: refused, naming them and the
    fix. A subclass that only changes a field's default is converted with its default."""

    class Wider(transformers.TrainingArguments):
        @property
        def train_batch_size(self) -> int:
            return 2 * self.per_device_train_batch_size

        def get_warmup_steps(self, num_training_steps: int) -> int:
            return 1

    with pytest.raises(
        TypeError, match=r"overrides get_warmup_steps, train_batch_size.*trainwright\.TrainingArguments"
    ):
        Trainer(model=faults.Net(8), args=Wider(output_dir=str(tmp_path), report_to="none", use_cpu=True))

    @dataclasses.dataclass
    class Slower(transformers.TrainingArguments):
        learning_rate: float = 1e-4

    trainer = Trainer(
        model=faults.Net(8), args=Slower(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    )
    assert isinstance(trainer.args, OurArguments) and trainer.args.learning_rate == 1e-4


def test_seq2seq_arguments_convert_with_their_own_fields(tmp_path):
    args = transformers.Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, predict_with_generate=True
    )
    converted = Trainer(model=faults.Net(8), args=args).args
    assert type(converted).__name__ == "Seq2SeqTrainingArguments" and converted.predict_with_generate is True
    assert "SIGTERM" in converted.preemption_signals and converted.learning_rate == args.learning_rate


def test_arguments_parsed_by_transformers_parser_keep_the_preemption_save(tmp_path):
    """transformers' HfArgumentParser passes every field to the constructor: only what differs from
    transformers' default (given on the command line or not) is a choice; a value on the command line
    equal to the default cannot be told from it."""
    parser = transformers.HfArgumentParser((transformers.TrainingArguments,))
    (args,) = parser.parse_args_into_dataclasses(
        args=["--output_dir", str(tmp_path), "--learning_rate", "0.5"]
    )
    converted = Trainer(model=faults.Net(8), args=args).args
    assert "SIGTERM" in converted.preemption_signals and converted.learning_rate == 0.5
    explicit = transformers.TrainingArguments(output_dir=str(tmp_path), enable_jit_checkpoint=False)
    assert Trainer(model=faults.Net(8), args=explicit).args.preemption_signals == []
