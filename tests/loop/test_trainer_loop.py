"""The training loop: event order, accumulation = full batch, logging, schedules, fp16 skips."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DropoutMLP, PaddedLM, RegressionDataset, RegressionModel, VectorDataset, tiny_gpt2
from kit.runs import one_step, regression_trainer
from torch import nn
from torch.utils.data import IterableDataset

from trainwright import Trainer, TrainerCallback
from trainwright.app.tinygpt import TinyGPT, TinyGPTConfig
from trainwright.modeling.step_weights import StepWeights


class Recorder(TrainerCallback):
    def __init__(self):
        self.events: list[str] = []
        self.logs: list[dict] = []
        self.applied_lr: list[float] = []

    def _add(self, name):
        self.events.append(name)

    def on_train_begin(self, args, state, control, **kw):
        self._add("on_train_begin")

    def on_train_end(self, args, state, control, **kw):
        self._add("on_train_end")

    def on_epoch_begin(self, args, state, control, **kw):
        self._add("on_epoch_begin")

    def on_epoch_end(self, args, state, control, **kw):
        self._add("on_epoch_end")

    def on_step_begin(self, args, state, control, **kw):
        self._add("on_step_begin")

    def on_substep_end(self, args, state, control, **kw):
        self._add("on_substep_end")

    def on_pre_optimizer_step(self, args, state, control, **kw):
        self._add("on_pre_optimizer_step")

    def on_optimizer_step(self, args, state, control, optimizer=None, **kw):
        self._add("on_optimizer_step")
        self.applied_lr.append(optimizer.param_groups[0]["lr"])

    def on_step_end(self, args, state, control, **kw):
        self._add("on_step_end")

    def on_evaluate(self, args, state, control, **kw):
        self._add("on_evaluate")

    def on_prediction_step(self, args, state, control, **kw):
        self._add("on_prediction_step")

    def on_save(self, args, state, control, **kw):
        self._add("on_save")

    def on_log(self, args, state, control, logs=None, **kw):
        self._add("on_log")
        self.logs.append(dict(logs))


def expected_events(
    steps, ga, logging_steps, eval_steps, save_steps, eval_batches, steps_per_epoch, epochs=1
):
    ev_block = ["on_prediction_step"] * eval_batches + ["on_log", "on_evaluate"]
    out = ["on_train_begin"]
    step = 0
    for _ in range(epochs):
        out.append("on_epoch_begin")
        for _ in range(steps_per_epoch):
            step += 1
            out += ["on_step_begin"] + ["on_substep_end"] * (ga - 1)
            out += ["on_pre_optimizer_step", "on_optimizer_step", "on_step_end"]
            last = step == steps
            if step % logging_steps == 0:  # the last steps' window goes into the final row
                out.append("on_log")
            if eval_steps and (step % eval_steps == 0 or last):
                out += ev_block
            if save_steps and (step % save_steps == 0 or last):
                out.append("on_save")
            if last:
                break
        out.append("on_epoch_end")
    return out + ["on_log", "on_train_end"]


@pytest.mark.parametrize("ga", [1, 2])
def test_event_order_matches_upstream_trace(make_args, ga):
    rec = Recorder()
    args = make_args(
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        gradient_accumulation_steps=ga,
        max_steps=5,
        logging_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=4,
    )
    trainer = Trainer(
        model=RegressionModel(),
        args=args,
        train_dataset=RegressionDataset(length=20 * ga),
        eval_dataset=RegressionDataset(length=12),
        callbacks=[rec],
    )
    trainer.train()
    assert rec.events == expected_events(5, ga, 2, 2, 4, eval_batches=3, steps_per_epoch=5)


def test_event_order_epochs_without_eval(make_args):
    rec = Recorder()
    args = make_args(per_device_train_batch_size=8, num_train_epochs=2, logging_steps=3)
    Trainer(
        model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=32), callbacks=[rec]
    ).train()
    assert rec.events == expected_events(8, 1, 3, 0, 0, 0, steps_per_epoch=4, epochs=2)


def test_last_partial_logging_window_is_logged_and_lr_is_the_applied_one(make_args):
    rec = Recorder()
    args = make_args(
        per_device_train_batch_size=4,
        max_steps=7,
        logging_steps=3,
        learning_rate=0.1,
        warmup_steps=3,
        lr_scheduler_type="linear",
    )
    Trainer(
        model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=64), callbacks=[rec]
    ).train()
    rows = [r for r in rec.logs if "loss" in r]
    assert [round(r["epoch"] * 16) for r in rows] == [3, 6, 7]
    assert [r["learning_rate"] for r in rows] == [rec.applied_lr[2], rec.applied_lr[5], rec.applied_lr[6]]
    # warmup over 3 steps (0, 1/3, 2/3), then the peak, then linear decay
    assert rec.applied_lr[3] == pytest.approx(0.1)
    assert rec.applied_lr[0] == pytest.approx(0.0)


def test_logged_loss_is_mean_of_step_losses(make_args):
    losses = []

    class Spy(Trainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            loss = super().training_step(model, inputs, num_items_in_batch)
            losses.append(loss.item())
            return loss

    rec = Recorder()
    args = make_args(
        per_device_train_batch_size=4, max_steps=6, logging_steps=3, gradient_accumulation_steps=2
    )
    out = Spy(
        model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=64), callbacks=[rec]
    ).train()
    steps = [losses[i] + losses[i + 1] for i in range(0, 12, 2)]
    rows = [r["loss"] for r in rec.logs if "loss" in r]
    assert rows == pytest.approx([sum(steps[:3]) / 3, sum(steps[3:]) / 3], rel=1e-6)
    assert out.training_loss == pytest.approx(sum(steps) / 6, rel=1e-6)
    for key in (
        "train_runtime",
        "train_samples_per_second",
        "train_steps_per_second",
        "total_flos",
        "train_loss",
    ):
        assert key in out.metrics
    assert out.metrics["epoch"] == pytest.approx(48 / 64)


# ------------------------------------------------------------------ accumulation == full batch
class MeanTokenLM(nn.Module):
    """A plain LM that returns the mean over its own micro-batch's targets (no num_items_in_batch)."""

    def __init__(self, vocab=64, dim=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, input_ids, labels=None):
        logits = self.out(self.emb(input_ids))
        if labels is None:
            return {"logits": logits}
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return {"loss": loss, "logits": logits}


