"""Collation in trainwright.data: default_data_collator, padding collators, dropping the columns the
model's forward does not take, and the label counting and causal-LM detection beside the loss."""

from __future__ import annotations

import logging
import pickle
import types

import numpy as np
import pytest
import torch

from trainwright.data import (
    PaddingCollator,
    RemoveColumnsCollator,
    default_data_collator,
    forward_arg_names,
    pad_sequence_collator,
    remove_unused_columns,
)
from trainwright.modeling.loss import count_items, is_causal_lm


# ---------------------------------------------------------------------------------- collators
def test_default_data_collator_labels_and_dtypes():
    batch = default_data_collator(
        [
            {"input_ids": [1, 2], "label": 1, "text": "a", "extra": None},
            {"input_ids": [3, 4], "label": 0, "text": "b", "extra": None},
        ]
    )
    assert set(batch) == {"input_ids", "labels"}  # strings and None are dropped
    assert batch["labels"].dtype == torch.long and batch["labels"].tolist() == [1, 0]
    assert batch["input_ids"].tolist() == [[1, 2], [3, 4]]

    floats = default_data_collator([{"label": 0.5}, {"label": 1.5}])
    assert floats["labels"].dtype == torch.float32
    ids = default_data_collator([{"label_ids": [1, 2]}, {"label_ids": [3, 4]}])
    assert ids["labels"].dtype == torch.long and ids["labels"].shape == (2, 2)
    tensors = default_data_collator(
        [{"x": torch.ones(3), "label": torch.tensor(2)}, {"x": torch.zeros(3), "label": torch.tensor(1)}]
    )
    assert tensors["x"].shape == (2, 3) and tensors["labels"].dtype == torch.long
    arrays = default_data_collator([{"x": np.ones(2, dtype=np.float32)}] * 3)
    assert arrays["x"].shape == (3, 2) and arrays["x"].dtype == torch.float32

    class Feature:
        def __init__(self, input_ids, label):
            self.input_ids, self.label = input_ids, label

    objects = default_data_collator([Feature([1], 0), Feature([2], 1)])
    assert objects["labels"].tolist() == [0, 1] and objects["input_ids"].tolist() == [[1], [2]]
    as_np = default_data_collator([{"x": 1, "label": 0}], return_tensors="np")
    assert isinstance(as_np["x"], np.ndarray) and as_np["labels"].dtype == np.int64

    with pytest.raises(ValueError, match="'input_ids' cannot be stacked"):
        default_data_collator([{"input_ids": [1, 2]}, {"input_ids": [1]}])
    with pytest.raises(ValueError, match="return_tensors"):
        default_data_collator([{"x": 1}], return_tensors="tf")
    with pytest.raises(ValueError, match="empty"):
        default_data_collator([])


def _tiny_tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "hello": 2, "world": 3, "foo": 4}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


def test_padding_collator_with_a_real_tokenizer():
    tokenizer = _tiny_tokenizer()
    features = [{**tokenizer("hello world foo"), "label": 1}, {**tokenizer("hello"), "label": 0}]
    batch = PaddingCollator(tokenizer)(features)
    assert batch["input_ids"].tolist() == [[2, 3, 4], [2, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [1, 0] and "label" not in batch
    multiple = PaddingCollator(tokenizer, pad_to_multiple_of=4)(features)
    assert multiple["input_ids"].shape == (2, 4)

    processor = types.SimpleNamespace(tokenizer=tokenizer)  # a processor wrapping its tokenizer
    assert PaddingCollator(processor).tokenizer is tokenizer
    with pytest.raises(TypeError, match="pad\\(\\) method"):
        PaddingCollator(object())


def test_pad_sequence_collator_right_pads():
    collate = pad_sequence_collator(pad_token_id=9)
    batch = collate(
        [
            {"input_ids": [1, 2, 3], "labels": [1, 2, 3], "score": 0.5},
            {"input_ids": [4], "labels": [4], "score": 1.0},
        ]
    )
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 9, 9]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[1, 2, 3], [4, -100, -100]]
    assert batch["score"].tolist() == [0.5, 1.0]
    given_mask = collate(
        [
            {"input_ids": torch.tensor([1, 2]), "attention_mask": [1, 0]},
            {"input_ids": torch.tensor([3]), "attention_mask": [1]},
        ]
    )
    assert given_mask["attention_mask"].tolist() == [[1, 0], [1, 0]]
    classification = collate([{"input_ids": [1, 2], "labels": 1}, {"input_ids": [3], "labels": 0}])
    assert classification["labels"].tolist() == [1, 0] and classification["input_ids"].tolist() == [
        [1, 2],
        [3, 9],
    ]
    assert pickle.loads(pickle.dumps(collate))([{"input_ids": [1]}])["input_ids"].tolist() == [[1]]


