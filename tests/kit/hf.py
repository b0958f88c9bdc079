"""Real transformers components built offline: a fast tokenizer trained on local text, tiny models
from configs, and variable-length text datasets tokenized by that tokenizer.

Nothing is downloaded. The tokenizer is a WordPiece model trained with the `tokenizers` library on
docstrings of Python's standard library, wrapped as `PreTrainedTokenizerFast`, saved with
`save_pretrained` and loaded back with `AutoTokenizer.from_pretrained` (what users do).

Plain functions (usable from job scripts in their own process) plus session-scoped fixtures.

The `tokenizers` trainer breaks ties between equally frequent merges in hash order, so two
trainings (two test sessions) can give slightly different vocabularies: within a session every
test and every job process uses the one saved folder (`tokenizer_dir`); no test depends on ids.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
tokenizers = pytest.importorskip("tokenizers")
datasets.disable_progress_bars()

SPECIAL = {
    "pad_token": "<pad>",
    "unk_token": "<unk>",
    "mask_token": "<mask>",
    "bos_token": "<s>",
    "eos_token": "</s>",
    "cls_token": "<cls>",
    "sep_token": "<sep>",
}
VOCAB_SIZE = 300
MAX_LEN = 40  # tokens per text after truncation (model positions: 64)
HIDDEN = 32


# --------------------------------------------------------------------------- local text
def local_sentences() -> list[str]:
    """English sentences from the docstrings of a fixed set of standard-library modules."""
    import argparse
    import collections
    import functools
    import itertools
    import json
    import logging
    import pathlib
    import shutil
    import subprocess
    import textwrap

    text = []
    for mod in (
        json,
        collections,
        argparse,
        functools,
        itertools,
        logging,
        pathlib,
        shutil,
        subprocess,
        textwrap,
    ):
        text.append(mod.__doc__ or "")
        # public names only (`__all__`): dir() would also list submodules other code imported
        for name in sorted(getattr(mod, "__all__", None) or [n for n in dir(mod) if not n.startswith("_")]):
            doc = getattr(getattr(mod, name, None), "__doc__", None)
            if isinstance(doc, str):
                text.append(doc)
    words = re.sub(r"\s+", " ", " ".join(text))
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", words)]
    return [s for s in sentences if 3 <= len(s.split()) <= 60]


def text_corpus(n: int, seed: int = 0, min_words: int = 1, max_words: int = 14) -> list[str]:
    """`n` texts of clearly varying lengths, cut from the local sentences (deterministic)."""
    sentences = local_sentences()
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        words = sentences[int(rng.integers(len(sentences)))].split()
        k = int(rng.integers(min_words, max_words + 1))
        start = int(rng.integers(0, max(1, len(words) - k + 1)))
        piece = words[start : start + k]
        while len(piece) < k:  # short sentence: continue with another one
            piece += sentences[int(rng.integers(len(sentences)))].split()[: k - len(piece)]
        out.append(" ".join(piece))
    return out


# --------------------------------------------------------------------------- tokenizer
def train_tokenizer(save_dir: str):
    """Train a WordPiece fast tokenizer on local text, save it with save_pretrained, load it back
    with AutoTokenizer.from_pretrained (the load path users take)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    specials = list(SPECIAL.values())
    tok = Tokenizer(models.WordPiece(unk_token=SPECIAL["unk_token"]))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=VOCAB_SIZE, special_tokens=specials, min_frequency=1)
    tok.train_from_iterator(local_sentences(), trainer=trainer)
    cls, sep = SPECIAL["cls_token"], SPECIAL["sep_token"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))],
    )
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=64, **SPECIAL)
    fast.save_pretrained(save_dir)
    return transformers.AutoTokenizer.from_pretrained(save_dir)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("tokenizer"))
    train_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    return transformers.AutoTokenizer.from_pretrained(tokenizer_dir)


# --------------------------------------------------------------------------- tiny models
# One builder a family, for every test and job: a caller passes what differs from the defaults (sizes,
# token ids, dropout) and so gets bit for bit the model it compares. A builder seeds torch with `seed`
# right before construction; `seed=None` leaves the generator alone (callers that never seeded).
def _seed(seed: int | None) -> None:
    if seed is not None:
        torch.manual_seed(seed)


def token_ids(tok) -> dict:
    """The config fields a tokenizer sets: its vocabulary size and pad, bos and eos ids."""
    return {
        "vocab_size": len(tok),
        "pad_token_id": tok.pad_token_id,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
    }


