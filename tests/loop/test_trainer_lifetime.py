"""A Trainer is freed when its last reference goes: `del trainer` releases the model and the
optimizer at once (the next model of a notebook or a search needs that memory), not at the next
full garbage collection, which may come much later."""

from __future__ import annotations

import copy
import gc
import pickle
import weakref

import pytest
from conftest import RegressionDataset, RegressionModel

from trainwright import Trainer


@pytest.fixture
def no_collector():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _trainer(make_args, **kwargs) -> Trainer:
    args = make_args(max_steps=3, per_device_train_batch_size=8, **kwargs)
    return Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset())


@pytest.mark.parametrize("save_strategy", ["no", "steps"])
def test_deleting_a_trained_trainer_frees_its_model_and_optimizer_at_once(
    make_args, no_collector, save_strategy
):
    _trainer(make_args).train()  # the first call's lazy imports leave cyclic frames: collected here
    gc.collect()
    trainer = _trainer(make_args, save_strategy=save_strategy, save_steps=2)
    trainer.train()
    model, optimizer = weakref.ref(trainer.model), weakref.ref(trainer.optimizer)
    accelerator = trainer.accelerator
    del trainer
    assert model() is None and optimizer() is None
    with pytest.raises(RuntimeError, match="after its Trainer was deleted"):
        accelerator.device  # noqa: B018 - the read is the test


def test_deleting_an_untrained_trainer_frees_its_model_at_once(make_args, no_collector):
    trainer = _trainer(make_args)
    model = weakref.ref(trainer.model)
    del trainer
    assert model() is None


def test_a_trainer_still_pickles_and_copies_with_its_accelerator(make_args):
    """ray's search pickles the Trainer to its workers: the accelerator's weak reference to its
    Trainer goes as the Trainer itself and comes back pointing at the copy."""
    trainer = _trainer(make_args)
    for clone in (pickle.loads(pickle.dumps(trainer)), copy.deepcopy(trainer)):
        assert clone.accelerator._owner is clone
        assert clone.accelerator.device == trainer.accelerator.device
