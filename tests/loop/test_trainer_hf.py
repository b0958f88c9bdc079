"""transformers models and datasets through the Trainer: columns, saving, seq2seq, options."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from conftest import tiny_gpt2, tiny_t5

from trainwright import Seq2SeqTrainer, Seq2SeqTrainingArguments, Trainer

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")


def lm_dataset(n=32, seq=16, vocab=64, extra_columns=True):
    rng = np.random.default_rng(0)
    ids = rng.integers(1, vocab, size=(n, seq)).tolist()
    columns = {"input_ids": ids, "labels": ids}
    if extra_columns:
        columns["text"] = [f"row {i}" for i in range(n)]  # not a forward argument: must be dropped
        columns["source"] = ["synthetic"] * n
    return datasets.Dataset.from_dict(columns).with_format("torch")


def test_remove_unused_columns_on_datasets_dataset(make_args):
    args = make_args(per_device_train_batch_size=8, max_steps=3)
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=lm_dataset(), eval_dataset=lm_dataset(16))
    assert trainer.train().global_step == 3
    assert "eval_loss" in trainer.evaluate()
    batch = next(iter(trainer.get_train_dataloader()))
    assert set(batch) == {"input_ids", "labels"}
    assert set(trainer._remove_unused_columns(lm_dataset()).column_names) == {"input_ids", "labels"}


def test_save_model_loads_with_from_pretrained(make_args, tmp_path):
    model = tiny_gpt2()
    args = make_args(per_device_train_batch_size=8, max_steps=2)
    trainer = Trainer(model=model, args=args, train_dataset=lm_dataset(extra_columns=False))
    trainer.train()
    out = str(tmp_path / "saved")
    trainer.save_model(out)
    assert os.path.isfile(os.path.join(out, "model.safetensors"))
    assert os.path.isfile(os.path.join(out, "training_args.json"))
    # upstream's file too, a plain dict that loads weights-only (nothing pickled)
    with open(os.path.join(out, "training_args.json")) as f:
        assert torch.load(os.path.join(out, "training_args.bin"), weights_only=True) == json.load(f)
    loaded = transformers.GPT2LMHeadModel.from_pretrained(out)
    for k, v in model.state_dict().items():
        assert torch.equal(v.cpu(), loaded.state_dict()[k]), k
    assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()  # still tied


def test_gradient_checkpointing_and_num_input_tokens(make_args):
    model = tiny_gpt2()
    args = make_args(
        per_device_train_batch_size=4,
        max_steps=2,
        gradient_checkpointing=True,
        logging_steps=1,
        include_num_input_tokens_seen=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=lm_dataset(extra_columns=False))
    trainer.train()
    assert model.is_gradient_checkpointing
    assert trainer.state.num_input_tokens_seen == 2 * 4 * 16
    assert trainer.state.log_history[0]["num_input_tokens_seen"] == 4 * 16


def test_group_by_length_trains_on_variable_lengths(make_args):
    rng = np.random.default_rng(1)
    rows = [rng.integers(1, 64, size=int(n)).tolist() for n in rng.integers(4, 30, size=48)]
    data = datasets.Dataset.from_dict({"input_ids": rows, "labels": rows})

    from trainwright.data import pad_sequence_collator

    args = make_args(per_device_train_batch_size=4, num_train_epochs=1, group_by_length=True)
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=data, data_collator=pad_sequence_collator())
    assert trainer.train().global_step == 12
    widths = [batch["input_ids"].shape[1] for batch in trainer.get_train_dataloader()]
    longest = max(len(r) for r in rows)
    assert widths[0] == longest  # the batch holding the longest sample comes first


def test_tokenizer_argument_is_an_alias_with_a_warning(make_args):
    class Tok:
        def save_pretrained(self, path):
            open(os.path.join(path, "tok.txt"), "w").close()

    with pytest.warns(FutureWarning, match="processing_class"):
        trainer = Trainer(model=tiny_gpt2(), args=make_args(), tokenizer=Tok())
    assert isinstance(trainer.processing_class, Tok)


def test_seq2seq_predict_with_generate(tmp_path):
    rng = np.random.default_rng(0)
    src = rng.integers(2, 32, size=(12, 6)).tolist()
    data = datasets.Dataset.from_dict({"input_ids": src, "labels": src}).with_format("torch")
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        per_device_eval_batch_size=4,
        predict_with_generate=True,
        generation_max_length=5,
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
    )
    trainer = Seq2SeqTrainer(model=tiny_t5(), args=args)
    out = trainer.predict(data)
    assert out.predictions.shape[0] == 12 and out.predictions.shape[1] <= 5
    assert out.predictions.dtype.kind == "i"  # token ids, not logits
    assert "test_loss" in out.metrics
    longer = trainer.predict(data, max_length=8)
    assert longer.predictions.shape[1] > out.predictions.shape[1]
    args.predict_with_generate = False
    logits = trainer.predict(data)
    assert logits.predictions[0].ndim == 3  # (batch, target length, vocab) logits without generation
