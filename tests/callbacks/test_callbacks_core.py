"""DefaultFlowCallback, EarlyStoppingCallback, ProgressCallback and PrinterCallback driven through a
CallbackHandler by a small loop that fires events the way the Trainer does."""

from __future__ import annotations

import enum
import io
import logging
from types import SimpleNamespace

import pytest
from tqdm.std import tqdm as tqdm_std

from trainwright.callbacks.early_stopping import EarlyStoppingCallback
from trainwright.callbacks.flow import DefaultFlowCallback
from trainwright.callbacks.progress import PrinterCallback, ProgressCallback, format_logs
from trainwright.core.events import CallbackHandler, TrainerCallback
from trainwright.core.state import TrainerControl, TrainerState


def make_args(**overrides):
    base = dict(
        logging_strategy="steps",
        eval_strategy="no",
        save_strategy="no",
        logging_first_step=False,
        eval_delay=0,
        metric_for_best_model=None,
        greater_is_better=None,
        load_best_model_at_end=False,
    )
    base.update(overrides)
    return SimpleNamespace(**base)


def run_loop(
    args,
    *,
    max_steps,
    steps_per_epoch=None,
    logging_steps=500,
    eval_steps=500,
    save_steps=500,
    callbacks=(),
    eval_metrics=lambda step: {"eval_loss": 1.0},
    eval_batches=0,
):
    """Mimic Trainer.train: step events, then log -> evaluate -> save as the flags say.

    Returns the list of (what, global_step) actions the loop took and the final state.
    """
    steps_per_epoch = steps_per_epoch or max_steps
    handler = CallbackHandler([DefaultFlowCallback(), *callbacks], None, None, None, None)
    handler.eval_dataloader = list(range(eval_batches))
    state = TrainerState(
        max_steps=max_steps, logging_steps=logging_steps, eval_steps=eval_steps, save_steps=save_steps
    )
    control = TrainerControl()
    actions: list[tuple[str, int]] = []

    def maybe_log_save_evaluate():
        nonlocal control
        if control.should_log:
            actions.append(("log", state.global_step))
            logs = {"loss": 0.123456, "learning_rate": 1e-5, "epoch": state.epoch, "total_flos": 1e12}
            control = handler.on_log(args, state, control, logs=logs)
        if control.should_evaluate:
            actions.append(("eval", state.global_step))
            for _ in range(eval_batches):
                control = handler.on_prediction_step(args, state, control)
            metrics = eval_metrics(state.global_step)
            control = handler.on_log(args, state, control, logs=metrics)
            control = handler.on_evaluate(args, state, control, metrics=metrics)
        if control.should_save:
            actions.append(("save", state.global_step))
            control = handler.on_save(args, state, control)

    control = handler.on_train_begin(args, state, control)
    epoch = 0
    while state.global_step < max_steps and not control.should_training_stop:
        control = handler.on_epoch_begin(args, state, control)
        for i in range(steps_per_epoch):
            control = handler.on_step_begin(args, state, control)
            state.global_step += 1
            state.epoch = epoch + (i + 1) / steps_per_epoch
            control = handler.on_step_end(args, state, control)
            maybe_log_save_evaluate()
            if control.should_epoch_stop or control.should_training_stop:
                break
        control = handler.on_epoch_end(args, state, control)
        actions.append(("epoch_end", state.global_step))
        maybe_log_save_evaluate()
        epoch += 1
    handler.on_train_end(args, state, control)
    return actions, state


def of(actions, what):
    return [step for kind, step in actions if kind == what]


# -- DefaultFlowCallback -------------------------------------------------------------------


def test_logging_steps_and_final_partial_window():
    actions, state = run_loop(make_args(), max_steps=10, logging_steps=3)
    # 10 is not a multiple of 3: no log row of its own at step 10, as upstream (the Trainer puts the
    # last window's loss in the final row: tests/loop/test_trainer_loop.py)
    assert of(actions, "log") == [3, 6, 9]
    assert state.global_step == 10


def test_logging_final_step_not_duplicated_when_multiple():
    actions, _ = run_loop(make_args(), max_steps=9, logging_steps=3)
    assert of(actions, "log") == [3, 6, 9]


def test_logging_first_step():
    actions, _ = run_loop(make_args(logging_first_step=True), max_steps=7, logging_steps=3)
    assert of(actions, "log") == [1, 3, 6]
    # logging_first_step applies whatever the strategy is.
    actions, _ = run_loop(
        make_args(logging_strategy="no", logging_first_step=True), max_steps=7, logging_steps=3
    )
    assert of(actions, "log") == [1]


