"""Batches that are a Mapping but not a dict (transformers' BatchEncoding, UserDict), and models
whose forward takes **kwargs without using num_items_in_batch (BERT, BART, T5 heads)."""

from __future__ import annotations

from collections import UserDict

import pytest
import torch
from kit import hf
from kit.runs import one_step
from torch.utils.data import Dataset

from trainwright import Trainer
from trainwright.data import default_data_collator

transformers = pytest.importorskip("transformers")
BatchEncoding = transformers.BatchEncoding


class VarLenLM(Dataset):
    """Token sequences padded to 12 with uneven label counts (labels -100 on padding)."""

    def __init__(self, n: int = 8, seq: int = 12, vocab: int = 64, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(3, vocab, (n, seq), generator=g)
        lengths = [3 + (7 * i) % (seq - 2) for i in range(n)]
        self.mask = torch.zeros(n, seq, dtype=torch.long)
        for i, length in enumerate(lengths):
            self.mask[i, :length] = 1
        self.labels = self.ids.masked_fill(self.mask == 0, -100)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


class ClassifyData(VarLenLM):
    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": torch.tensor(i % 3)}


def batch_encoding_collator(features):
    return BatchEncoding(default_data_collator(features))


def user_dict_collator(features):
    return UserDict(default_data_collator(features))


GPT2 = {"n_layer": 1, "n_positions": 16, "bos_token_id": 1, "eos_token_id": 2}
BERT = {"num_hidden_layers": 1, "intermediate_size": 37}


def gpt2():
    return hf.gpt2(**GPT2)


def bert_cls():
    return hf.bert("cls", num_labels=3, **BERT)


def bert_mlm():
    return hf.bert("mlm", **BERT)


def bart():
    return hf.bart(ffn_dim=37, max_position_embeddings=32)


def run(model_fn, make_args, data, bs, ga, collator=batch_encoding_collator, **kw):
    return one_step(model_fn, make_args, data, bs, ga, collator=collator, logging_steps=1, **kw)


def assert_same(a, b):
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=2e-5, atol=2e-6, msg=k)


@pytest.mark.parametrize(
    "collator", [batch_encoding_collator, user_dict_collator], ids=["BatchEncoding", "UserDict"]
)
def test_mapping_batches_accumulate_like_the_full_batch(make_args, collator):
    data = VarLenLM()
    full_trainer, full = run(gpt2, make_args, data, bs=8, ga=1, collator=collator)
    acc_trainer, acc = run(gpt2, make_args, data, bs=2, ga=4, collator=collator)
    assert_same(full, acc)
    full_loss = full_trainer.state.log_history[0]["loss"]
    assert acc_trainer.state.log_history[0]["loss"] == pytest.approx(full_loss, rel=1e-5)
    assert full_loss < 10  # a mean token loss (log 64 = 4.2), not a sum over micro-batches


def test_mapping_batches_count_samples_and_tokens(make_args):
    data = VarLenLM(n=8)
    trainer, _ = run(
        gpt2,
        make_args,
        data,
        bs=2,
        ga=2,
        include_num_input_tokens_seen="non_padding",
    )
    cursor = trainer.cursor
    assert cursor.samples_seen == 4  # one step of 2 micro-batches of 2
    assert cursor.tokens_seen == 4 * 12
    assert trainer.state.num_input_tokens_seen == int(data.mask[:4].sum())
    expected_flops = (
        6
        * sum(p.numel() for n, p in trainer.model.named_parameters() if "wte" not in n and "wpe" not in n)
        * 48
    )
    assert trainer.state.total_flos == pytest.approx(expected_flops)


@pytest.mark.parametrize(
    "model_fn, data_cls",
    [(bert_cls, ClassifyData), (bert_mlm, VarLenLM), (bart, VarLenLM)],
    ids=["bert-classification", "bert-mlm", "bart"],
)
def test_kwargs_models_that_ignore_num_items_accumulate_like_the_full_batch(make_args, model_fn, data_cls):
    data = data_cls()
    full_trainer, full = run(model_fn, make_args, data, bs=8, ga=1)
    acc_trainer, acc = run(model_fn, make_args, data, bs=2, ga=4)
    assert acc_trainer.model_accepts_loss_kwargs is False  # measured: the head's own CrossEntropyLoss
    assert_same(full, acc)
    full_loss = full_trainer.state.log_history[0]["loss"]
    assert acc_trainer.state.log_history[0]["loss"] == pytest.approx(full_loss, rel=1e-5)


def test_kwargs_model_that_divides_by_num_items_is_passed_it(make_args):
    seen = []

    class Spy(transformers.GPT2LMHeadModel):
        def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
            if torch.is_grad_enabled():
                seen.append(kwargs.get("num_items_in_batch"))
            return super().forward(
                input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kwargs
            )

    def spy():
        torch.manual_seed(0)
        return Spy(hf.gpt2_config(**GPT2))

    trainer, _ = run(spy, make_args, VarLenLM(), bs=2, ga=4)
    assert trainer.model_accepts_loss_kwargs is True
    assert len(seen) == 4 and all(n is not None for n in seen)


def test_measurement_leaves_model_mode_and_rng_untouched():
    from trainwright.modeling.loss import loss_honours_num_items

    model = bert_mlm()
    model.train()
    data = VarLenLM()
    inputs = default_data_collator([data[i] for i in range(2)])
    before = torch.get_rng_state()
    assert loss_honours_num_items(model, inputs, torch.tensor(10)) is False
    assert model.training
    assert torch.equal(before, torch.get_rng_state())
    assert loss_honours_num_items(gpt2(), inputs, torch.tensor(10)) is True


def test_user_setting_model_accepts_loss_kwargs_wins(make_args):
    model = bert_cls()
    args = make_args(per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=1)
    trainer = Trainer(
        model=model, args=args, train_dataset=ClassifyData(), data_collator=batch_encoding_collator
    )
    trainer.model_accepts_loss_kwargs = True  # the user says the model normalises (here wrongly)
    trainer.train()
    assert trainer.model_accepts_loss_kwargs is True


def test_packed_batches_count_their_sequences(make_args):
    """DataCollatorWithFlattening packs a batch into one row: samples are the sequences in it."""
    from transformers import DataCollatorWithFlattening

    class Features(Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            ids = list(range(3, 6 + i))
            return {"input_ids": ids, "labels": ids}

    model = gpt2()
    args = make_args(per_device_train_batch_size=4, num_train_epochs=1, train_sampling_strategy="sequential")
    trainer = Trainer(
        model=model, args=args, train_dataset=Features(), data_collator=DataCollatorWithFlattening()
    )
    out = trainer.train()
    assert trainer.cursor.samples_seen == 10
    assert out.metrics["train_samples_per_second"] > 0
    from trainwright.modeling.loss import batch_size

    batch = DataCollatorWithFlattening()([Features()[i] for i in range(3)])
    assert batch_size(batch) == 3