def _one_step(model_fn, make_args, dataset, bs, ga, trainer_cls=Trainer, **kw):
    """The weights after one step of a model built after torch.manual_seed(0)."""
    torch.manual_seed(0)
    return one_step(model_fn, make_args, dataset, bs, ga, trainer_cls, **kw)[1]


def _assert_same(a, b):
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=2e-5, atol=2e-6, msg=k)


@pytest.mark.parametrize(
    "model_fn",
    [
        lambda: TinyGPT(
            TinyGPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16, dropout=0.0)
        ),
        lambda: tiny_gpt2(),
        MeanTokenLM,
    ],
    ids=["tinygpt-num_items", "transformers-gpt2", "plain-mean-loss"],
)
def test_accumulation_equals_full_batch_with_uneven_tokens(make_args, model_fn):
    data = PaddedLM()
    full = _one_step(model_fn, make_args, data, bs=8, ga=1)
    accumulated = _one_step(model_fn, make_args, data, bs=2, ga=4)
    _assert_same(full, accumulated)


def test_mean_of_micro_batch_means_would_differ(make_args, monkeypatch):
    """The data really is uneven: upstream's old rule (mean of per-micro-batch means) gives another update."""
    data = PaddedLM()
    full = _one_step(MeanTokenLM, make_args, data, bs=8, ga=1)
    monkeypatch.setattr(StepWeights, "scale", lambda self, loss, share, num_items: loss / 4)
    accumulated = _one_step(MeanTokenLM, make_args, data, bs=2, ga=4)
    diff = max((accumulated[k] - full[k]).abs().max().item() for k in full)
    assert diff > 1e-4