def test_no_logging_strategy_logs_nothing():
    actions, _ = run_loop(make_args(logging_strategy="no"), max_steps=7, logging_steps=3)
    assert of(actions, "log") == []


def test_eval_steps_with_delay_and_final_step_eval():
    args = make_args(eval_strategy="steps", eval_delay=5)
    actions, _ = run_loop(args, max_steps=10, eval_steps=2)
    assert of(actions, "eval") == [6, 8, 10]
    # max_steps not a multiple of eval_steps: one extra evaluation at the final step.
    actions, _ = run_loop(args, max_steps=9, eval_steps=2)
    assert of(actions, "eval") == [6, 8, 9]
    # The delay also holds back the final evaluation.
    actions, _ = run_loop(make_args(eval_strategy="steps", eval_delay=20), max_steps=9, eval_steps=2)
    assert of(actions, "eval") == []


def test_save_steps_and_save_at_end():
    actions, _ = run_loop(make_args(save_strategy="steps"), max_steps=10, save_steps=4)
    assert of(actions, "save") == [4, 8, 10]
    actions, _ = run_loop(make_args(save_strategy="steps"), max_steps=10, save_steps=5)
    assert of(actions, "save") == [5, 10]
    actions, _ = run_loop(make_args(save_strategy="best", eval_strategy="steps"), max_steps=10, eval_steps=5)
    assert of(actions, "save") == []  # "best" saves are the Trainer's decision, not the flow's


def test_an_unset_interval_of_a_strategy_that_does_not_use_it_is_not_read():
    """The flow tests the step against an interval before reading its strategy: an interval left
    None (a TrainerState built by hand) under "no"/"epoch" is never used, so it must not fail."""
    args = make_args(logging_strategy="epoch", eval_strategy="no", save_strategy="no")
    actions, state = run_loop(args, max_steps=4, logging_steps=None, eval_steps=None, save_steps=None)
    assert of(actions, "log") == [4] and state.global_step == 4


def test_worked_trace_order():
    """transformers' documented trace (max 5, logging 2, eval 2, save 4)."""
    args = make_args(eval_strategy="steps", save_strategy="steps")
    actions, _ = run_loop(args, max_steps=5, logging_steps=2, eval_steps=2, save_steps=4)
    assert actions == [
        ("log", 2),
        ("eval", 2),
        ("log", 4),
        ("eval", 4),
        ("save", 4),
        ("eval", 5),
        ("save", 5),
        ("epoch_end", 5),
    ]


def test_epoch_strategies():
    args = make_args(logging_strategy="epoch", eval_strategy="epoch", save_strategy="epoch", eval_delay=2)
    actions, state = run_loop(
        args, max_steps=12, steps_per_epoch=4, logging_steps=1, eval_steps=1, save_steps=1
    )
    assert of(actions, "log") == [4, 8, 12]
    assert of(actions, "eval") == [8, 12]  # epoch 1.0 < eval_delay 2
    assert of(actions, "save") == [4, 8, 12]
    assert state.epoch == 3.0


def test_stop_at_max_steps_mid_epoch():
    actions, state = run_loop(make_args(logging_strategy="epoch"), max_steps=6, steps_per_epoch=4)
    assert state.global_step == 6
    assert of(actions, "epoch_end") == [4, 6]
    assert of(actions, "log") == [4, 6]


class StrStrategy(str, enum.Enum):
    NO = "no"
    STEPS = "steps"
    EPOCH = "epoch"


class PlainStrategy(enum.Enum):
    NO = "no"
    STEPS = "steps"


@pytest.mark.parametrize("enum_cls", [StrStrategy, PlainStrategy])
def test_enum_strategies(enum_cls):
    args = make_args(logging_strategy=enum_cls.STEPS, eval_strategy=enum_cls.STEPS, save_strategy=enum_cls.NO)
    actions, _ = run_loop(args, max_steps=5, logging_steps=2, eval_steps=3)
    assert of(actions, "log") == [2, 4] and of(actions, "eval") == [3, 5] and of(actions, "save") == []


