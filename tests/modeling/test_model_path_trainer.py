"""The two model-path arguments through the Trainer: `fused_linear_cross_entropy` (same training as the
model's own loss, no logits) and `padding_free` (packed rows: same losses as padded batches, real
tokens counted, attention kept inside each sample); transformers tokenizers, collators and models
built offline."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from kit import hf
from kit.hf import text_corpus
from test_model_path import CONFIGS, VOCAB, causal_lm

from trainwright import Trainer, TrainingArguments
from trainwright.data.packing import PaddingFreeCollator, padding_free_collator, run_collator
from trainwright.modeling import model_path

transformers = pytest.importorskip("transformers")
tokenizer, tokenizer_dir = hf.tokenizer, hf.tokenizer_dir  # session fixtures


def lm_data(tok, n: int = 24, seed: int = 5) -> list[dict]:
    texts = text_corpus(n, seed=seed, min_words=1, max_words=30)
    return [{"input_ids": ids} for ids in tok(texts, truncation=True)["input_ids"]]


def gpt2(tok, dropout: float = 0.0):
    """model_path_job.py's GPT-2: the session tokenizer's, its cache on."""
    return hf.tiny_gpt2_lm(tok, dropout=dropout, use_cache=True)


class HeadOutputs:
    """Records the shape of every output of a model's LM head in training mode (`shapes`) and in
    eval mode (`eval_shapes`)."""

    def __init__(self, model):
        self.shapes: list[tuple] = []
        self.eval_shapes: list[tuple] = []
        model.get_output_embeddings().register_forward_hook(self)

    def __call__(self, module, inputs, output):
        (self.shapes if module.training else self.eval_shapes).append(tuple(output.shape))


def train(tok, tmp_path, name: str, model=None, collator=None, data=None, **kw):
    model = model if model is not None else gpt2(tok, dropout=kw.pop("dropout", 0.0))
    args = TrainingArguments(
        output_dir=str(tmp_path / name),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=3,
        # SGD: Adam would turn the rounding noise of gradients that are truly 0 (attention key biases)
        # into full-size steps
        optim="sgd",
        optim_args="momentum=0.9",
        learning_rate=0.1,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        seed=3,
        **kw,
    )
    collator = collator or transformers.DataCollatorForLanguageModeling(tok, mlm=False)
    trainer = Trainer(model=model, args=args, train_dataset=data or lm_data(tok), data_collator=collator)
    trainer.train()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    return trainer, losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_weights(a: dict, b: dict, atol: float = 1e-6) -> None:
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=atol, msg=k)


# ------------------------------------------------------------------------------------ fused loss
def test_fused_training_equals_the_models_own_and_never_computes_logits(tokenizer, tmp_path):
    own, own_losses, own_weights = train(tokenizer, tmp_path, "own", dropout=0.1, label_smoothing_factor=0.1)
    model = gpt2(tokenizer, dropout=0.1)
    head = HeadOutputs(model)
    fused, losses, weights = train(
        tokenizer, tmp_path, "fused", model=model, label_smoothing_factor=0.1, fused_linear_cross_entropy=True
    )
    assert len(head.shapes) == 3 * 2 and all(shape[1] == 0 for shape in head.shapes)
    assert losses == pytest.approx(own_losses, rel=1e-6)
    assert_same_weights(own_weights, weights)
    head.eval_shapes.clear()
    data = lm_data(tokenizer, 8, seed=9)
    eval_loss = fused.evaluate(data)["eval_loss"]  # no compute_metrics: the loss only
    assert head.eval_shapes and all(shape[1] == 0 for shape in head.eval_shapes)
    assert eval_loss == pytest.approx(own.evaluate(data)["eval_loss"], rel=1e-6)
    head.eval_shapes.clear()
    predictions = fused.predict(data[:4]).predictions  # logits asked for: the model computes them
    assert predictions.shape[-1] == len(tokenizer) and all(shape[1] > 0 for shape in head.eval_shapes)


def test_compute_loss_func_keeps_the_models_logits_with_a_log_line(tokenizer, tmp_path, caplog):
    def loss_func(outputs, labels, num_items_in_batch=None):
        logits = outputs["logits"][:, :-1].float()
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), reduction="sum"
        )
        return loss / num_items_in_batch

    model = gpt2(tokenizer)
    head = HeadOutputs(model)
    args = TrainingArguments(
        output_dir=str(tmp_path / "f"),
        max_steps=1,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        fused_linear_cross_entropy=True,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=lm_data(tokenizer),
        data_collator=transformers.DataCollatorForLanguageModeling(tokenizer, mlm=False),
        compute_loss_func=loss_func,
    )
    with caplog.at_level(logging.WARNING, logger="trainwright.modeling.model_path"):
        trainer.train()
    assert all(shape[1] > 0 for shape in head.shapes)
    assert any("compute_loss_func" in r.getMessage() for r in caplog.records)


def test_fused_loss_arguments_are_validated_by_name(tmp_path):
    with pytest.raises(ValueError, match="fused_linear_cross_entropy"):
        TrainingArguments(output_dir=str(tmp_path), fused_linear_cross_entropy=True, use_liger_kernel=True)
    with pytest.raises(ValueError, match="fused_linear_cross_entropy"):
        TrainingArguments(output_dir=str(tmp_path), fused_linear_cross_entropy="yes")
    with pytest.raises(ValueError, match="padding_free"):
        TrainingArguments(output_dir=str(tmp_path), padding_free=1)


# ------------------------------------------------------------------------------------ packing
def test_padding_free_rows_are_the_ones_data_collator_with_flattening_makes(tokenizer):
    features = lm_data(tokenizer, 5)
    ours = PaddingFreeCollator()(features)
    upstream = transformers.DataCollatorWithFlattening()(features)
    assert ours.keys() == upstream.keys() == {"input_ids", "labels", "position_ids"}
    for key in ours:
        assert torch.equal(ours[key], upstream[key]), key
    with_flash = PaddingFreeCollator(flash_attn_kwargs=True)(features)
    upstream = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)(features)
    assert torch.equal(with_flash["cu_seq_lens_q"], upstream["cu_seq_lens_q"])
    assert with_flash["max_length_k"] == upstream["max_length_k"]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_packed_per_sample_losses_equal_the_samples_alone(name, attention):
    """No cross-sample attention: every sample's per-token losses in a packed row are its own."""
    model = causal_lm(name)
    model.config._attn_implementation = attention
    model.config.use_cache = True  # the model path turns the cache off for packed rows
    model.eval()
    g = torch.Generator().manual_seed(2)
    features = [{"input_ids": torch.randint(0, VOCAB, (n,), generator=g).tolist()} for n in (5, 17, 9, 30)]
    row = PaddingFreeCollator()(features)
    trainer_like = type("T", (), {"args": TrainingArguments(output_dir="unused", padding_free=True)})
    with torch.no_grad():
        outputs, _ = model_path.forward(trainer_like, model, row, None, None, True)
        token_losses = torch.nn.functional.cross_entropy(
            outputs.logits[0, :-1], row["labels"][0, 1:], reduction="none", ignore_index=-100
        )
        start = 0
        for f in features:
            ids = torch.tensor([f["input_ids"]])
            alone = model(input_ids=ids, use_cache=False).logits[0, :-1]
            own = torch.nn.functional.cross_entropy(alone, ids[0, 1:], reduction="none")
            n = len(f["input_ids"])
            torch.testing.assert_close(token_losses[start : start + n - 1], own, rtol=1e-5, atol=1e-5)
            start += n