# ---------------------------------------------------------------------------------- columns
class TinyModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        return self.linear(input_ids.float())


def test_forward_arg_names():
    model = TinyModel()
    names = forward_arg_names(model, label_names=["start_positions"])
    assert names == {"input_ids", "attention_mask", "labels", "label", "label_ids", "start_positions"}
    assert forward_arg_names(torch.compile(model)) == forward_arg_names(model)  # looks through the wrapper


def test_remove_columns_collator_drops_and_logs_once(caplog):
    keep = forward_arg_names(TinyModel())
    collate = RemoveColumnsCollator(default_data_collator, keep, description="training")
    features = [{"input_ids": [1, 2], "idx": 0, "label": 1}, {"input_ids": [3, 4], "idx": 1, "label": 0}]
    with caplog.at_level(logging.INFO, logger="trainwright.data.columns"):
        batch = collate(features)
        collate(features)
    assert set(batch) == {"input_ids", "labels"}
    messages = [r.getMessage() for r in caplog.records if "Ignoring columns" in r.getMessage()]
    assert messages == ["Ignoring columns of the training set that the model's forward does not take: idx."]


def test_remove_unused_columns_on_a_real_dataset():
    import datasets

    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, 4]], "label": [0, 1], "text": ["a", "b"]})
    keep = forward_arg_names(TinyModel())
    assert remove_unused_columns(ds, keep).column_names == ["input_ids", "label"]
    assert remove_unused_columns(ds, keep | {"text"}) is ds
    plain = [{"a": 1}]
    assert remove_unused_columns(plain, keep) is plain
    with pytest.raises(ValueError, match=r"\['input_ids', 'label', 'text'\].*\['foo'\]"):
        remove_unused_columns(ds, {"foo"})


# ---------------------------------------------------------------------------------- label targets
def test_count_items_shift_vs_no_shift():
    inputs = {"labels": torch.tensor([[5, 6, -100], [7, -100, -100]])}
    unshifted = count_items(inputs, shift=False)
    assert isinstance(unshifted, torch.Tensor) and unshifted.dim() == 0 and int(unshifted) == 3
    assert int(count_items(inputs, shift=True)) == 1  # only 6 is predicted from a previous position
    assert int(count_items({"labels": torch.tensor([[1, 2, 3, 4]])}, shift=True)) == 3
    with pytest.raises(ValueError, match="'labels'"):
        count_items({"input_ids": torch.zeros(2)}, shift=False)


def test_label_counting_moved_next_to_the_loss_stays_importable_from_data():
    import trainwright.data

    assert trainwright.data.count_items is count_items and trainwright.data.is_causal_lm is is_causal_lm


def test_is_causal_lm():
    from transformers import (
        BertConfig,
        BertLMHeadModel,
        GPT2Config,
        GPT2ForSequenceClassification,
        GPT2LMHeadModel,
    )

    gpt = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, bos_token_id=0, eos_token_id=0)
    assert is_causal_lm(GPT2LMHeadModel(gpt))
    assert not is_causal_lm(GPT2ForSequenceClassification(gpt))
    model = TinyModel()
    assert not is_causal_lm(model)
    model.label_shift = True  # trainwright's contract for custom models
    assert is_causal_lm(model)

    decoder = types.SimpleNamespace(config=types.SimpleNamespace(is_decoder=True, is_encoder_decoder=False))
    assert is_causal_lm(decoder)
    encdec = types.SimpleNamespace(config=types.SimpleNamespace(is_decoder=True, is_encoder_decoder=True))
    assert not is_causal_lm(encdec)
    bert = BertConfig(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        vocab_size=64,
        is_decoder=True,
    )
    assert is_causal_lm(BertLMHeadModel(bert))
