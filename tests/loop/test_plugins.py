"""The plug-in table (`loop/plugins.py`): a row added to `PLUGINS` is built once per Trainer when its
arguments ask for it, its callbacks join the Trainer's before the user's, its contexts wrap each
`train()` call (on the model) and each run (on the engine's module, with the run's state), and
both come off when the call ends, also when it fails. No Trainer code names the add-on."""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import DropoutMLP, VectorDataset

from trainwright import Trainer, TrainerCallback
from trainwright.loop import plugins


class Recorder(plugins.PlugIn):
    log: list[str] = []

    def __init__(self, host):
        self.host_model = host.model
        Recorder.log.append("built")

    def callbacks(self):
        return [Seen()]

    @contextlib.contextmanager
    def around_train(self, model):
        Recorder.log.append(f"train in {type(model).__name__}")
        try:
            yield
        finally:
            Recorder.log.append("train out")

    @contextlib.contextmanager
    def around_run(self, module, state):
        Recorder.log.append(f"run in at step {state.global_step}")
        handle = module.register_forward_hook(lambda *a: Recorder.log.append("forward"))
        try:
            yield
        finally:
            handle.remove()
            Recorder.log.append("run out")


class Seen(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        Recorder.log.append("callback")


class Fails(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        raise RuntimeError("stop here")


@pytest.fixture
def recorder_row(monkeypatch):
    Recorder.log = []
    row = plugins.Row("recorder", lambda args: args.run_name == "with-recorder", Recorder)
    monkeypatch.setattr(plugins, "PLUGINS", [*plugins.PLUGINS, row])
    return Recorder.log


def _trainer(make_args, run_name, callbacks=None):
    args = make_args(max_steps=2, run_name=run_name, per_device_train_batch_size=8)
    return Trainer(model=DropoutMLP(), args=args, train_dataset=VectorDataset(16), callbacks=callbacks)


def test_a_new_row_is_built_wrapped_around_train_and_the_run_and_taken_off(recorder_row, make_args):
    trainer = _trainer(make_args, "with-recorder", callbacks=[TrainerCallback()])
    names = [type(cb).__name__ for cb in trainer.callback_handler.callbacks]
    assert names.index("Seen") < names.index("TrainerCallback")  # before the user's callbacks
    trainer.train()
    forwards = recorder_row.count("forward")
    assert forwards == 2  # batch 8, two steps: one forward each, hooked for the run only
    assert recorder_row == [
        "built",
        "train in DropoutMLP",
        "run in at step 0",
        "callback",
        *["forward"] * forwards,
        "run out",
        "train out",
    ]
    trainer.model(torch.zeros(1, 8))
    assert recorder_row.count("forward") == forwards  # the run's hook came off with the run
    trainer.train()
    assert recorder_row.count("built") == 1  # once per Trainer, entered per call
    assert recorder_row.count("train out") == 2


def test_a_row_whose_arguments_do_not_ask_is_not_built(recorder_row, make_args):
    _trainer(make_args, "without").train()
    assert recorder_row == []


def test_contexts_come_off_when_train_fails(recorder_row, make_args):
    trainer = _trainer(make_args, "with-recorder", callbacks=[Fails()])
    with pytest.raises(RuntimeError, match="stop here"):
        trainer.train()
    assert recorder_row[-2:] == ["run out", "train out"]