def test_handler_resets_flags():
    handler = CallbackHandler([DefaultFlowCallback()], None, None, None, None)
    args, state = make_args(), TrainerState()
    control = TrainerControl(True, True, True, True, True)
    handler.on_step_begin(args, state, control)
    assert (control.should_log, control.should_evaluate, control.should_save) == (False, False, False)
    assert control.should_training_stop and control.should_epoch_stop
    handler.on_epoch_begin(args, state, control)
    assert not control.should_epoch_stop and control.should_training_stop
    handler.on_train_begin(args, state, control)
    assert not control.should_training_stop
    control = TrainerControl(should_log=True, should_evaluate=True, should_save=True)
    handler.on_log(args, state, control, logs={})
    assert not control.should_log and control.should_evaluate
    handler.on_evaluate(args, state, control, metrics={})
    assert not control.should_evaluate and control.should_save
    handler.on_save(args, state, control)
    assert not control.should_save


class SaveOnEvaluate(TrainerCallback):
    def on_evaluate(self, args, state, control, **kwargs):
        control.should_save = True


def test_flag_set_in_on_evaluate_saves_in_same_pass():
    actions, _ = run_loop(
        make_args(eval_strategy="steps"), max_steps=4, eval_steps=2, callbacks=[SaveOnEvaluate()]
    )
    assert of(actions, "save") == [2, 4]


# -- EarlyStoppingCallback -----------------------------------------------------------------


def es_args(**overrides):
    return make_args(
        **{
            "eval_strategy": "steps",
            "metric_for_best_model": "loss",
            "load_best_model_at_end": True,
            **overrides,
        }
    )


def test_early_stopping_patience_stops_training():
    values = {1: 1.0, 2: 0.9, 3: 0.95, 4: 0.92, 5: 0.91, 6: 0.1}
    es = EarlyStoppingCallback(early_stopping_patience=3)
    actions, state = run_loop(
        es_args(), max_steps=6, eval_steps=1, callbacks=[es], eval_metrics=lambda s: {"eval_loss": values[s]}
    )
    # best 0.9 at step 2; steps 3, 4, 5 do not beat it -> stop after step 5's evaluation.
    assert state.global_step == 5
    assert of(actions, "eval") == [1, 2, 3, 4, 5]
    assert es.early_stopping_patience_counter == 3 and es.best_metric == 0.9


def test_early_stopping_threshold_is_absolute():
    es = EarlyStoppingCallback(early_stopping_patience=2, early_stopping_threshold=0.1)
    args, state, control = es_args(), TrainerState(), TrainerControl()
    es.on_evaluate(args, state, control, metrics={"eval_loss": 1.0})
    assert es.early_stopping_patience_counter == 0
    es.on_evaluate(args, state, control, metrics={"eval_loss": 0.95})  # better, but by < 0.1
    assert es.early_stopping_patience_counter == 1 and not control.should_training_stop
    assert es.best_metric == 0.95  # its own best still moves with every improvement
    es.on_evaluate(args, state, control, metrics={"eval_loss": 0.8})  # beats 0.95 by 0.15
    assert es.early_stopping_patience_counter == 0
    es.on_evaluate(args, state, control, metrics={"eval_loss": 0.85})
    es.on_evaluate(args, state, control, metrics={"eval_loss": 0.75})  # only 0.05 better
    assert es.early_stopping_patience_counter == 2 and control.should_training_stop


def test_early_stopping_prefers_trainer_best_metric():
    args, control = es_args(), TrainerControl()
    tracked = EarlyStoppingCallback(early_stopping_patience=5)
    tracked.on_evaluate(args, TrainerState(best_metric=0.5), control, metrics={"eval_loss": 0.6})
    assert tracked.early_stopping_patience_counter == 1  # worse than the Trainer's best
    untracked = EarlyStoppingCallback(early_stopping_patience=5)
    untracked.on_evaluate(args, TrainerState(), control, metrics={"eval_loss": 0.6})
    assert untracked.early_stopping_patience_counter == 0 and untracked.best_metric == 0.6


def test_early_stopping_greater_is_better():
    control = TrainerControl()
    explicit = es_args(greater_is_better=True)
    explicit.metric_for_best_model = "eval_accuracy"
    es = EarlyStoppingCallback()
    es.on_evaluate(explicit, TrainerState(), control, metrics={"eval_accuracy": 0.5})
    es.on_evaluate(explicit, TrainerState(), control, metrics={"eval_accuracy": 0.6})
    assert es.early_stopping_patience_counter == 0 and es.best_metric == 0.6
    # greater_is_better unset: derived from the name (not a loss -> higher is better).
    implicit = make_args(eval_strategy="steps", metric_for_best_model="accuracy")
    es2 = EarlyStoppingCallback()
    es2.on_evaluate(implicit, TrainerState(), control, metrics={"eval_accuracy": 0.6})
    es2.on_evaluate(implicit, TrainerState(), control, metrics={"eval_accuracy": 0.5})
    assert es2.early_stopping_patience_counter == 1 and control.should_training_stop


