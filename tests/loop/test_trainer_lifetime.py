"""A Trainer is freed when its last reference goes: `del trainer` releases the model and the
optimizer at once (the next model of a notebook or a search needs that memory), not at the next
full garbage collection, which may come much later."""

from __future__ import annotations

import copy
import gc
import pickle
import weakref

import pytest
import transformers
from conftest import RegressionDataset, RegressionModel
from kit import hf

import trainwright
from trainwright import Trainer
from trainwright.loop.search.common import Search

tokenizer, tokenizer_dir = hf.tokenizer, hf.tokenizer_dir  # session fixtures


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
    accelerator, device = trainer.accelerator, trainer.args.device
    del trainer
    # the accelerator the user still holds keeps neither alive, and still answers from its values
    assert model() is None and optimizer() is None
    assert accelerator.device == device and accelerator.num_processes == 1
    assert accelerator.gradient_accumulation_steps == 1 and accelerator.sync_gradients


def test_deleting_an_untrained_trainer_frees_its_model_at_once(make_args, no_collector):
    trainer = _trainer(make_args)
    model = weakref.ref(trainer.model)
    del trainer
    assert model() is None


def test_a_trainer_still_pickles_and_copies_with_its_accelerator(make_args):
    """ray's search pickles the Trainer to its workers: the accelerator comes back with the copy's
    arguments, and recognises the copy's model as the trained one once train() hands it over."""
    trainer = _trainer(make_args, gradient_accumulation_steps=2)
    for clone in (pickle.loads(pickle.dumps(trainer)), copy.deepcopy(trainer)):
        assert clone.accelerator.device == trainer.accelerator.device
        assert clone.accelerator.gradient_accumulation_steps == 2
        clone.train()
        assert clone.accelerator.prepare_model(clone.model) is clone.model


def _gpt2_run(lib, tok, out: str, lora: bool):
    """A transformers example's run: GPT-2 from a config (maybe under LoRA), tokenized rows,
    DataCollatorForLanguageModeling's BatchEncoding batches; trains 2 steps with a checkpoint."""
    model = hf.tiny_gpt2_lm(tok)
    if lora:
        peft = pytest.importorskip("peft")
        model = peft.get_peft_model(
            model, peft.LoraConfig(r=4, target_modules=["c_attn"], task_type="CAUSAL_LM")
        )
    args = lib.TrainingArguments(
        out,
        max_steps=2,
        per_device_train_batch_size=4,
        save_steps=2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    collator = transformers.DataCollatorForLanguageModeling(tok, mlm=False)
    trainer = lib.Trainer(
        model=model, args=args, train_dataset=hf.clm_dataset(tok, 16), data_collator=collator
    )
    trainer.train()
    return weakref.ref(trainer.model), weakref.ref(trainer.optimizer)


@pytest.mark.parametrize("lora", [False, True], ids=["gpt2", "gpt2-lora"])
def test_a_transformers_model_is_freed_at_once_as_with_transformers_trainer(
    tokenizer, tmp_path, no_collector, lora
):
    """A transformers model's loss takes `num_items_in_batch`: the run's weights hold the Trainer's
    measurement of it (a cycle through the Trainer until it is weak). transformers.Trainer frees it
    at once too."""
    freed = {}
    for lib in (transformers, trainwright):
        _gpt2_run(lib, tokenizer, str(tmp_path / lib.__name__ / "warm"), lora)  # first-call imports
        gc.collect()
        model, optimizer = _gpt2_run(lib, tokenizer, str(tmp_path / lib.__name__ / "run"), lora)
        freed[lib.__name__] = model() is None and optimizer() is None
    assert freed == {"transformers": True, "trainwright": True}


def test_the_accelerator_follows_a_search_trials_arguments(make_args):
    """A search trial's arguments reach `trainer.accelerator` (upstream makes a new accelerator for
    each trial); the caller's come back after the search."""
    trainer = _trainer(make_args)
    search = Search(
        compute_objective=lambda metrics: 0.0,
        hp_name=None,
        multi_objective=False,
        run_id=str,
        report=lambda *_: None,
        params=lambda trial: {"gradient_accumulation_steps": 4},
        base_args=trainer.args,
    )
    with trainer._hp_search_scope("optuna", search):
        trainer._hp_search_setup(trial={"trial": 0})  # upstream's hook at train(trial=...)'s start
        assert trainer.accelerator.gradient_accumulation_steps == 4
    assert trainer.accelerator.gradient_accumulation_steps == 1
    shipped = copy.copy(trainer)  # as Ray ships it: no model, built by model_init in the worker
    shipped.model = shipped.model_wrapped = None
    with shipped._hp_search_scope("ray", search):
        shipped._hp_search_setup(trial={"trial": 1})
        assert shipped.accelerator.gradient_accumulation_steps == 4
