"""Runs must not lie: diverged losses, NaN metrics, empty data and impossible arguments are
reported or refused, never turned into plausible numbers."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from conftest import RegressionDataset, RegressionModel
from kit.runs import regression_trainer, scored_best_model_run
from torch.utils.data import IterableDataset

from trainwright import DivergenceCallback, EarlyStoppingCallback, Trainer, TrainingArguments
from trainwright.core.state import TrainerControl, TrainerState, metric_improves


class NaNAfter(RegressionModel):
    """A regression model whose loss becomes NaN from its `start`-th forward on."""

    def __init__(self, start: int):
        super().__init__()
        self.start, self.calls = start, 0

    def forward(self, input_x, labels=None):
        loss, y = super().forward(input_x, labels)
        self.calls += 1
        if self.calls >= self.start:
            loss = loss * float("nan")
        return loss, y


@pytest.mark.parametrize("filter_nonfinite", [True, False])
def test_a_window_of_only_nan_steps_is_nan_or_filtered_never_zero(make_args, caplog, filter_nonfinite):
    args = make_args(
        max_steps=6, logging_steps=3, per_device_train_batch_size=4, logging_nan_inf_filter=filter_nonfinite
    )
    trainer = Trainer(model=NaNAfter(start=4), args=args, train_dataset=RegressionDataset())
    with caplog.at_level(logging.WARNING, logger="trainwright"):
        out = trainer.train()
    first, second = [r for r in trainer.state.log_history if "loss" in r or "nonfinite_steps" in r][:2]
    assert math.isfinite(first["loss"]) and "nonfinite_steps" not in first
    assert second["nonfinite_steps"] == 3 and "steps_without_targets" not in second
    assert "Non-finite training loss in 3 of the steps 4-6" in caplog.text
    if filter_nonfinite:  # filtered as documented: nothing finite to average, so no loss in the row
        assert "loss" not in second and "filtered out by logging_nan_inf_filter" in caplog.text
        assert out.training_loss == pytest.approx(first["loss"])  # the steps that had a finite loss
    else:  # the NaN stays visible
        assert math.isnan(second["loss"]) and math.isnan(out.training_loss)


@pytest.mark.parametrize("filter_nonfinite", [True, False])
def test_divergence_callback_sees_a_diverged_window_whether_filtered_or_not(make_args, filter_nonfinite):
    args = make_args(
        max_steps=20, logging_steps=1, per_device_train_batch_size=4, logging_nan_inf_filter=filter_nonfinite
    )
    stop = DivergenceCallback(max_nonfinite_steps=5)  # a single diverged row stops it at once
    trainer = Trainer(model=NaNAfter(start=3), args=args, train_dataset=RegressionDataset(), callbacks=[stop])
    trainer.train()
    assert trainer.state.global_step == 3


def test_filtered_window_counts_its_nonfinite_steps(make_args):
    args = make_args(max_steps=4, logging_steps=4, per_device_train_batch_size=4)
    trainer = Trainer(model=NaNAfter(start=4), args=args, train_dataset=RegressionDataset())
    trainer.train()
    row = trainer.state.log_history[0]
    assert row["nonfinite_steps"] == 1 and math.isfinite(row["loss"])  # 3 finite steps, one left out


def test_divergence_callback_stops_without_saving(make_args, tmp_path):
    args = make_args(
        max_steps=20, logging_steps=2, per_device_train_batch_size=4, save_strategy="steps", save_steps=4
    )
    trainer = Trainer(
        model=NaNAfter(start=7),
        args=args,
        train_dataset=RegressionDataset(),
        callbacks=[DivergenceCallback()],
    )
    trainer.train()
    assert trainer.state.global_step == 8  # the row at step 8 showed the first NaN step (7)
    assert sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*")) == ["checkpoint-4"]


def test_nan_metric_never_becomes_or_freezes_the_best():
    nan = float("nan")
    assert metric_improves(1.0, None, greater_is_better=False)
    assert not metric_improves(nan, 1.0, greater_is_better=False)
    assert metric_improves(5.0, nan, greater_is_better=False)  # a finite value replaces a NaN best
    assert metric_improves(0.5, 1.0, greater_is_better=False)
    assert not metric_improves(0.95, 1.0, greater_is_better=False, threshold=0.1)
    assert not metric_improves(float("inf"), 1.0, greater_is_better=True)


def test_load_best_model_at_end_restores_a_finite_best(make_args):
    trainer = scored_best_model_run(
        make_args,
        [float("nan"), 0.5, float("nan"), 0.9],
        eval_length=8,
        max_steps=8,
        save_total_limit=1,
        per_device_train_batch_size=4,
    )
    assert trainer.state.best_metric == 0.5
    assert trainer.state.best_model_checkpoint.endswith("checkpoint-4")


def test_early_stopping_is_not_frozen_by_a_nan_best():
    args = TrainingArguments(
        output_dir="x", metric_for_best_model="loss", eval_strategy="steps", load_best_model_at_end=True
    )
    es = EarlyStoppingCallback(early_stopping_patience=2)
    state, control = TrainerState(), TrainerControl()
    for value in (float("nan"), 1.0, 0.5):
        es.on_evaluate(args, state, control, metrics={"eval_loss": value})
        assert es.early_stopping_patience_counter == 0
    assert es.best_metric == 0.5


def test_an_empty_training_set_is_refused_before_training(make_args):
    with pytest.raises(ValueError, match="train_dataset .* has 0 samples") as empty:
        Trainer(model=RegressionModel(), args=make_args(), train_dataset=RegressionDataset(length=0)).train()
    # drop_last is already False: only more samples can help
    assert str(empty.value).endswith("dataloader_drop_last=False. Give it more samples.")
    args = make_args(per_device_train_batch_size=8, dataloader_drop_last=True)
    with pytest.raises(
        ValueError, match="has 1 samples, per_device_train_batch_size=8.*dataloader_drop_last=True"
    ) as dropped:
        Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=1)).train()
    assert str(dropped.value).endswith(
        "Give it more samples or a smaller per_device_train_batch_size or dataloader_drop_last=False."
    )


def test_an_iterable_that_yields_nothing_is_refused(make_args):
    class Nothing(IterableDataset):
        def __iter__(self):
            return iter([])

    with pytest.raises(ValueError, match="gives no batch") as e:
        Trainer(model=RegressionModel(), args=make_args(max_steps=5), train_dataset=Nothing()).train()
    assert "train_dataset (Nothing, an iterable) yielded no sample" in str(e.value)
    assert "? samples" not in str(e.value)


def test_an_empty_eval_set_warns_and_a_best_metric_on_it_names_it(make_args, caplog):
    trainer = Trainer(model=RegressionModel(), args=make_args(), eval_dataset=RegressionDataset(length=0))
    with caplog.at_level(logging.WARNING, logger="trainwright"):
        metrics = trainer.evaluate()
    assert "eval_loss" not in metrics  # as upstream: timings only
    assert any(
        "eval_dataset (RegressionDataset) gave no samples" in r.getMessage()
        and "no eval_loss" in r.getMessage()
        for r in caplog.records
    )
    args = make_args(
        max_steps=4,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        metric_for_best_model="eval_loss",
    )
    trainer = regression_trainer(args, RegressionDataset(length=0))
    with pytest.raises(
        ValueError, match=r"eval_dataset \(RegressionDataset\) gave no samples.*'eval_loss' at step 2"
    ):
        trainer.train()


def test_a_number_given_as_a_string_says_so_and_gives_the_number():
    with pytest.raises(
        ValueError, match=r"learning_rate='1e-4' is invalid: it is a string, not a number: .*=0\.0001$"
    ):
        TrainingArguments(output_dir="x", learning_rate="1e-4")
    with pytest.raises(ValueError, match=r"save_steps='500' is invalid: it is a string.*save_steps=500$"):
        TrainingArguments(output_dir="x", save_steps="500")
    with pytest.raises(ValueError, match=r"max_steps='1.5' is invalid: expected an integer"):
        TrainingArguments(output_dir="x", max_steps="1.5")  # not an int: no number to offer
    with pytest.raises(ValueError, match=r"max_grad_norm='x' is invalid: expected a finite number"):
        TrainingArguments(output_dir="x", max_grad_norm="x")


@pytest.mark.parametrize(
    "field, value",
    [
        ("learning_rate", float("inf")),
        ("learning_rate", float("nan")),
        ("max_grad_norm", float("nan")),
        ("max_grad_norm", "x"),
        ("weight_decay", float("nan")),
        ("num_train_epochs", float("inf")),
        ("adam_beta1", 2.0),
        ("adam_beta2", float("nan")),
        ("adam_epsilon", -1.0),
        ("logging_steps", float("nan")),
    ],
)
def test_impossible_numbers_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"{field}="):
        TrainingArguments(output_dir="x", **{field: value})


def test_loss_window_reads_once_and_reports_nonfinite():
    from trainwright.core.runtime import get_runtime
    from trainwright.loop.run.loss_log import LossWindow

    window = LossWindow(torch.device("cpu"))
    for step, value in enumerate([1.0, float("inf"), 3.0]):
        window.add(step, torch.tensor(value))
    total, nonfinite = window.step_sum(3, get_runtime(use_cpu=True), filter_nonfinite=True)
    assert (total, nonfinite) == (6.0, 1)  # the inf step counts as the mean of the finite ones


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without a GPU")
@pytest.mark.parametrize("field", ["bf16", "bf16_full_eval"])
def test_bf16_on_the_cpu_without_use_cpu_is_refused_as_transformers_refuses_it(tmp_path, field):
    """A TRL config turns bf16 on by default: on a CPU-only machine transformers refuses to start
    (unless use_cpu=True, where the CPU autocasts in bfloat16); trainwright refuses alike."""
    transformers = pytest.importorskip("transformers")
    with pytest.raises(ValueError, match="bf16"):
        transformers.TrainingArguments(output_dir=str(tmp_path), **{field: True})
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", **{field: True})
    with pytest.raises(ValueError, match=f"{field}=True.*use_cpu=True"):
        Trainer(model=RegressionModel(), args=args)
    ok = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, **{field: True})
    assert Trainer(model=RegressionModel(), args=ok).args.use_cpu
