"""Gradient accumulation with models whose forward takes `**kwargs`.

transformers' BERT, BART and T5 heads take `**kwargs` but compute their own mean
`CrossEntropyLoss`: they drop `num_items_in_batch`. GPT-2 (and BertLMHeadModel) route it into
their loss and return sum / N. Whatever the model does, one optimizer step of 4 micro-batches of 2
must give the update and the logged loss of one batch of the same 8 rows, also when the label
counts differ between micro-batches. Batches here are plain dicts (trainwright's
`pad_sequence_collator`), so only the model's loss handling is under test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kit import hf
from kit.hf import (
    build_model,
    cls_dataset,
    mlm_dataset,
    ner_dataset,
    seq2seq_dataset,
    transformers,
)

from trainwright import Trainer, TrainingArguments
from trainwright.data import pad_sequence_collator

tokenizer, tokenizer_dir = hf.tokenizer, hf.tokenizer_dir  # session fixtures
datasets = hf.datasets


def masked_lm_rows(tok, n: int = 8, seed: int = 0, empty_rows=()):
    """MLM rows with fixed masks: about 30% of ordinary tokens replaced by <mask> and labelled.
    Rows in `empty_rows` keep no target at all (labels all -100): a short text can draw no mask."""
    data = mlm_dataset(tok, n, seed=seed)
    rows = {"input_ids": [], "attention_mask": [], "labels": []}
    for i, row in enumerate(data):
        ids, special = np.array(row["input_ids"]), np.array(row["special_tokens_mask"])
        chosen = (np.random.default_rng(100 + i).random(len(ids)) < 0.3) & (special == 0)
        if i in empty_rows:
            chosen[:] = False
        elif not chosen.any():
            chosen[int(np.flatnonzero(special == 0)[0])] = True
        rows["labels"].append(np.where(chosen, ids, -100).tolist())
        rows["input_ids"].append(np.where(chosen, tok.mask_token_id, ids).tolist())
        rows["attention_mask"].append(row["attention_mask"])
    return datasets.Dataset.from_dict(rows)


def causal_lm_rows(tok, n: int = 8, seed: int = 0, empty_rows=()):
    """GPT-2 rows, labels = input_ids; rows in `empty_rows` have every label -100."""
    data = hf.clm_dataset(tok, n, seed=seed)
    labels = [[-100] * len(r) if i in empty_rows else list(r) for i, r in enumerate(data["input_ids"])]
    return data.add_column("labels", labels)


def classification_rows(tok, n: int = 8):
    return cls_dataset(tok, n).rename_column("label", "labels")


class KwargsTagger(torch.nn.Module):
    """Not a transformers model: takes **kwargs and ignores them, returns a mean loss."""

    def __init__(self, vocab: int, num_labels: int = 5):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(vocab, 16)
        self.head = torch.nn.Linear(16, num_labels)

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        logits = self.head(torch.tanh(self.emb(input_ids)))
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return {"loss": loss, "logits": logits}


# name: (model factory, rows factory, extra TrainingArguments)
VARIANTS = {
    "bert-cls": (lambda tok: build_model("bert-cls", tok), classification_rows, {}),
    "bert-mlm": (lambda tok: build_model("bert-mlm", tok), masked_lm_rows, {}),
    "bert-tok": (lambda tok: build_model("bert-tok", tok), lambda tok: ner_dataset(tok, 8), {}),
    "bart": (lambda tok: build_model("bart", tok), lambda tok: seq2seq_dataset(tok, 8), {}),
    "t5": (lambda tok: build_model("t5", tok), lambda tok: seq2seq_dataset(tok, 8), {}),
    # label smoothing takes the labels out of the forward: decoder inputs come from the collator
    "bart-label-smoothing": (
        lambda tok: build_model("bart", tok),
        lambda tok: seq2seq_dataset(tok, 8),
        {"label_smoothing_factor": 0.1},
    ),
    # models that honour num_items_in_batch, or say they do not
    "gpt2": (lambda tok: build_model("gpt2", tok), causal_lm_rows, {}),
    "gpt2-declares-no-loss-kwargs": (
        lambda tok: _declare(build_model("gpt2", tok), accepts_loss_kwargs=False),
        causal_lm_rows,
        {},
    ),
    "plain-module-kwargs": (lambda tok: KwargsTagger(len(tok)), lambda tok: ner_dataset(tok, 8), {}),
    # a micro-batch without any label target (first, or later in the step)
    "bert-mlm-empty-first-micro-batch": (
        lambda tok: build_model("bert-mlm", tok),
        lambda tok: masked_lm_rows(tok, empty_rows=(0, 1)),
        {},
    ),
    "bert-mlm-empty-later-micro-batch": (
        lambda tok: build_model("bert-mlm", tok),
        lambda tok: masked_lm_rows(tok, empty_rows=(4, 5)),
        {},
    ),
    "gpt2-empty-first-micro-batch": (
        lambda tok: build_model("gpt2", tok),
        lambda tok: causal_lm_rows(tok, empty_rows=(0, 1)),
        {},
    ),
}


def _declare(model, **attrs):
    for k, v in attrs.items():
        setattr(model, k, v)
    return model


def make_collator(tok, model, extra):
    if extra.get("label_smoothing_factor"):  # what run_summarization.py does, as plain dicts
        seq2seq = transformers.DataCollatorForSeq2Seq(tok, model=model)
        return lambda features: dict(seq2seq(features))
    return pad_sequence_collator(pad_token_id=tok.pad_token_id)


def one_step(tok, variant: str, out: str, ga: int, bs: int):
    make_model, make_rows, extra = VARIANTS[variant]
    model = make_model(tok)
    rows = make_rows(tok)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    args = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=bs,
        gradient_accumulation_steps=ga,
        max_steps=1,
        optim="sgd",
        learning_rate=2.0,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,  # clipping would hide a wrongly scaled gradient
        logging_steps=1,
        train_sampling_strategy="sequential",  # micro-batch i holds rows 2i, 2i+1
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        save_strategy="no",
        seed=0,
        **extra,
    )
    collator = make_collator(tok, model, extra)
    trainer = Trainer(model=model, args=args, train_dataset=rows, data_collator=collator)
    trainer.train()
    delta = {k: v.detach() - before[k] for k, v in model.named_parameters()}
    return trainer, delta, rows, collator


def full_batch_loss(tok, variant: str, rows, collator, label_smoothing: float = 0.0) -> float:
    """The loss of all 8 rows as one batch, computed here from a fresh copy of the model."""
    make_model = VARIANTS[variant][0]
    model = make_model(tok).eval()
    batch = collator([rows[i] for i in range(len(rows))])
    keep = {"input_ids", "attention_mask", "labels", "token_type_ids", "decoder_input_ids"}
    with torch.no_grad():
        out = model(**{k: v for k, v in batch.items() if k in keep})
    if not label_smoothing:
        return float(out["loss"])
    from trainwright.modeling.loss import LabelSmoother

    return float(LabelSmoother(label_smoothing)(out, batch["labels"]))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_accumulation_4x2_equals_one_batch_of_8(tokenizer, tmp_path, variant):
    full, d_full, rows, collator = one_step(tokenizer, variant, str(tmp_path / "full"), ga=1, bs=8)
    accum, d_accum, _, _ = one_step(tokenizer, variant, str(tmp_path / "accum"), ga=4, bs=2)
    smoothing = VARIANTS[variant][2].get("label_smoothing_factor", 0.0)
    reference = full_batch_loss(tokenizer, variant, rows, collator, smoothing)
    assert np.isfinite(reference)
    assert full.state.log_history[0]["loss"] == pytest.approx(reference, rel=1e-5)

    problems = []
    loss_accum = accum.state.log_history[0]["loss"]
    if not loss_accum == pytest.approx(reference, rel=1e-5):
        problems.append(
            f"logged loss of 4 x 2 is {loss_accum:.6g}, the loss of the 8 rows is {reference:.6g}"
        )
    scale = max(float(d.abs().max()) for d in d_full.values())
    assert scale > 1e-3  # the step did move the weights
    nonfinite = [k for k in d_accum if not torch.isfinite(d_accum[k]).all()]
    worst = max(float((d_accum[k] - d_full[k]).abs().max()) for k in d_full if k not in nonfinite)
    if nonfinite:
        problems.append(f"4 x 2 left non-finite weights in {len(nonfinite)} tensors, e.g. {nonfinite[:2]}")
    elif not worst <= 1e-5 * scale:
        moved = [k for k in d_full if d_full[k].abs().max() > 1e-2 * scale]
        ratios = [
            float(d_accum[k].flatten() @ d_full[k].flatten()) / float(d_full[k].norm() ** 2) for k in moved
        ]
        problems.append(
            f"update of 4 x 2 differs from 1 x 8: max |diff| {worst:.3g} vs max |update| {scale:.3g} "
            f"(accumulated/full update per tensor {min(ratios):.4f}..{max(ratios):.4f})"
        )
    assert not problems, "; ".join(problems)


def test_label_counts_differ_between_micro_batches(tokenizer):
    """What makes the comparison above sensitive to the weighting."""
    collator = pad_sequence_collator(pad_token_id=tokenizer.pad_token_id)
    for variant in ("bert-mlm", "bert-tok", "bart", "gpt2"):
        rows = VARIANTS[variant][1](tokenizer)
        counts = {int((collator([rows[i], rows[i + 1]])["labels"] != -100).sum()) for i in range(0, 8, 2)}
        assert len(counts) > 1, variant


def test_trained_models_still_load_with_from_pretrained(tokenizer, tmp_path):
    """A BERT trained with accumulation saves and loads back with from_pretrained, weights equal."""
    trainer, _, _, _ = one_step(tokenizer, "bert-cls", str(tmp_path / "run"), ga=4, bs=2)
    trainer.save_model(str(tmp_path / "saved"))
    loaded = transformers.BertForSequenceClassification.from_pretrained(str(tmp_path / "saved"))
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k