def test_early_stopping_missing_metric_warns_once(caplog):
    es = EarlyStoppingCallback()
    control = TrainerControl()
    with caplog.at_level(logging.WARNING, logger="trainwright.callbacks.early_stopping"):
        for _ in range(3):
            es.on_evaluate(es_args(), TrainerState(), control, metrics={"eval_accuracy": 0.1})
    warnings = [r for r in caplog.records if "eval_loss" in r.getMessage()]
    assert len(warnings) == 1 and "eval_accuracy" in warnings[0].getMessage()
    assert es.early_stopping_patience_counter == 0 and not control.should_training_stop


def test_early_stopping_checks_args_at_train_begin(caplog):
    es = EarlyStoppingCallback()
    with pytest.raises(AssertionError, match="metric_for_best_model"):
        es.on_train_begin(make_args(eval_strategy="steps"), TrainerState(), TrainerControl())
    with pytest.raises(AssertionError, match="eval_strategy"):
        es.on_train_begin(
            make_args(metric_for_best_model="loss", eval_strategy=StrStrategy.NO), TrainerState(), None
        )
    with caplog.at_level(logging.WARNING, logger="trainwright.callbacks.early_stopping"):
        es.on_train_begin(es_args(load_best_model_at_end=False), TrainerState(), TrainerControl())
    assert any("load_best_model_at_end" in r.getMessage() for r in caplog.records)
    # Through the handler, before any step runs.
    with pytest.raises(AssertionError):
        run_loop(make_args(), max_steps=3, callbacks=[EarlyStoppingCallback()])


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"early_stopping_patience": 0}, ValueError),
        ({"early_stopping_patience": 1.5}, TypeError),
        ({"early_stopping_threshold": -0.1}, ValueError),
        ({"early_stopping_threshold": float("nan")}, ValueError),
    ],
)
def test_early_stopping_rejects_bad_arguments(kwargs, error):
    with pytest.raises(error, match="early_stopping_"):
        EarlyStoppingCallback(**kwargs)


def test_early_stopping_state_round_trip(tmp_path):
    args, control = es_args(), TrainerControl()
    es = EarlyStoppingCallback(early_stopping_patience=2, early_stopping_threshold=None)
    for v in (1.0, 0.8, 0.9):
        es.on_evaluate(args, TrainerState(), control, metrics={"eval_loss": v})
    assert es.state() == {
        "args": {"early_stopping_patience": 2, "early_stopping_threshold": None},
        "attributes": {"early_stopping_patience_counter": 1, "best_metric": 0.8},
    }
    saved = TrainerState(stateful_callbacks={"EarlyStoppingCallback": es.state()})
    saved.save_to_json(str(tmp_path / "trainer_state.json"))
    stored = TrainerState.load_from_json(str(tmp_path / "trainer_state.json")).stateful_callbacks

    restored = EarlyStoppingCallback.from_state(stored["EarlyStoppingCallback"])
    assert restored.state() == es.state()
    # The Trainer's way: build from args, then set attributes.
    rebuilt = EarlyStoppingCallback(**stored["EarlyStoppingCallback"]["args"])
    for k, v in stored["EarlyStoppingCallback"]["attributes"].items():
        setattr(rebuilt, k, v)
    # The restored counter carries on: one more miss reaches patience 2.
    fresh_control = TrainerControl()
    rebuilt.on_evaluate(args, TrainerState(), fresh_control, metrics={"eval_loss": 0.85})
    assert rebuilt.early_stopping_patience_counter == 2 and fresh_control.should_training_stop


# -- ProgressCallback / PrinterCallback ----------------------------------------------------


def test_format_logs():
    logs = {"loss": 0.123456, "step": 3, "total_flos": 1e12, "note": "x" * 20, "s": "ok"}
    shown = format_logs(logs, max_str_len=10)
    assert shown["loss"] == "0.1235" and shown["step"] == 3 and "total_flos" not in shown
    assert shown["note"] == "<20 characters, longer than max_str_len=10>" and shown["s"] == "ok"
    assert "total_flos" in logs  # the caller's dict is untouched


