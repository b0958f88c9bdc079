"""transformers' own data collators, fed with text tokenized by a real fast tokenizer, through the Trainer.

What users really pass: most of these collators return a `BatchEncoding` (a `Mapping`, not a
`dict`), label counts differ between micro-batches, and seq2seq collators add
`decoder_input_ids`. For each collator:

(a) gradient accumulation 4 x 2 gives the update and logged loss of one batch of 8;
(b) samples, tokens (`num_input_tokens_seen`) and `total_flos` are what the batches hold, and
    `total_flos` is the same as with the same batches as plain dicts;
(c) a run stopped at a mid-epoch checkpoint and resumed in a new process ends bit-identical.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from kit import hf, job, job_env
from kit.hf import (
    build_model,
    clm_dataset,
    cls_dataset,
    mlm_dataset,
    ner_dataset,
    seq2seq_dataset,
    transformers,
)
from safetensors.torch import load_file

from trainwright import Trainer, TrainingArguments

tokenizer, tokenizer_dir = hf.tokenizer, hf.tokenizer_dir  # session fixtures

JOB = job("collator_resume_job.py")


# --------------------------------------------------------------------------- the cases
@dataclasses.dataclass(frozen=True)
class Case:
    """A collator with the model and data it is made for.

    `collator(tok, model, deterministic)`: with `deterministic`, a collator whose output does not
    depend on how features are grouped into calls (MLM: fixed masks, see `mlm_dataset`).
    """

    model: str
    data: Callable[..., Any]
    collator: Callable[..., Any]
    keep_columns: bool = False  # remove_unused_columns=False (the collator needs a non-forward column)
    flattened: bool = False  # one row per batch: samples are the sequences packed into it


def _mlm(tok, model, deterministic):
    if deterministic:  # every token not marked special is masked, always by <mask>
        return transformers.DataCollatorForLanguageModeling(
            tok, mlm=True, mlm_probability=1.0, mask_replace_prob=1.0, random_replace_prob=0.0
        )
    return transformers.DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.15)


def _mlm_data(tok, n, seed=0, deterministic=False):
    return mlm_dataset(tok, n, seed=seed, deterministic_masks=deterministic)


def _nodet(builder):
    return lambda tok, n, seed=0, deterministic=False: builder(tok, n, seed=seed)


CASES = {
    "lm-mlm-bert": Case("bert-mlm", _mlm_data, _mlm, keep_columns=True),
    "lm-clm-gpt2": Case(
        "gpt2",
        _nodet(clm_dataset),
        lambda tok, m, d: transformers.DataCollatorForLanguageModeling(tok, mlm=False),
    ),
    "padding-bert-cls": Case(
        "bert-cls", _nodet(cls_dataset), lambda tok, m, d: transformers.DataCollatorWithPadding(tok)
    ),
    "padding-bert-cls-multiple-of-8": Case(
        "bert-cls",
        _nodet(cls_dataset),
        lambda tok, m, d: transformers.DataCollatorWithPadding(tok, pad_to_multiple_of=8),
    ),
    "seq2seq-bart": Case(
        "bart", _nodet(seq2seq_dataset), lambda tok, m, d: transformers.DataCollatorForSeq2Seq(tok, model=m)
    ),
    "seq2seq-bart-multiple-of-8": Case(
        "bart",
        _nodet(seq2seq_dataset),
        lambda tok, m, d: transformers.DataCollatorForSeq2Seq(tok, model=m, pad_to_multiple_of=8),
    ),
    "seq2seq-t5": Case(
        "t5", _nodet(seq2seq_dataset), lambda tok, m, d: transformers.DataCollatorForSeq2Seq(tok, model=m)
    ),
    "tokcls-bert": Case(
        "bert-tok",
        _nodet(ner_dataset),
        lambda tok, m, d: transformers.DataCollatorForTokenClassification(tok),
    ),
    "flatten-gpt2": Case(
        "gpt2",
        _nodet(clm_dataset),
        lambda tok, m, d: transformers.DataCollatorWithFlattening(),
        flattened=True,
    ),
    "default-gpt2": Case(
        "gpt2",
        lambda tok, n, seed=0, deterministic=False: clm_dataset(tok, n, seed=seed, pad_to=40),
        lambda tok, m, d: transformers.default_data_collator,
    ),
}
SLOW_RESUME = {  # same collator class as an unmarked case
    "seq2seq-t5",
    "lm-clm-gpt2",
    "padding-bert-cls-multiple-of-8",
    "seq2seq-bart-multiple-of-8",
}


def build(case_name: str, tok, n: int, seed: int = 0, deterministic: bool = False, model_seed: int = 0):
    """(model, dataset, collator) for a case; a public function so the resume job builds the same."""
    case = CASES[case_name]
    model = build_model(case.model, tok, seed=model_seed)
    return (
        model,
        case.data(tok, n, seed=seed, deterministic=deterministic),
        case.collator(tok, model, deterministic),
    )


def make_args(out: str, **kw) -> TrainingArguments:
    kw.setdefault("report_to", "none")
    kw.setdefault("disable_tqdm", True)
    kw.setdefault("save_strategy", "no")
    kw.setdefault("use_cpu", True)
    kw.setdefault("seed", 0)
    return TrainingArguments(output_dir=out, **kw)


class Recorder:
    """Wraps a collator, keeps what it returned; `as_dict` hands the Trainer a plain dict instead."""

    def __init__(self, collator, as_dict: bool = False):
        self.collator, self.as_dict = collator, as_dict
        self.batches: list[tuple[int, Any]] = []  # (features given, batch returned)

    def __call__(self, features):
        batch = self.collator(features)
        if self.as_dict:
            batch = dict(batch)
        self.batches.append((len(features), batch))
        return batch


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


# --------------------------------------------------------------------------- (a) accumulation
def _one_step(tok, case_name: str, out: str, ga: int, bs: int):
    case = CASES[case_name]
    model, data, collator = build(case_name, tok, n=8, deterministic=True)
    before = _params(model)
    args = make_args(
        out,
        per_device_train_batch_size=bs,
        gradient_accumulation_steps=ga,
        max_steps=1,
        optim="sgd",
        learning_rate=2.0,  # large: the update stands well above float32 rounding of the weights
        lr_scheduler_type="constant",
        max_grad_norm=0.0,  # no clipping: it would hide a wrongly scaled gradient
        logging_steps=1,
        remove_unused_columns=not case.keep_columns,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=collator)
    trainer.train()
    delta = {k: v.detach() - before[k] for k, v in model.named_parameters()}
    return trainer, delta, data, collator


def _full_batch_loss(tok, case_name: str, data, collator) -> float:
    """Loss of the untrained model on all 8 rows collated as one batch (computed here, not by the Trainer)."""
    case = CASES[case_name]
    model = build_model(case.model, tok)
    model.eval()
    rows = [data[i] for i in range(len(data))]
    batch = dict(collator(rows))
    forward = set(inspect.signature(model.forward).parameters)
    with torch.no_grad():
        return float(model(**{k: v for k, v in batch.items() if k in forward}).loss)


@pytest.mark.parametrize("case_name", list(CASES))
def test_accumulation_4x2_equals_one_batch_of_8(tokenizer, tmp_path, case_name):
    full, d_full, data, collator = _one_step(tokenizer, case_name, str(tmp_path / "full"), ga=1, bs=8)
    accum, d_accum, _, _ = _one_step(tokenizer, case_name, str(tmp_path / "accum"), ga=4, bs=2)
    # (test_micro_batches_hold_different_label_counts: what makes the weighting matter here)
    assert full.state.global_step == accum.state.global_step == 1

    reference = _full_batch_loss(tokenizer, case_name, data, collator)
    assert full.state.log_history[0]["loss"] == pytest.approx(reference, rel=1e-5)
    loss_accum = accum.state.log_history[0]["loss"]

    scale = max(float(d.abs().max()) for d in d_full.values())
    assert scale > 1e-3  # the step did move the weights
    assert all(torch.isfinite(d).all() for d in d_accum.values()), "4 x 2 left non-finite weights"
    worst = max(float((d_accum[k] - d_full[k]).abs().max()) for k in d_full)
    ratios = [  # accumulated / full update, projected, per tensor that moved
        float(d_accum[k].flatten() @ d_full[k].flatten()) / float(d_full[k].norm() ** 2)
        for k in d_full
        if d_full[k].abs().max() > 1e-2 * scale
    ]
    problems = []
    if worst > 1e-5 * scale:
        problems.append(
            f"update of 4 x 2 differs from 1 x 8: max |diff| {worst:.3g} vs max |update| {scale:.3g} "
            f"(accumulated/full update per tensor {min(ratios):.4f}..{max(ratios):.4f})"
        )
    if loss_accum != pytest.approx(reference, rel=1e-5):
        problems.append(
            f"logged loss of 4 x 2 is {loss_accum:.6g}, the loss of the 8 rows is {reference:.6g}"
        )
    assert not problems, "; ".join(problems)


def test_micro_batches_hold_different_label_counts(tokenizer):
    """The accumulation cases above are only meaningful if the label counts differ per micro-batch."""
    for case_name in (
        "lm-mlm-bert",
        "lm-clm-gpt2",
        "seq2seq-bart",
        "tokcls-bert",
        "flatten-gpt2",
        "default-gpt2",
    ):
        _, data, collator = build(case_name, tokenizer, n=8, deterministic=True)
        counts = {int((collator([data[i], data[i + 1]])["labels"] != -100).sum()) for i in range(0, 8, 2)}
        assert len(counts) > 1, case_name


# --------------------------------------------------------------------------- (b) counts
def _non_embedding_parameters(model) -> int:
    embedding = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    unique = {id(p): p for p in model.parameters()}
    return sum(p.numel() for i, p in unique.items() if i not in embedding)


def _count_run(tok, case_name: str, out: str, as_dict: bool, tokens_mode: str = "all"):
    case = CASES[case_name]
    model, data, collator = build(case_name, tok, n=16, seed=1)
    recorder = Recorder(collator, as_dict=as_dict)
    args = make_args(
        out,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        num_train_epochs=1,
        logging_steps=2,
        include_num_input_tokens_seen=tokens_mode,
        remove_unused_columns=not case.keep_columns,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=recorder)
    result = trainer.train()
    return trainer, result, recorder, model


@pytest.mark.parametrize("case_name", list(CASES))
def test_samples_tokens_and_flos_are_what_the_batches_hold(tokenizer, tmp_path, case_name):
    torch.manual_seed(0)
    trainer, result, recorder, model = _count_run(tokenizer, case_name, str(tmp_path / "a"), as_dict=False)
    torch.manual_seed(0)
    plain, plain_result, _, _ = _count_run(tokenizer, case_name, str(tmp_path / "b"), as_dict=True)

    samples = sum(n for n, _ in recorder.batches)
    tokens = sum(int(batch["input_ids"].numel()) for _, batch in recorder.batches)
    assert samples == 16 and len(recorder.batches) == 8
    assert trainer.state.global_step == 4

    # tokens: every input id the batches held, padding included ("all")
    assert trainer.state.num_input_tokens_seen == tokens, (
        f"num_input_tokens_seen {trainer.state.num_input_tokens_seen}, the batches held {tokens}"
    )
    assert trainer.state.log_history[-2]["num_input_tokens_seen"] == tokens  # last training row
    assert trainer.cursor.tokens_seen == tokens
    # samples: rows of the dataset consumed (a flattened batch packs its rows into one sequence)
    assert trainer.cursor.samples_seen == samples, (
        f"samples seen {trainer.cursor.samples_seen}, the batches held {samples}"
    )
    metrics = result.metrics
    assert metrics["train_samples_per_second"] * metrics["train_runtime"] == pytest.approx(samples, rel=0.02)

    # FLOPs: the same for the same batches as plain dicts, and upstream's 6 x N x tokens estimate
    assert trainer.state.total_flos == plain.state.total_flos, (
        f"total_flos {trainer.state.total_flos:.4g} with the collator's batches, "
        f"{plain.state.total_flos:.4g} with the same batches as dicts"
    )
    assert trainer.state.total_flos == pytest.approx(6 * _non_embedding_parameters(model) * tokens, rel=1e-9)
    assert metrics["total_flos"] == trainer.state.total_flos


@pytest.mark.parametrize("case_name", list(CASES))
def test_evaluate_and_predict_take_the_collators_batches_like_dicts(tokenizer, tmp_path, case_name):
    """Evaluation on the collator's batches gives what the same batches as plain dicts give."""
    case = CASES[case_name]
    outputs = []
    for as_dict in (False, True):
        model, data, collator = build(case_name, tokenizer, n=10, seed=3, deterministic=True)
        args = make_args(
            str(tmp_path / f"dict{as_dict}"),
            per_device_eval_batch_size=4,
            remove_unused_columns=not case.keep_columns,
        )
        trainer = Trainer(
            model=model, args=args, eval_dataset=data, data_collator=Recorder(collator, as_dict)
        )
        metrics = trainer.evaluate()
        prediction = trainer.predict(data)
        outputs.append((metrics, prediction))
    (metrics, prediction), (plain_metrics, plain_prediction) = outputs
    assert np.isfinite(metrics["eval_loss"])
    assert metrics["eval_loss"] == plain_metrics["eval_loss"]
    assert metrics["eval_samples_per_second"] * metrics["eval_runtime"] == pytest.approx(10, rel=0.05)
    assert prediction.metrics["test_loss"] == plain_prediction.metrics["test_loss"]
    logits = (
        prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
    )
    plain_logits = (
        plain_prediction.predictions[0]
        if isinstance(plain_prediction.predictions, tuple)
        else plain_prediction.predictions
    )
    np.testing.assert_array_equal(logits, plain_logits)
    np.testing.assert_array_equal(prediction.label_ids, plain_prediction.label_ids)
    if not case.flattened:  # one row per sample (a flattened batch is one row per batch)
        assert logits.shape[0] == prediction.label_ids.shape[0] == 10