def test_uneven_last_micro_batch_of_an_epoch_is_weighted_by_samples(make_args):
    """10 samples, micro-batches 4+4+2: one step must equal the 10-sample batch."""
    data = VectorDataset(n=10)
    full = _one_step(lambda: DropoutMLP(p=0.0), make_args, data, bs=10, ga=1)
    acc = _one_step(lambda: DropoutMLP(p=0.0), make_args, data, bs=4, ga=3)
    _assert_same(full, acc)


def test_causal_lm_counts_shifted_targets(make_args):
    """num_items_in_batch given to a causal LM counts labels[..., 1:] (position 0 is never a target)."""
    seen = []

    class Spy(TinyGPT):
        def forward(self, input_ids, labels=None, attention_mask=None, num_items_in_batch=None):
            seen.append(int(num_items_in_batch))
            return super().forward(input_ids, labels, attention_mask, num_items_in_batch)

    data = PaddedLM()
    expected = int((data.labels[:, 1:] != -100).sum())
    _one_step(
        lambda: Spy(TinyGPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16)),
        make_args,
        data,
        bs=2,
        ga=4,
    )
    assert seen == [expected] * 4


# ------------------------------------------------------------------ other loop behaviour
def test_label_smoothing_changes_the_loss(make_args):
    data = PaddedLM()
    plain = _one_step(MeanTokenLM, make_args, data, bs=4, ga=2)
    smooth = _one_step(MeanTokenLM, make_args, data, bs=4, ga=2, label_smoothing_factor=0.1)
    assert any(not torch.allclose(plain[k], smooth[k]) for k in plain)


