"""A library that replaces the callback handler's `call_event` (setfit assigns its own to the
instance) or an `on_<event>` (a subclass of the handler) gets every event through it, with the
flags reset before it as upstream's handler resets them: the same sequence as transformers.Trainer's
for the same training, in the same test."""

from __future__ import annotations

import pytest
from conftest import regression_with_eval

from trainwright import Trainer, TrainingArguments
from trainwright.core.events import CallbackHandler

transformers = pytest.importorskip("transformers")

FLAGS = ("should_log", "should_evaluate", "should_save", "should_training_stop", "should_epoch_stop")


def _args(cls, tmp_path, name):
    return cls(
        output_dir=str(tmp_path / name),
        max_steps=4,
        per_device_train_batch_size=16,
        logging_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        save_steps=2,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )


def _record(trainer) -> list[tuple]:
    """Replace the handler's call_event on the instance, as setfit does: record each event with the
    flags it arrives with, then call the original."""
    handler, seen = trainer.callback_handler, []
    original = handler.call_event

    def call_event(event, args, state, control, **kwargs):
        seen.append((event, state.global_step, *(getattr(control, f) for f in FLAGS)))
        return original(event, args, state, control, **kwargs)

    handler.call_event = call_event
    return seen


def test_a_replaced_call_event_gets_every_event_as_upstream(tmp_path):
    theirs = regression_with_eval(transformers.Trainer, _args(transformers.TrainingArguments, tmp_path, "hf"))
    ours = regression_with_eval(Trainer, _args(TrainingArguments, tmp_path, "tw"))
    upstream, seen = _record(theirs), _record(ours)
    theirs.train()
    ours.train()
    assert seen == upstream
    assert ("on_step_begin", 1, False, False, False, False, False) in seen
    assert ours.state.global_step == 4 and sum(1 for e in seen if e[0] == "on_evaluate") == 2


class Counting(CallbackHandler):
    """A handler subclass overriding one event method."""

    steps = 0

    def on_step_end(self, args, state, control, **kwargs):
        Counting.steps += 1
        return super().on_step_end(args, state, control, **kwargs)


def test_a_handler_subclass_overriding_an_event_method_is_called(tmp_path):
    trainer = regression_with_eval(Trainer, _args(TrainingArguments, tmp_path, "tw"))
    handler = trainer.callback_handler
    trainer.callback_handler = Counting(handler.callbacks, trainer.model, None, None, None)
    Counting.steps = 0
    trainer.train()
    assert Counting.steps == 4 and trainer.state.global_step == 4


def test_a_plain_handler_skips_events_nobody_listens_to(tmp_path):
    trainer = regression_with_eval(Trainer, _args(TrainingArguments, tmp_path, "tw"))
    assert "on_substep_end" in trainer.callback_handler.quiet
    _record(trainer)
    assert not trainer.callback_handler.quiet  # a replaced call_event hears them all