def test_progress_non_tty_prints_one_line_per_log_and_no_bar(capsys):
    progress = ProgressCallback()  # pytest captures stderr, so it is not a terminal
    actions, _ = run_loop(
        make_args(eval_strategy="steps"),
        max_steps=10,
        logging_steps=4,
        eval_steps=5,
        callbacks=[progress],
        eval_batches=3,
    )
    out, err = capsys.readouterr()
    lines = out.splitlines()
    n_logs = len(of(actions, "log")) + len(of(actions, "eval"))
    assert n_logs == 4  # logs at 4, 8; evals at 5, 10
    assert len(lines) == n_logs + 2
    assert lines[0] == "Training: 10 steps (starting at step 0)"
    assert lines[1] == "[4/10] {'loss': '0.1235', 'learning_rate': '1e-05', 'epoch': '0.4'}"
    assert lines[2] == "[5/10] {'eval_loss': '1'}"
    assert lines[-1].startswith("Training done: 10/10 steps in ")
    assert "total_flos" not in out
    assert err == "" and "\r" not in out and "it/s" not in out
    assert progress.training_bar is None and progress.prediction_bar is None


def test_progress_tty_uses_tqdm_bars():
    stream = io.StringIO()
    progress = ProgressCallback(stream=stream, is_tty=True)
    seen_bars = []

    class Spy(TrainerCallback):  # after ProgressCallback in the list: sees its bars live
        def on_step_end(self, args, state, control, **kwargs):
            seen_bars.append(isinstance(progress.training_bar, tqdm_std))

        def on_prediction_step(self, args, state, control, **kwargs):
            seen_bars.append(progress.prediction_bar.total)

    run_loop(
        make_args(eval_strategy="steps"),
        max_steps=6,
        logging_steps=3,
        eval_steps=6,
        callbacks=[progress, Spy()],
        eval_batches=2,
    )
    text = stream.getvalue()
    assert seen_bars.count(True) == 6 and seen_bars.count(2) == 2
    assert "\r" in text and "6/6" in text and "100%" in text
    assert "loss=0.1235" in text and "lr=1e-05" in text  # bar postfix
    assert "{'loss': '0.1235', 'learning_rate': '1e-05', 'epoch': '0.5'}" in text
    assert progress.training_bar is None and progress.prediction_bar is None


def test_progress_only_on_main_process(capsys):
    progress = ProgressCallback(is_tty=False)
    args = make_args()
    state = TrainerState(max_steps=3, is_world_process_zero=False)
    progress.on_train_begin(args, state, TrainerControl())
    progress.on_log(args, state, TrainerControl(), logs={"loss": 1.0})
    progress.on_train_end(args, state, TrainerControl())
    assert capsys.readouterr().out == ""


def test_progress_standalone_evaluate_prints_row(capsys):
    progress = ProgressCallback(is_tty=False)
    progress.on_log(make_args(), TrainerState(), TrainerControl(), logs={"eval_loss": 0.5})
    assert capsys.readouterr().out == "{'eval_loss': '0.5'}\n"


def test_printer_callback(capsys):
    printer = PrinterCallback()
    logs = {"loss": 0.123456, "total_flos": 5.0, "step": 2}
    printer.on_log(make_args(), TrainerState(), TrainerControl(), logs=logs)
    assert capsys.readouterr().out == "{'loss': '0.1235', 'step': 2}\n"
    assert "total_flos" in logs
    printer.on_log(make_args(), TrainerState(is_local_process_zero=False), TrainerControl(), logs=logs)
    assert capsys.readouterr().out == ""


def test_callbacks_receive_the_handlers_current_objects_after_they_change():
    seen = []

    class Recorder(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append(
                (kwargs["optimizer"], kwargs["lr_scheduler"], kwargs["train_dataloader"], kwargs.get("x"))
            )

    handler = CallbackHandler([Recorder(), DefaultFlowCallback()], "model", None, "opt-1", "sched-1")
    args, state, control = SimpleNamespace(), TrainerState(), TrainerControl()
    args.logging_strategy = args.eval_strategy = args.save_strategy = "no"
    args.logging_first_step, args.eval_delay = False, 0
    handler.on_step_end(args, state, control)
    handler.optimizer, handler.lr_scheduler, handler.train_dataloader = "opt-2", "sched-2", "loader"
    handler.on_step_end(args, state, control)
    handler.call_event("on_step_end", args, state, control, x=1)  # extra kwargs reach the callback too
    handler.on_step_end(args, state, control)  # ... and do not stay in later events' kwargs
    assert seen == [
        ("opt-1", "sched-1", None, None),
        ("opt-2", "sched-2", "loader", None),
        ("opt-2", "sched-2", "loader", 1),
        ("opt-2", "sched-2", "loader", None),
    ]