class OwnMask(transformers.GPT2LMHeadModel):
    """A GPT-2 that always passes its own all-ones attention mask: packed samples attend across."""

    def forward(self, input_ids=None, position_ids=None, **kwargs):
        kwargs.pop("attention_mask", None)
        return super().forward(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)


def test_a_model_that_attends_across_packed_samples_is_refused(tokenizer, tmp_path):
    config = gpt2(tokenizer).config
    config.n_positions = 512  # it numbers a packed row's positions straight through
    torch.manual_seed(0)
    model = OwnMask(config)
    with pytest.raises(ValueError, match="padding_free=True: OwnMask attends across the samples"):
        train(tokenizer, tmp_path, "across", model=model, padding_free=True)


@pytest.mark.parametrize("mode", ["all", "non_padding"])
def test_padding_free_training_equals_padded_and_counts_real_tokens(tokenizer, tmp_path, mode):
    padded, padded_losses, padded_weights = train(
        tokenizer,
        tmp_path,
        "padded",
        include_num_input_tokens_seen=mode,
        train_sampling_strategy="sequential",
    )
    packed, losses, weights = train(
        tokenizer,
        tmp_path,
        "packed",
        include_num_input_tokens_seen=mode,
        train_sampling_strategy="sequential",
        padding_free=True,
    )
    assert losses == pytest.approx(padded_losses, rel=1e-5)  # accumulation stays token-exact
    assert_same_weights(padded_weights, weights, atol=1e-5)
    real = sum(len(f["input_ids"]) for f in lm_data(tokenizer)[: 3 * 2 * 4])
    assert packed.state.num_input_tokens_seen == packed.cursor.tokens_seen == real
    if mode == "non_padding":
        assert padded.state.num_input_tokens_seen == real
    else:  # upstream's "all" counts the padded tensor
        assert padded.state.num_input_tokens_seen > real
    assert packed.cursor.samples_seen == padded.cursor.samples_seen == 24
    data = lm_data(tokenizer, 8, seed=9)
    assert packed.evaluate(data)["eval_loss"] == pytest.approx(padded.evaluate(data)["eval_loss"], rel=1e-5)