def gpt2_config(vocab_size: int = 64, n_layer: int = 2, n_positions: int = 64, dropout: float = 0.0, **kw):
    """GPT-2 of width 32 and two heads; `dropout` sets its three dropout rates, `kw` any field."""
    fields = dict(n_layer=n_layer, n_embd=HIDDEN, n_head=2, vocab_size=vocab_size, n_positions=n_positions)
    drops = dict(resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    return transformers.GPT2Config(**{**fields, **drops, **kw})


def gpt2(seed: int | None = 0, **kw):
    """A GPT2LMHeadModel of `gpt2_config(**kw)`."""
    _seed(seed)
    return transformers.GPT2LMHeadModel(gpt2_config(**kw))


def tiny_gpt2_lm(tok, seed: int = 0, dropout: float = 0.0, use_cache: bool = False):
    # use_cache=False: GPT-2 builds a cache in training too, and with one it does not detect
    # sequences packed by DataCollatorWithFlattening (they would attend to each other)
    return gpt2(seed, dropout=dropout, use_cache=use_cache, **token_ids(tok))


def bert_config(
    vocab_size: int = 64, num_hidden_layers: int = 2, intermediate_size: int = 64, dropout=0.0, **kw
):
    """BERT of width 32 and two heads; `dropout` sets its hidden and attention dropout, `kw` any field."""
    fields = dict(hidden_size=HIDDEN, num_attention_heads=2, vocab_size=vocab_size)
    fields.update(num_hidden_layers=num_hidden_layers, intermediate_size=intermediate_size)
    drops = dict(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    return transformers.BertConfig(**{**fields, **drops, **kw})


BERT_HEADS = {
    "cls": "BertForSequenceClassification",
    "mlm": "BertForMaskedLM",
    "tok": "BertForTokenClassification",
}


def bert(head: str, seed: int | None = 0, **kw):
    """BERT with the head `head` ("cls", "mlm" or "tok") of `bert_config(**kw)`."""
    _seed(seed)
    return getattr(transformers, BERT_HEADS[head])(bert_config(**kw))


def tiny_bert_classifier(tok, num_labels: int = 3, seed: int = 0):
    return bert("cls", seed, num_labels=num_labels, max_position_embeddings=64, **token_ids(tok))


def tiny_bert_mlm(tok, seed: int = 0):
    return bert("mlm", seed, max_position_embeddings=64, **token_ids(tok))


def tiny_bert_tagger(tok, num_labels: int = 5, seed: int = 0):
    return bert("tok", seed, num_labels=num_labels, max_position_embeddings=64, **token_ids(tok))


def bart(
    seed: int | None = 0, vocab_size: int = 64, ffn_dim: int = 64, max_position_embeddings: int = 64, **kw
):
    """A one-layer BartForConditionalGeneration of width 32, two heads and no dropout; `kw` any field."""
    _seed(seed)
    layers = dict(encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2)
    sizes = dict(d_model=HIDDEN, encoder_ffn_dim=ffn_dim, decoder_ffn_dim=ffn_dim, vocab_size=vocab_size)
    drops = dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    sizes["max_position_embeddings"] = max_position_embeddings
    return transformers.BartForConditionalGeneration(
        transformers.BartConfig(**{**layers, **sizes, **drops, **kw})
    )


def tiny_bart(tok, seed: int = 0):
    eos = tok.eos_token_id
    return bart(seed, decoder_start_token_id=eos, forced_eos_token_id=eos, **token_ids(tok))


def t5(seed: int | None = 0, vocab_size: int = 32, d_model: int = 16, d_kv: int = 8, d_ff: int = 32, **kw):
    """A one-layer T5ForConditionalGeneration with two heads; `kw` any field."""
    _seed(seed)
    sizes = dict(vocab_size=vocab_size, d_model=d_model, d_kv=d_kv, d_ff=d_ff, num_layers=1, num_heads=2)
    return transformers.T5ForConditionalGeneration(transformers.T5Config(**{**sizes, **kw}))


def tiny_t5(tok, seed: int = 0):
    pad, eos = tok.pad_token_id, tok.eos_token_id
    sizes = dict(d_model=HIDDEN, d_kv=16, d_ff=64, num_decoder_layers=1, dropout_rate=0.0)
    ids = dict(vocab_size=len(tok), pad_token_id=pad, eos_token_id=eos, decoder_start_token_id=pad)
    return t5(seed, **sizes, **ids)


MODEL_BUILDERS = {
    "gpt2": tiny_gpt2_lm,
    "bert-cls": tiny_bert_classifier,
    "bert-mlm": tiny_bert_mlm,
    "bert-tok": tiny_bert_tagger,
    "bart": tiny_bart,
    "t5": tiny_t5,
}


def build_model(name: str, tok, seed: int = 0):
    return MODEL_BUILDERS[name](tok, seed=seed)


# --------------------------------------------------------------------------- datasets
def clm_dataset(tok, n: int, seed: int = 0, pad_to: int | None = None):
    """Causal-LM rows {input_ids, attention_mask}; with `pad_to` also pre-padded `labels` (-100 on padding)."""
    data = datasets.Dataset.from_dict({"text": text_corpus(n, seed)})

    def tokenize(batch):
        if pad_to is None:
            return tok(batch["text"], truncation=True, max_length=MAX_LEN)
        enc = tok(batch["text"], truncation=True, max_length=pad_to, padding="max_length")
        enc["labels"] = [
            [t if m else -100 for t, m in zip(ids, mask)]
            for ids, mask in zip(enc["input_ids"], enc["attention_mask"])
        ]
        return enc

    return data.map(tokenize, batched=True, remove_columns=["text"])


def mlm_dataset(tok, n: int, seed: int = 0, deterministic_masks: bool = False):
    """MLM rows {input_ids, attention_mask, special_tokens_mask}.

    With `deterministic_masks`, about half of each row's ordinary tokens are also marked in
    `special_tokens_mask` (fixed per row): with `mlm_probability=1.0`, `mask_replace_prob=1.0`
    and `random_replace_prob=0.0` the collator then masks exactly the other tokens, whatever
    batches it is called on, so different batchings see the same masks.
    """
    data = datasets.Dataset.from_dict({"text": text_corpus(n, seed)})

    def tokenize(batch, indices):
        enc = tok(batch["text"], truncation=True, max_length=MAX_LEN, return_special_tokens_mask=True)
        if deterministic_masks:
            masks = []
            for i, special in zip(indices, enc["special_tokens_mask"]):
                keep = np.random.default_rng(1000 + i).random(len(special)) < 0.5
                masks.append([int(s or k) for s, k in zip(special, keep)])
            enc["special_tokens_mask"] = masks
        return enc

    return data.map(tokenize, batched=True, with_indices=True, remove_columns=["text"])


def cls_dataset(tok, n: int, seed: int = 0, num_labels: int = 3):
    """Sequence classification rows {input_ids, token_type_ids, attention_mask, label}."""
    texts = text_corpus(n, seed)
    labels = [len(t.split()) % num_labels for t in texts]
    data = datasets.Dataset.from_dict({"sentence": texts, "label": labels})
    return data.map(
        lambda b: tok(b["sentence"], truncation=True, max_length=MAX_LEN),
        batched=True,
        remove_columns=["sentence"],
    )


def ner_dataset(tok, n: int, seed: int = 0, num_labels: int = 5):
    """Token classification from word-level tags: the first sub-token of a word carries the word's
    tag, other sub-tokens and special tokens -100 (run_ner.py's `label_all_tokens=False`)."""
    texts = text_corpus(n, seed)
    words = [t.split() for t in texts]
    tags = [[len(w) % num_labels for w in ws] for ws in words]
    data = datasets.Dataset.from_dict({"tokens": words, "ner_tags": tags})

    def tokenize(batch):
        enc = tok(batch["tokens"], truncation=True, max_length=MAX_LEN, is_split_into_words=True)
        labels = []
        for i, row_tags in enumerate(batch["ner_tags"]):
            previous, row = None, []
            for w in enc.word_ids(batch_index=i):
                row.append(-100 if w is None or w == previous else row_tags[w])
                previous = w
            labels.append(row)
        enc["labels"] = labels
        return enc

    return data.map(tokenize, batched=True, remove_columns=["tokens", "ner_tags"])


def seq2seq_dataset(tok, n: int, seed: int = 0):
    """Summarization-like rows: the target is the first few words of the source (varying lengths)."""
    texts = text_corpus(n, seed, min_words=3, max_words=14)
    rng = np.random.default_rng(seed + 1)
    targets = [" ".join(t.split()[: int(rng.integers(1, 9))]) for t in texts]
    data = datasets.Dataset.from_dict({"document": texts, "summary": targets})

    def tokenize(batch):
        enc = tok(batch["document"], truncation=True, max_length=MAX_LEN)
        enc["labels"] = tok(text_target=batch["summary"], truncation=True, max_length=16)["input_ids"]
        enc.pop("token_type_ids", None)
        return enc

    return data.map(tokenize, batched=True, remove_columns=["document", "summary"])
