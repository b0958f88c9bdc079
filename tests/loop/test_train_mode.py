"""Training mode before every micro-batch, as transformers' `training_step` sets it: a module left in
evaluation mode anywhere in the tree trains with dropout, each case beside transformers.Trainer on the
same model, data and seed (loss by loss)."""

from __future__ import annotations

import pytest
import torch
from kit import hf
from torch import nn

from trainwright import Trainer, TrainerCallback, TrainingArguments

transformers = pytest.importorskip("transformers")
tokenizer, tokenizer_dir = hf.tokenizer, hf.tokenizer_dir  # session fixtures


class Wrapper(nn.Module):
    """A library's wrapper around a transformers model (as SentenceTransformer holds its transformer):
    the wrapper reports `training=True` while the model inside, loaded with `from_pretrained`, is in
    evaluation mode."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, **inputs):
        return self.inner(**inputs)


class FrozenNorms(Wrapper):
    """A wrapper whose `train()` keeps its dropout in evaluation mode (a user's override)."""

    calls = 0

    def train(self, mode: bool = True):
        FrozenNorms.calls += 1
        super().train(mode)
        self.inner.bert.embeddings.dropout.eval()
        return self


class EvalAtStepEnd(TrainerCallback):
    """A callback that leaves the model in evaluation mode after every step."""

    def on_step_end(self, args, state, control, model=None, **kwargs):
        model.eval()


def _losses(trainer_cls, args_cls, tmp_path, tok, model, callbacks=()) -> list[float]:
    args = args_cls(
        output_dir=str(tmp_path / trainer_cls.__module__),
        max_steps=3,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=3,
        disable_tqdm=True,
        remove_unused_columns=False,  # the wrapper's forward takes **inputs
    )
    trainer = trainer_cls(
        model=model,
        args=args,
        train_dataset=hf.cls_dataset(tok, 16),
        data_collator=transformers.DataCollatorWithPadding(tok),
        callbacks=list(callbacks),
    )
    trainer.train()
    return [row["loss"] for row in trainer.state.log_history if "loss" in row]


def _model(tok, wrapper=Wrapper) -> nn.Module:
    inner = hf.bert("cls", seed=0, dropout=0.3, num_labels=3, max_position_embeddings=64, **hf.token_ids(tok))
    return wrapper(inner.eval())  # `from_pretrained` returns a model in evaluation mode


def _both(tmp_path, tok, wrapper=Wrapper, callbacks=()) -> tuple[list[float], list[float]]:
    theirs = _losses(
        transformers.Trainer, transformers.TrainingArguments, tmp_path, tok, _model(tok, wrapper), callbacks
    )
    ours = _losses(Trainer, TrainingArguments, tmp_path, tok, _model(tok, wrapper), callbacks)
    return theirs, ours


def _without_dropout(tmp_path, tok) -> list[float]:
    model = _model(tok)
    model.inner.config.hidden_dropout_prob = model.inner.config.attention_probs_dropout_prob = 0.0
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    return _losses(Trainer, TrainingArguments, tmp_path, tok, model)


def test_a_model_in_evaluation_mode_inside_a_wrapper_trains_with_dropout(tmp_path, tokenizer):
    theirs, ours = _both(tmp_path, tokenizer)
    assert ours == pytest.approx(theirs, rel=1e-6)
    assert ours != pytest.approx(_without_dropout(tmp_path, tokenizer), rel=1e-4)  # dropout did act


def test_a_callback_that_leaves_the_model_in_evaluation_mode(tmp_path, tokenizer):
    theirs, ours = _both(tmp_path, tokenizer, callbacks=[EvalAtStepEnd()])
    assert ours == pytest.approx(theirs, rel=1e-6)


def test_a_module_whose_train_does_more_is_called_every_step(tmp_path, tokenizer):
    FrozenNorms.calls = 0
    theirs, _ = _both(tmp_path, tokenizer, wrapper=FrozenNorms)
    upstream_calls = FrozenNorms.calls
    FrozenNorms.calls = 0
    ours = _losses(Trainer, TrainingArguments, tmp_path, tokenizer, _model(tokenizer, FrozenNorms))
    assert ours == pytest.approx(theirs, rel=1e-6)
    assert FrozenNorms.calls >= 3 and upstream_calls >= 3  # once a micro-batch at least, on both


def test_an_unchanged_tree_is_not_walked_again(tmp_path, tokenizer, monkeypatch):
    """A plain tree whose modules all train gets no `model.train()` call after the first."""
    calls = []
    original = nn.Module.train
    monkeypatch.setattr(
        nn.Module, "train", lambda self, mode=True: calls.append(mode) or original(self, mode)
    )
    model = _model(tokenizer)
    _losses(Trainer, TrainingArguments, tmp_path, tokenizer, model)
    top_level = [c for c in calls if c]
    assert model.inner.training and len(top_level) < 3 * len(list(model.modules()))


class ReturnsLoss(Trainer):
    """A library's trainer that sets `can_return_loss` after `__init__` (sentence-transformers does)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.can_return_loss = True


class LossWithoutLabels(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 1)

    def forward(self, x):  # no `labels` and no `return_loss` in its signature
        return {"loss": self.lin(x).pow(2).mean()}


def test_model_init_keeps_what_init_set(tmp_path):
    """As transformers: `train()` with `model_init` builds a new model and leaves `can_return_loss`
    (and the label names) as `__init__` left them, so the evaluation asks the model for its loss."""
    data = [{"x": torch.randn(2)} for _ in range(8)]
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, report_to="none", use_cpu=True
    )
    trainer = ReturnsLoss(model_init=LossWithoutLabels, args=args, train_dataset=data, eval_dataset=data)
    trainer.train()
    assert trainer.can_return_loss is True
    assert "eval_loss" in trainer.evaluate()