class InfOnce(nn.Module):
    """Loss becomes inf on its 2nd forward, so the fp16 grad scaler skips that update."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 1)
        self.calls = 0

    def forward(self, x, labels=None):
        self.calls += 1
        out = self.lin(x).squeeze(-1)
        loss = nn.functional.mse_loss(out.float(), labels)
        if self.calls == 2:
            loss = loss * float("inf")
        return {"loss": loss, "logits": out}


def test_fp16_skipped_step_is_attempted_not_applied(make_args):
    args = make_args(per_device_train_batch_size=4, max_steps=4, fp16=True, logging_steps=1)
    trainer = Trainer(model=InfOnce(), args=args, train_dataset=VectorDataset(n=64))
    out = trainer.train()
    # the scaler skips the inf step (and early overflowing ones while its scale settles)
    assert out.global_step == 4
    assert trainer.state.optimizer_step_attempts == trainer.model.calls
    assert trainer.state.optimizer_step_attempts >= 5


def test_fractional_epochs_and_state_epoch(make_args):
    args = make_args(per_device_train_batch_size=4, num_train_epochs=0.5)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=32))
    out = trainer.train()
    assert out.global_step == 4
    assert trainer.state.epoch == pytest.approx(0.5)


class Stream(IterableDataset):
    def __iter__(self):
        for i in range(40):
            yield {"x": torch.full((8,), float(i % 5)), "labels": torch.tensor(float(i % 3))}


def test_iterable_dataset_needs_max_steps_and_runs_over_epochs(make_args):
    with pytest.raises(ValueError, match="max_steps"):
        Trainer(model=DropoutMLP(), args=make_args(), train_dataset=Stream())
    args = make_args(per_device_train_batch_size=8, max_steps=12)
    trainer = Trainer(model=DropoutMLP(), args=args, train_dataset=Stream())
    assert trainer.train().global_step == 12
    assert trainer.cursor.epoch == 2


def test_model_and_model_init_checks(make_args):
    with pytest.raises(ValueError, match="not both"):
        Trainer(model=RegressionModel(), model_init=RegressionModel, args=make_args())
    with pytest.raises(RuntimeError, match="model"):
        Trainer(args=make_args())
    trainer = Trainer(
        model_init=lambda: RegressionModel(), args=make_args(max_steps=2), train_dataset=RegressionDataset()
    )
    assert trainer.train().global_step == 2


def test_eval_strategy_without_eval_dataset_fails_before_training(make_args):
    trainer = regression_trainer(make_args(eval_strategy="steps", eval_steps=1))
    with pytest.raises(ValueError, match="eval_dataset"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_callback_registry(make_args):
    from trainwright import DefaultFlowCallback, PrinterCallback

    trainer = Trainer(model=RegressionModel(), args=make_args())
    names = [type(c).__name__ for c in trainer.callback_handler.callbacks]
    assert names[0] == "DefaultFlowCallback" and names[-1] == "PrinterCallback"
    rec = Recorder()
    trainer.add_callback(rec)
    assert trainer.pop_callback(Recorder) is rec
    assert trainer.pop_callback(Recorder) is None
    trainer.remove_callback(PrinterCallback)
    assert not any(isinstance(c, PrinterCallback) for c in trainer.callback_handler.callbacks)
    assert isinstance(trainer.callback_handler.callbacks[0], DefaultFlowCallback)


def test_handler_calls_only_overriding_callbacks(make_args):
    class OnlyLog(TrainerCallback):
        def on_log(self, args, state, control, **kw):
            pass

    trainer = Trainer(model=RegressionModel(), args=make_args(), callbacks=[OnlyLog()])
    listeners = trainer.callback_handler._listeners
    assert not any(isinstance(c, OnlyLog) for c in listeners["on_step_end"])
    assert any(isinstance(c, OnlyLog) for c in listeners["on_log"])


def test_weight_decay_skips_biases_and_norms(make_args):
    model = tiny_gpt2()
    trainer = Trainer(model=model, args=make_args(weight_decay=0.1))
    opt = trainer.create_optimizer()
    decay = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    for name, p in model.named_parameters():
        if name.endswith("bias") or ".ln_" in name or name.startswith("transformer.ln_f"):
            assert id(p) not in decay, name
    assert id(model.transformer.h[0].mlp.c_fc.weight) in decay


def test_transformers_model_trains_and_loss_falls(make_args):
    data = PaddedLM(n=32)
    args = make_args(per_device_train_batch_size=8, max_steps=30, learning_rate=5e-3, logging_steps=10)
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=data)
    trainer.train()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert losses[-1] < losses[0] - 0.3
    assert all(math.isfinite(x) for x in losses)


def test_unlogged_losses_are_folded_into_train_loss(make_args, monkeypatch):
    import trainwright.loop.run.training_run as run_module

    def run(**kw):
        args = make_args(per_device_train_batch_size=4, max_steps=10, **kw)
        trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=64))
        return trainer, trainer.train()

    _, logged = run(logging_steps=1)
    monkeypatch.setattr(run_module, "MAX_UNLOGGED_STEPS", 3)
    trainer, folded = run(logging_strategy="no")
    assert folded.training_loss == pytest.approx(logged.training_loss, rel=1e-6)
    assert not [r for r in trainer.state.log_history if "loss" in r]
    assert trainer.cursor.steps_since_log == 0


def test_label_smoothing_with_accumulation_equals_the_full_batch(make_args):
    """Label smoothing divides by the step's items itself, whatever the model takes: the accumulated
    step must not weight its micro-batches' losses a second time."""
    data = PaddedLM()
    full = _one_step(MeanTokenLM, make_args, data, bs=8, ga=1, label_smoothing_factor=0.1)
    acc = _one_step(MeanTokenLM, make_args, data, bs=2, ga=4, label_smoothing_factor=0.1)
    _assert_same(full, acc)


def test_a_compute_loss_override_is_scaled_by_the_declared_facts(make_args):
    """Which loss is already `sum / N` follows from declared facts only (as upstream's
    model_accepts_loss_kwargs), not from what the default compute_loss did: an override that hands
    num_items_in_batch to a model that divides by it gives the full batch's update."""

    class Override(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(**inputs, num_items_in_batch=num_items_in_batch)
            return (outputs["loss"], outputs) if return_outputs else outputs["loss"]

    def tiny():
        return TinyGPT(
            TinyGPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16, dropout=0.0)
        )

    data = PaddedLM()
    full = _one_step(tiny, make_args, data, bs=8, ga=1)
    _assert_same(full, _one_step(tiny, make_args, data, bs=2, ga=4, trainer_cls=Override))