class Refuses:
    def __call__(self, features):
        return features


def test_padding_free_collator_rules(tokenizer):
    flattening = transformers.DataCollatorWithFlattening()
    assert padding_free_collator(flattening) is flattening
    lm = padding_free_collator(transformers.DataCollatorForLanguageModeling(tokenizer, mlm=False))
    ids = [tokenizer.bos_token_id, tokenizer.pad_token_id, 7]
    assert lm([{"input_ids": ids}])["labels"].tolist() == [[-100, -100, 7]]  # its pad tokens are not targets
    padded = tokenizer(["a longer text here", "short"], padding=True)
    features = [{k: padded[k][i] for k in padded} for i in range(2)]
    row = padding_free_collator(transformers.DataCollatorWithPadding(tokenizer))(features)
    assert row["input_ids"].shape[1] == sum(padded["attention_mask"][0]) + sum(padded["attention_mask"][1])
    for collator in (transformers.DataCollatorForLanguageModeling(tokenizer, mlm=True), Refuses()):
        with pytest.raises(ValueError, match="padding_free=True"):
            padding_free_collator(collator)
    args = TrainingArguments(output_dir="unused", padding_free=True)
    with pytest.raises(ValueError, match="encoder-decoder"):
        run_collator(args, flattening, hf.tiny_bart(tokenizer))
    from trainwright.app.tinygpt import TinyGPT, TinyGPTConfig

    with pytest.raises(ValueError, match="takes no position_ids"):
        run_collator(args, flattening, TinyGPT(TinyGPTConfig(block_size=16, n_layer=1, n_embd=8, n_head=1)))


@pytest.mark.parametrize(
    "ids",
    [[3.0, 4.7, 5.0], torch.tensor([3.0, 4.0]), np.array([3.5, 4.0]), [3, True]],
    ids=["list", "tensor", "array", "bool"],
)
def test_padding_free_refuses_ids_that_are_not_integers_naming_sample_and_key(ids):
    features = [{"input_ids": [1, 2, 3]}, {"input_ids": ids}]
    with pytest.raises(ValueError, match="sample 1's 'input_ids' holds .* not an integer id"):
        PaddingFreeCollator()(features)
    with pytest.raises(ValueError, match="sample 0's 'labels'"):
        PaddingFreeCollator()([{"input_ids": [1, 2], "labels": [1.5, 2.0]}])
    assert PaddingFreeCollator()([{"input_ids": np.array([1, 2])}])["input_ids"].tolist() == [[1, 2]]


def test_evaluation_cuts_repeated_samples_from_a_packed_row(tokenizer):
    from trainwright.loop.eval.batches import take_rows

    features = lm_data(tokenizer, 3)
    row = PaddingFreeCollator(flash_attn_kwargs=True)(features)
    kept = take_rows(row, 2)  # the third sample was repeated by the sampler for another process
    two = PaddingFreeCollator(flash_attn_kwargs=True)(features[:2])
    for key in ("input_ids", "labels", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k"):
        assert torch.equal(kept[key], two[key]), key