def test_non_padding_tokens_count_the_attention_mask(tokenizer, tmp_path):
    trainer, _, recorder, _ = _count_run(
        tokenizer, "padding-bert-cls", str(tmp_path / "a"), as_dict=False, tokens_mode="non_padding"
    )
    real = sum(int(batch["attention_mask"].sum()) for _, batch in recorder.batches)
    padded = sum(int(batch["input_ids"].numel()) for _, batch in recorder.batches)
    assert real < padded  # the batches were padded
    assert trainer.state.num_input_tokens_seen == real


def test_random_masking_on_short_texts_logs_finite_losses(tokenizer, tmp_path):
    """run_mlm.py's collator (15% random masks) on short texts: some micro-batches draw no mask at
    all. They add nothing to the step, but neither may they turn its loss into NaN."""
    texts = hf.text_corpus(48, seed=5, min_words=1, max_words=2)
    data = hf.datasets.Dataset.from_dict({"text": texts}).map(
        lambda b: tokenizer(b["text"], return_special_tokens_mask=True), batched=True, remove_columns=["text"]
    )
    recorder = Recorder(transformers.DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15))
    args = make_args(
        str(tmp_path / "out"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        num_train_epochs=1,
        logging_steps=1,
        remove_unused_columns=False,
    )
    trainer = Trainer(
        model=build_model("bert-mlm", tokenizer), args=args, train_dataset=data, data_collator=recorder
    )
    result = trainer.train()
    empty = sum(int((batch["labels"] != -100).sum()) == 0 for _, batch in recorder.batches)
    assert empty > 0, "no micro-batch without masked tokens: the case is not exercised"
    bad = [
        (r["step"], r["loss"])
        for r in trainer.state.log_history
        if "loss" in r and not math.isfinite(r["loss"])
    ]
    assert not bad, (
        f"{empty} of {len(recorder.batches)} micro-batches had no masked token; logged losses {bad}"
    )
    assert math.isfinite(result.training_loss)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


# --------------------------------------------------------------------------- (c) resume
def run_job(cfg: dict) -> None:
    env = job_env(os.path.dirname(__file__))  # the job builds its cases with this module's functions
    proc = subprocess.run(
        [sys.executable, JOB, json.dumps(cfg)], capture_output=True, text=True, env=env, timeout=300
    )
    if proc.returncode != 0:
        raise AssertionError(f"job failed ({proc.returncode}):\n{proc.stderr[-4000:]}")


def _result(folder: str) -> tuple[dict, dict]:
    with open(os.path.join(folder, "result.json")) as f:
        res = json.load(f)
    return res, load_file(os.path.join(folder, "final", "model.safetensors"))


# 12 rows, batch 2, accumulation 2: 3 optimizer steps per epoch, 6 in all; checkpoint-2 is mid-epoch 0
@pytest.mark.parametrize(
    "case_name",
    [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_RESUME else c for c in CASES],
)
def test_resume_in_a_new_process_is_bit_identical(tokenizer_dir, tmp_path, case_name):
    from jobs import collator_resume_job

    reference = str(tmp_path / "reference")
    collator_resume_job.main({"case": case_name, "tokenizer": tokenizer_dir, "output_dir": reference})
    ref, ref_weights = _result(reference)
    assert ref["global_step"] == 6
    # (NaN never equals NaN: the comparisons below need a finite reference)
    bad = [row["step"] for row in ref["rows"] if not math.isfinite(row["loss"])]
    assert not bad and math.isfinite(ref["train_loss"]), (
        f"the uninterrupted run logged non-finite losses at steps {bad}, train_loss {ref['train_loss']}"
    )

    resumed = str(tmp_path / "resumed")
    os.makedirs(resumed)
    shutil.copytree(os.path.join(reference, "checkpoint-2"), os.path.join(resumed, "checkpoint-2"))
    run_job({"case": case_name, "tokenizer": tokenizer_dir, "output_dir": resumed, "resume": True})
    res, weights = _result(resumed)

    assert res["global_step"] == 6
    assert res["rows"] == ref["rows"]  # every logged loss, grad norm, learning rate and epoch
    differ = [k for k in ref_weights if not torch.equal(weights[k], ref_weights[k])]
    assert not differ, f"{len(differ)} of {len(ref_weights)} tensors differ after resume, e.g. {differ[:3]}"
    assert res["train_loss"] == ref["train_loss"]
    assert res["num_input_tokens_seen"] == ref["num_input_tokens_seen"] > 0
    assert res["samples_seen"] == ref["samples_seen"] == 24
