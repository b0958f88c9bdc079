"""Upstream's overridable Trainer hooks are called by the loop, with upstream's signatures, so a
subclass override (as TRL and many projects write them) takes effect."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import DropoutMLP, RegressionDataset, RegressionModel, VectorDataset
from torch.utils.data import SequentialSampler

from trainwright import Trainer
from trainwright.observe.metrics import TrainOutput


def make(trainer_cls, make_args, **kw):
    kw.setdefault("per_device_train_batch_size", 4)
    kw.setdefault("max_steps", 4)
    model = kw.pop("model", None) or RegressionModel()
    data = kw.pop("train_dataset", None) or RegressionDataset(length=32)
    eval_data = kw.pop("eval_dataset", None)
    return trainer_cls(model=model, args=make_args(**kw), train_dataset=data, eval_dataset=eval_data)


def test_sampler_hooks_are_used(make_args):
    calls = []

    class T(Trainer):
        def _get_train_sampler(self, train_dataset=None):
            calls.append(("train", len(train_dataset)))
            return SequentialSampler(train_dataset)

        def _get_eval_sampler(self, eval_dataset):
            calls.append(("eval", len(eval_dataset)))
            return super()._get_eval_sampler(eval_dataset)

    trainer = make(T, make_args, eval_dataset=RegressionDataset(length=8))
    loader = trainer.get_train_dataloader()
    assert isinstance(loader.sampler, SequentialSampler)
    trainer.train()
    trainer.evaluate()
    assert ("train", 32) in calls and ("eval", 8) in calls


def test_save_and_load_hooks_are_called_for_checkpoints_resume_and_best_model(make_args, tmp_path):
    saved, loaded, best = [], [], []

    class T(Trainer):
        def _save(self, output_dir=None, state_dict=None):
            saved.append(os.path.basename(output_dir))
            super()._save(output_dir, state_dict)
            with open(os.path.join(output_dir, "custom.txt"), "w") as f:
                f.write("mine")

        def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
            loaded.append(os.path.basename(resume_from_checkpoint))
            super()._load_from_checkpoint(resume_from_checkpoint, model)

        def _load_best_model(self):
            best.append(self.state.best_model_checkpoint)
            super()._load_best_model()

    kw = dict(
        save_strategy="steps",
        save_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        load_best_model_at_end=True,
        eval_dataset=RegressionDataset(length=8),
    )
    trainer = make(T, make_args, **kw)
    trainer.train()
    out = trainer.args.output_dir
    assert os.path.isfile(os.path.join(out, "checkpoint-2", "custom.txt"))  # written inside the atomic folder
    assert saved[:2] == [s for s in saved[:2] if s.startswith(".checkpoint-")]
    assert best and best[0].endswith(("checkpoint-2", "checkpoint-4"))
    trainer.save_model()
    assert saved[-1] == os.path.basename(out) and os.path.isfile(os.path.join(out, "custom.txt"))

    resumed = make(T, make_args, max_steps=6, **kw)
    loaded.clear()
    resumed.train(resume_from_checkpoint=os.path.join(out, "checkpoint-4"))
    assert loaded[0] == "checkpoint-4"


def test_column_hooks(make_args):
    seen = []

    class T(Trainer):
        def _set_signature_columns_if_needed(self):
            super()._set_signature_columns_if_needed()
            seen.append(list(self._signature_columns))

    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_dict(
        {"input_x": [0.1 * i for i in range(16)], "labels": [1.0] * 16, "extra": ["s"] * 16}
    )
    trainer = make(T, make_args, train_dataset=data)
    assert trainer._remove_unused_columns(data).column_names == ["input_x", "labels"]
    assert "input_x" in seen[0] and "extra" not in seen[0]
    trainer.train()


def test_wrap_model_and_optimizer_hooks(make_args):
    calls = []

    class T(Trainer):
        def _wrap_model(self, model, training=True, dataloader=None):
            calls.append("wrap")
            return super()._wrap_model(model, training, dataloader)

        def create_optimizer_and_scheduler(self, num_training_steps):
            calls.append(("opt+sched", num_training_steps))
            super().create_optimizer_and_scheduler(num_training_steps)

        def num_examples(self, dataloader):
            calls.append("num_examples")
            return super().num_examples(dataloader)

    make(T, make_args).train()
    assert calls.index("wrap") < calls.index(("opt+sched", 4))
    assert "num_examples" in calls


def test_floating_point_ops_override_counts_every_micro_batch(make_args):
    class T(Trainer):
        def floating_point_ops(self, inputs):
            return 1000 * inputs["input_x"].shape[0]

    trainer = make(T, make_args, gradient_accumulation_steps=2)
    trainer.train()
    assert trainer.state.total_flos == 1000 * 4 * 2 * 4  # 4 steps x 2 micro-batches x 4 samples
    assert trainer.current_flos == trainer.state.total_flos


def test_autocast_hook_wraps_training_and_prediction_forwards(make_args):
    entered = []

    class Ctx:
        def __enter__(self):
            entered.append(torch.is_grad_enabled())

        def __exit__(self, *exc):
            return False

    class T(Trainer):
        def autocast_smart_context_manager(self, cache_enabled=True):
            return Ctx()

    trainer = make(T, make_args, eval_dataset=RegressionDataset(length=8), per_device_eval_batch_size=8)
    trainer.train()
    assert entered.count(True) == 4  # one per training micro-batch
    trainer.evaluate()
    assert entered.count(False) == 1  # the evaluation batch, under no_grad


def test_log_save_evaluate_gets_upstreams_arguments(make_args):
    got = []

    class T(Trainer):
        def _maybe_log_save_evaluate(
            self,
            tr_loss,
            grad_norm,
            model,
            trial,
            epoch,
            ignore_keys_for_eval,
            start_time,
            learning_rate=None,
        ):
            got.append((tr_loss, grad_norm, model, epoch, start_time, learning_rate))
            super()._maybe_log_save_evaluate(
                tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval, start_time, learning_rate=0.123
            )

    trainer = make(T, make_args, logging_steps=2)
    trainer.train()
    assert len(got) >= trainer.state.global_step  # every step, as upstream (not only steps that log)
    tr_loss, grad_norm, model, epoch, start_time, lr = got[0]
    assert isinstance(tr_loss, torch.Tensor) and tr_loss.dim() == 0 and tr_loss.item() > 0
    assert model is trainer.model_wrapped and isinstance(start_time, float) and lr is not None
    rows = [r for r in trainer.state.log_history if "loss" in r]
    assert rows and all(r["learning_rate"] == 0.123 for r in rows)  # the subclass's argument is honoured


def test_inner_training_loop_and_evaluate_hooks_take_upstreams_signatures(make_args):
    got = {}

    class T(Trainer):
        def _inner_training_loop(
            self,
            batch_size=None,
            args=None,
            resume_from_checkpoint=None,
            trial=None,
            ignore_keys_for_eval=None,
        ):
            got["batch_size"] = batch_size
            return super()._inner_training_loop(
                batch_size=batch_size,
                args=args,
                resume_from_checkpoint=resume_from_checkpoint,
                trial=trial,
                ignore_keys_for_eval=ignore_keys_for_eval,
            )

        def _evaluate(self, trial, ignore_keys_for_eval, skip_scheduler=False):
            metrics = super()._evaluate(trial, ignore_keys_for_eval, skip_scheduler)
            got.setdefault("metrics", []).append(metrics)
            return metrics

        def _determine_best_metric(self, metrics, trial):
            got.setdefault("best", []).append(metrics["eval_loss"])
            return super()._determine_best_metric(metrics, trial)

    trainer = make(
        T,
        make_args,
        eval_dataset=RegressionDataset(length=8),
        eval_strategy="steps",
        eval_steps=2,
        metric_for_best_model="loss",
    )
    out = trainer.train()
    assert isinstance(out, TrainOutput) and got["batch_size"] == 4
    assert [m["eval_loss"] for m in got["metrics"]] == got["best"]
    assert trainer.state.best_metric == min(got["best"])


def test_batch_samples_and_initial_values_hooks(make_args):
    calls = []

    class T(Trainer):
        def get_batch_samples(self, epoch_iterator, num_batches, device=None):
            batches, items = super().get_batch_samples(epoch_iterator, num_batches, device)
            calls.append((len(batches), None if items is None else int(items)))
            return batches, items

        def set_initial_training_values(self, args, dataloader):
            values = super().set_initial_training_values(args, dataloader)
            calls.append(("initial", values))
            return values

    trainer = make(
        T,
        make_args,
        model=DropoutMLP(p=0.0),
        train_dataset=VectorDataset(n=16),
        gradient_accumulation_steps=2,
    )
    trainer.train()
    epochs, per_epoch, examples, samples, total_batch, steps_in_epoch, max_steps = calls[0][1]
    assert (per_epoch, examples, total_batch, steps_in_epoch, max_steps) == (2, 16, 8, 4, 4)
    assert calls[1] == (2, 8)  # two micro-batches of 4 samples (no labels: items are samples)


def test_public_getters(make_args):
    trainer = make(Trainer, make_args, gradient_accumulation_steps=3)
    assert trainer.get_total_train_batch_size(trainer.args) == 12
    assert set(trainer.get_decay_parameter_names(trainer.model)) == {"a", "b"}
    with pytest.raises(ValueError, match="optimizer has not been created"):
        trainer.get_optimizer_group()
    trainer.create_optimizer()
    assert trainer.get_optimizer_group(trainer.model.a)["params"][0] is trainer.model.a
    assert len(trainer.get_optimizer_group()) == len(trainer.optimizer.param_groups)
    with pytest.warns(FutureWarning, match="processing_class"):
        assert trainer.tokenizer is None
    assert trainer.is_deepspeed_enabled is False and trainer.is_fsdp_enabled is False
    assert trainer.deepspeed is None and trainer.is_model_parallel is False
    acc = trainer.accelerator
    assert acc.is_main_process and acc.num_processes == 1 and acc.process_index == 0
    assert torch.equal(acc.gather(torch.tensor([1, 2])), torch.tensor([1, 2]))
    assert acc.unwrap_model(trainer.model) is trainer.model
    with pytest.raises(AttributeError, match="not accelerate"):
        acc.save_state  # noqa: B018
    trainer.end()


def test_save_model_override_is_called_for_checkpoints(make_args):
    calls = []

    class T(Trainer):
        def save_model(self, output_dir=None, _internal_call=False):
            calls.append((os.path.basename(output_dir), _internal_call))
            super().save_model(output_dir, _internal_call)

    trainer = make(T, make_args, save_strategy="steps", save_steps=2)
    trainer.train()
    assert [internal for _, internal in calls] == [True, True]
    assert all(name.startswith(".checkpoint-") for name, _ in calls)
    assert os.path.isfile(os.path.join(trainer.args.output_dir, "checkpoint-4", "model.safetensors"))


def test_a_subclass_load_is_judged_as_trainwrights_own(make_args):
    """`_issue_warnings_after_load`, which a subclass's `_load_from_checkpoint` calls on its own
    `load_state_dict(strict=False)` (GLiNER's): a clean load passes, keys the model leaves out of its
    saves are tied again, any other missing or unexpected key is an error naming it."""
    from trainwright.checkpoint import CheckpointError

    trainer = make(Trainer, make_args)
    model = trainer.model
    trainer._issue_warnings_after_load(model.load_state_dict(model.state_dict(), strict=False))
    with pytest.raises(CheckpointError, match=r"missing keys \[b\]"):
        trainer._issue_warnings_after_load(model.load_state_dict({"a": torch.tensor(1.0)}, strict=False))
    extra = {**model.state_dict(), "c": torch.tensor(0.0)}
    with pytest.raises(CheckpointError, match=r"unexpected keys \[c\]"):
        trainer._issue_warnings_after_load(model.load_state_dict(extra, strict=False))
    tied = []
    model._keys_to_ignore_on_save = ["b"]
    model.tie_weights = lambda: tied.append(True)
    trainer._issue_warnings_after_load(model.load_state_dict({"a": torch.tensor(1.0)}, strict=False))
    assert tied == [True]
