"""What transformers' own trainer tests still caught (issue 20), each behaviour written here by us.

Each test names the upstream test (transformers 5.23, tests/trainer/) it corresponds to.
"""

from __future__ import annotations

import os

import pytest
from conftest import RegressionDataset, RegressionModel
from test_upstream_behaviours import reduce_lr_on_plateau_run

from trainwright import Trainer

transformers = pytest.importorskip("transformers")


class PidRecordingDataset(RegressionDataset):
    """Appends the pid of the process that reads each item to a file (dataloader workers included)."""

    def __init__(self, log_path: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.log_path = log_path

    def __getitem__(self, i: int) -> dict:
        with open(self.log_path, "a") as f:
            f.write(f"{os.getpid()}\n")
        return super().__getitem__(i)


def _reader_pids(path) -> set[str]:
    return set(path.read_text().split())


@pytest.mark.parametrize("persistent", [True, False])
def test_persistent_workers_start_once_for_repeated_evaluations(make_args, tmp_path, persistent):
    """Upstream: test_trainer_data.py `test_get_eval_dataloader_with_persistent_workers` (and
    `_without_`): the eval loader is kept per dataset name, so three evaluations start two workers."""
    single, named = tmp_path / "single.log", tmp_path / "named.log"
    args = make_args(dataloader_num_workers=2, dataloader_persistent_workers=persistent)
    trainer = Trainer(
        model=RegressionModel(), args=args, eval_dataset=PidRecordingDataset(str(single), length=16)
    )
    for _ in range(3):
        trainer.evaluate()
    assert len(_reader_pids(single)) == (2 if persistent else 6)
    assert (trainer.get_eval_dataloader() is trainer.get_eval_dataloader(trainer.eval_dataset)) is persistent

    first, second = PidRecordingDataset(str(named), length=16), PidRecordingDataset(str(named), length=16)
    trainer = Trainer(model=RegressionModel(), args=args, eval_dataset={"first": first, "second": second})
    for _ in range(3):
        metrics = trainer.evaluate()
    assert {"eval_first_loss", "eval_second_loss"} <= set(metrics)
    assert len(_reader_pids(named)) == (4 if persistent else 12)
    assert (trainer.get_eval_dataloader("first") is trainer.get_eval_dataloader("first")) is persistent
    assert trainer.get_eval_dataloader("first") is not trainer.get_eval_dataloader("second")


def test_a_kept_eval_loader_is_never_used_for_another_dataset(make_args):
    """Upstream keys the kept loader by "eval" only, so a dataset passed in later would be evaluated
    on the first one's loader; here another dataset gets its own loader."""
    args = make_args(dataloader_num_workers=1, dataloader_persistent_workers=True)
    trainer = Trainer(model=RegressionModel(), args=args, eval_dataset=RegressionDataset(length=16))
    kept = trainer.get_eval_dataloader()
    other = RegressionDataset(length=24, seed=1)
    assert trainer.get_eval_dataloader(other).dataset is other
    assert trainer.evaluate(other)["eval_loss"] == pytest.approx(trainer.evaluate(other)["eval_loss"])
    assert len(trainer.get_eval_dataloader(other).dataset) == 24
    assert trainer.get_eval_dataloader() is not kept  # "eval" now keeps the last one built


class OneArgumentLog(Trainer):
    """A subclass written for transformers < 4.47: `log` without `start_time`."""

    def log(self, logs):
        self.rows.append(dict(logs))
        super().log(logs)


def test_a_one_argument_log_override_runs(make_args):
    """Upstream: test_trainer_optimizers.py `test_reduce_lr_on_plateau` and `test_greedy_lr`, whose
    `TrainerWithLRLogs.log(self, logs)` runs because upstream's calls fit it; here the training rows
    (the last partial window included) are passed to it with one argument too."""
    args = make_args(
        logging_steps=3, max_steps=10, eval_strategy="steps", eval_steps=5, per_device_train_batch_size=4
    )
    trainer = OneArgumentLog(
        RegressionModel(),
        args,
        train_dataset=RegressionDataset(length=64),
        eval_dataset=RegressionDataset(length=16),
    )
    trainer.rows = []
    trainer.train()
    assert [row["step"] for row in trainer.state.log_history if "loss" in row] == [3, 6, 9, 10]
    assert (
        sum("loss" in row for row in trainer.rows) == 4
        and sum("eval_loss" in row for row in trainer.rows) == 2
    )
    assert "train_runtime" in trainer.rows[-1]


def test_a_two_argument_log_override_gets_the_start_time(make_args):
    seen = []

    class NewLog(Trainer):
        def log(self, logs, start_time=None):
            seen.append(start_time)
            super().log(logs, start_time)

    trainer = NewLog(
        RegressionModel(), make_args(logging_steps=2, max_steps=4), train_dataset=RegressionDataset()
    )
    trainer.train()
    assert all(isinstance(t, float) for t in seen[:2]) and seen[-1] is None  # two windows, then train metrics


def test_reduce_lr_on_plateau_with_the_older_log(make_args):
    """Upstream: test_trainer_optimizers.py `test_reduce_lr_on_plateau`."""

    class LogsLastLr(Trainer):
        def log(self, logs):
            if hasattr(self.lr_scheduler, "_last_lr"):
                logs["learning_rate"] = self.lr_scheduler._last_lr[0]
            super().log(logs)

    trainer = reduce_lr_on_plateau_run(LogsLastLr, make_args)
    lrs = [row["learning_rate"] for row in trainer.state.log_history if "learning_rate" in row]
    assert lrs and all(b <= a for a, b in zip(lrs, lrs[1:]))


def test_messages_carry_upstreams_sentences(make_args):
    """Upstream: test_trainer_checkpointing.py `test_metric_for_best_model_behavior` (the sentence);
    test_trainer_data.py `test_label_smoothing_multi_label_incompatibility` is in
    test_upstream_behaviours.py."""
    with pytest.raises(ValueError, match="`args.metric_for_best_model` must be provided") as info:
        make_args(eval_strategy="epoch", save_strategy="best")
    assert "save_strategy='best'" in str(info.value)  # and our naming of the field


@pytest.mark.parametrize(
    "name, module",
    [("adamw_bnb_8bit", "bitsandbytes.optim"), ("adamw_anyprecision", "torchdistx.optimizers")],
)
def test_a_missing_optimizer_package_is_importerror_and_valueerror(monkeypatch, name, module):
    """Upstream: test_trainer.py `TrainerOptimizerChoiceTest.test_bnb_not_available` (ImportError),
    `test_no_torchdistx_anyprecision_adamw` and `test_fused_adam_no_apex` (ValueError)."""
    import sys

    from trainwright import TrainingArguments
    from trainwright.optim.extra import MissingOptimizerPackageError

    monkeypatch.setitem(sys.modules, module, None)
    args = TrainingArguments(output_dir="unused", optim=name, report_to="none")
    for expected in (ImportError, ValueError):
        with pytest.raises(expected) as info:
            Trainer.get_optimizer_cls_and_kwargs(args)
        assert type(info.value) is MissingOptimizerPackageError and "pip install" in str(info.value)


def test_every_checkpoint_has_training_args_bin_never_read_back(make_args, monkeypatch):
    """Upstream: test_trainer_checkpointing.py `check_saved_checkpoints` looks for training_args.bin
    in every checkpoint. Here it is the JSON's plain dict, loadable weights-only, in the manifest."""
    import json

    import torch

    import trainwright.checkpoint as ckpt

    args = make_args(max_steps=4, save_strategy="steps", save_steps=2, per_device_train_batch_size=8)
    trainer = Trainer(RegressionModel(), args, train_dataset=RegressionDataset(length=64))
    trainer.train()
    for step in (2, 4):
        folder = os.path.join(args.output_dir, f"checkpoint-{step}")
        saved = torch.load(os.path.join(folder, "training_args.bin"), weights_only=True)
        with open(os.path.join(folder, "training_args.json")) as f:
            assert saved == json.load(f)
        assert type(saved) is dict and saved["save_steps"] == 2 and saved["output_dir"] == args.output_dir
        with open(os.path.join(folder, ckpt.CHECKPOINT_COMPLETE_NAME)) as f:
            manifest = json.load(f)
        assert "training_args.bin" in manifest["files"] and "training_args.bin" in manifest["checksums"]
    # a resume reads the JSON only
    loaded: list[str] = []
    real_load = torch.load
    monkeypatch.setattr(
        torch, "load", lambda path, *a, **k: (loaded.append(str(path)), real_load(path, *a, **k))[1]
    )
    resumed = Trainer(
        RegressionModel(),
        make_args(**{**args.to_dict(), "max_steps": 6}),
        train_dataset=RegressionDataset(length=64),
    )
    resumed.train(resume_from_checkpoint=os.path.join(args.output_dir, "checkpoint-4"))
    assert any(p.endswith("optimizer.pt") for p in loaded)
    assert not any(p.endswith("training_args.bin") for p in loaded)
    # the manifest covers it: damage is caught like any other file's
    folder = os.path.join(args.output_dir, "checkpoint-2")
    data = bytearray(open(os.path.join(folder, "training_args.bin"), "rb").read())
    data[-30] ^= 0xFF
    open(os.path.join(folder, "training_args.bin"), "wb").write(bytes(data))
    assert ckpt.verify_checkpoint(folder) == [
        "training_args.bin is damaged (its checksum differs from the one recorded when it was written)"
    ]


def test_jit_checkpoint_callback_is_found_where_upstream_puts_it(make_args):
    """Upstream: test_trainer_jit_checkpoint.py `test_integration_with_trainer`,
    `test_jit_checkpoint_callback_initialization`, `test_jit_checkpoint_callback_set_trainer_enabled`
    and `_disabled`; the save itself: `SIGTERM` ends the step, writes the checkpoint, exits 0."""
    import signal

    from trainwright import TrainerCallback
    from trainwright.integrations import JITCheckpointCallback

    def found(trainer):
        return [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, JITCheckpointCallback)]

    fresh = JITCheckpointCallback()
    assert fresh.trainer is None and fresh.jit_manager is None
    data = RegressionDataset(length=64)
    for value in (None, False):  # upstream adds it only for enable_jit_checkpoint=True
        assert (
            found(Trainer(RegressionModel(), make_args(enable_jit_checkpoint=value), train_dataset=data))
            == []
        )
    off = Trainer(RegressionModel(), make_args(enable_jit_checkpoint=False), train_dataset=data)
    fresh.set_trainer(off)
    assert fresh.trainer is off and fresh.jit_manager is None
    assert (
        found(
            Trainer(
                RegressionModel(),
                make_args(enable_jit_checkpoint=True, preemption_signals=[]),
                train_dataset=data,
            )
        )
        == []
    )

    class SigtermAtStep2(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                os.kill(os.getpid(), signal.SIGTERM)

    class Probe(TrainerCallback):
        seen: list[bool] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.seen.append(jit.jit_manager.is_checkpoint_requested)

    args = make_args(enable_jit_checkpoint=True, max_steps=6, per_device_train_batch_size=8)
    trainer = Trainer(RegressionModel(), args, train_dataset=data, callbacks=[SigtermAtStep2, Probe])
    (jit,) = found(trainer)
    assert jit.trainer is trainer and jit.jit_manager.signals == args.preemption_signals
    assert not jit.jit_manager.is_checkpoint_requested
    with pytest.raises(SystemExit) as info:
        trainer.train()
    assert info.value.code == 0 and Probe.seen == [False, True]
    assert os.path.isdir(os.path.join(args.output_dir, "checkpoint-2")) and trainer.state.global_step == 2


def test_sortish_sampler_is_the_group_by_length_sampler(tmp_path, caplog):
    """v4 scripts pass `Seq2SeqTrainingArguments(sortish_sampler=True)` (upstream 5 accepts and ignores
    it; transformers' old examples' SortishSampler shuffled batches of similar lengths): here it is
    the group_by_length sampler, said once in the log. No upstream test reads it (5.23 has only the
    field); the sampler's behaviour is upstream's test_trainer_data.py `test_group_by_length`."""
    from trainwright import Seq2SeqTrainer, Seq2SeqTrainingArguments
    from trainwright.args import validation
    from trainwright.data.samplers import LengthGroupedSampler

    validation._SAID.discard("sortish_sampler")
    lengths = [3, 17, 5, 9, 12, 2, 20, 7, 15, 4, 11, 6, 19, 8, 13, 1]
    data = [{"input_ids": list(range(1, n + 1)), "labels": [1, 2]} for n in lengths]

    def order(**kw):
        args = Seq2SeqTrainingArguments(
            output_dir=str(tmp_path / "o"),
            report_to="none",
            use_cpu=True,
            per_device_train_batch_size=4,
            **kw,
        )
        trainer = Seq2SeqTrainer(model=RegressionModel(), args=args, train_dataset=data)
        sampler = trainer.get_train_dataloader().sampler
        return args, sampler, list(sampler)

    with caplog.at_level("WARNING", logger="trainwright"):
        args, sampler, sortish = order(sortish_sampler=True)
        order(sortish_sampler=True)
    assert args.train_sampling_strategy == "group_by_length" and args.group_by_length
    assert isinstance(sampler, LengthGroupedSampler)
    assert sortish == order(train_sampling_strategy="group_by_length")[2]
    assert sortish != list(range(16)) and lengths[sortish[0]] == max(lengths)  # longest batch first
    assert caplog.text.count("sortish_sampler=True: training batches are drawn by length") == 1
    with pytest.raises(ValueError, match="sortish_sampler.*train_sampling_strategy='sequential'"):
        order(sortish_sampler=True, train_sampling_strategy="sequential")


def test_train_batch_size_is_set_at_construction(make_args):
    """Upstream sets `_train_batch_size` in `__init__`; subclasses in the wild (TRL's trainers) read it
    in `get_train_dataloader` before any `auto_find_batch_size` search."""
    seen = []

    class ReadsIt(Trainer):
        def get_train_dataloader(self):
            seen.append(self._train_batch_size * self.args.gradient_accumulation_steps)
            return super().get_train_dataloader()

    args = make_args(per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=1)
    trainer = ReadsIt(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=16))
    assert trainer._train_batch_size == args.train_batch_size == 4
    trainer.train()
    assert seen == [8]
