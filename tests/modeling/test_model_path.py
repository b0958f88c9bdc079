"""The fused loss (`fused_linear_cross_entropy`) against each model's own loss and gradients, and when
it applies; transformers models built offline from configs."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from kit import ecosystem as eco
from kit import hf

from trainwright.modeling import fused_loss
from trainwright.modeling.linear_ce import linear_cross_entropy

transformers = pytest.importorskip("transformers")

VOCAB = 97


def _decoder_kw() -> dict:
    return {**eco.DECODER, "vocab_size": VOCAB, "use_cache": False}


CONFIGS = {
    "gpt2": lambda: hf.gpt2_config(vocab_size=VOCAB, dropout=0.1, bos_token_id=0, eos_token_id=0),
    "llama-untied": lambda: transformers.LlamaConfig(**_decoder_kw(), tie_word_embeddings=False),
    "llama-tied": lambda: transformers.LlamaConfig(**_decoder_kw(), tie_word_embeddings=True),
    "qwen2": lambda: transformers.Qwen2Config(**_decoder_kw()),
    "mistral": lambda: transformers.MistralConfig(**_decoder_kw(), sliding_window=8),
}


def causal_lm(name: str, seed: int = 0):
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(CONFIGS[name]())


def grads_of(model, fused: bool, inputs: dict, seed: int = 1, **kw):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # the same dropout masks in both forwards
    if fused:
        loss, outputs = fused_loss.fused_causal_lm_loss(model, inputs, **kw)
        assert outputs.logits.shape[1] == 0  # no logits were computed
    else:
        loss = model(**inputs, **{k: v for k, v in kw.items() if k == "num_items_in_batch"}).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_gradients(own: dict, fused: dict, rel: float = 1e-5) -> None:
    """Every gradient within `rel` of the largest gradient entry (a tensor whose true gradient is 0,
    like attention key biases, holds only rounding noise, so a per-tensor relative test is meaningless)."""
    assert own.keys() == fused.keys()
    scale = max(float(g.abs().max()) for g in own.values())
    for name, g in own.items():
        assert float((fused[name] - g).abs().max()) <= rel * scale, name


# ------------------------------------------------------------------------------------ the op
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("num_items", [None, 50])
def test_chunked_linear_cross_entropy_equals_cross_entropy_of_the_logits(bias, smoothing, num_items):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 13, 16, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(VOCAB, 16, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(VOCAB, dtype=torch.float64, generator=g, requires_grad=True) if bias else None
    targets = torch.randint(0, VOCAB, (3, 13), generator=g)
    targets[:, ::4] = -100
    params = [hidden, weight] + ([b] if bias else [])
    loss = linear_cross_entropy(
        hidden, weight, b, targets, num_items_in_batch=num_items, label_smoothing=smoothing, chunk_size=5
    )
    fused_grads = torch.autograd.grad(loss * 3, params)
    logits = F.linear(hidden, weight, b)
    denominator = num_items if num_items is not None else (targets != -100).sum()
    ref = (
        F.cross_entropy(
            logits.reshape(-1, VOCAB), targets.flatten(), reduction="sum", label_smoothing=smoothing
        )
        / denominator
    )
    ref_grads = torch.autograd.grad(ref * 3, params)
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(fused_grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_without_gradients_no_gradient_is_computed_and_a_batch_without_targets_is_nan():
    hidden = torch.randn(4, 8)
    weight = torch.randn(VOCAB, 8, requires_grad=True)
    with torch.no_grad():
        loss = linear_cross_entropy(hidden, weight, None, torch.full((4,), -100))
    assert torch.isnan(loss) and loss.grad_fn is None  # the mean over no target, as cross_entropy's
    hidden.requires_grad_(True)
    loss = linear_cross_entropy(hidden, weight, None, torch.full((4,), -100), num_items_in_batch=3)
    loss.backward()
    assert float(loss.detach()) == 0.0 and not hidden.grad.any() and not weight.grad.any()


def test_under_bfloat16_autocast_the_products_run_in_bfloat16_and_the_loss_in_float32():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(32, 16, generator=g, requires_grad=True)
    weight = torch.randn(VOCAB, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, VOCAB, (32,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy(hidden, weight, None, targets, chunk_size=7)
        ref = F.cross_entropy(F.linear(hidden, weight).float(), targets)
    assert loss.dtype == torch.float32
    got = torch.autograd.grad(loss, [hidden, weight])
    want = torch.autograd.grad(ref, [hidden, weight])
    assert abs(float(loss.detach()) - float(ref.detach())) <= 1e-3 * float(ref.detach())
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype == torch.float32
        assert float((a - b).norm() / b.norm()) < 2e-2


# ------------------------------------------------------------------------------------ models
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fused_loss_and_gradients_equal_the_models_own(name):
    model = causal_lm(name).train()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (2, 17), generator=g)
    labels = ids.clone()
    labels[0, :5] = -100  # a prompt
    inputs = {"input_ids": ids, "labels": labels}
    assert fused_loss.fused_loss_applies(model)[0]
    for num_items in (None, torch.tensor(40)):
        own_loss, own = grads_of(model, False, inputs, num_items_in_batch=num_items)
        loss, fused = grads_of(model, True, inputs, num_items_in_batch=num_items)
        assert abs(float(loss) - float(own_loss)) <= 1e-5 * abs(float(own_loss))
        assert_same_gradients(own, fused)
    if name == "llama-tied":
        assert model.lm_head.weight is model.model.embed_tokens.weight


def test_shift_labels_are_the_targets_as_given():
    model = causal_lm("llama-untied")
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, VOCAB, (2, 9), generator=g)
    shifted = torch.randint(0, VOCAB, (2, 9), generator=g)
    shifted[:, -1] = -100
    own_loss, own = grads_of(model, False, {"input_ids": ids, "labels": ids, "shift_labels": shifted})
    loss, fused = grads_of(model, True, {"input_ids": ids, "labels": ids, "shift_labels": shifted})
    assert abs(float(loss) - float(own_loss)) <= 1e-6 * float(own_loss)
    assert_same_gradients(own, fused)


def test_bert_masked_lm_is_handled_unshifted_with_its_head_bias():
    model = hf.bert("mlm", vocab_size=VOCAB, dropout=0.1).train()
    assert model.get_output_embeddings().bias is not None
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, VOCAB, (2, 11), generator=g)
    labels = torch.full_like(ids, -100)
    labels[:, 2::3] = ids[:, 2::3]  # the masked positions are the targets, unshifted
    inputs = {"input_ids": ids, "labels": labels}
    own_loss, own = grads_of(model, False, inputs)
    loss, fused = grads_of(model, True, inputs)
    assert abs(float(loss) - float(own_loss)) <= 1e-5 * float(own_loss)
    assert_same_gradients(own, fused)


def test_models_whose_logits_are_changed_after_the_head_are_refused_by_name():
    gemma = transformers.Gemma2ForCausalLM(
        transformers.Gemma2Config(**{**_decoder_kw(), "head_dim": 8}, final_logit_softcapping=30.0)
    )
    applies, reason = fused_loss.fused_loss_applies(gemma)
    assert not applies and "final_logit_softcapping=30.0" in reason
    cohere = transformers.CohereForCausalLM(transformers.CohereConfig(**_decoder_kw(), logit_scale=0.5))
    applies, reason = fused_loss.fused_loss_applies(cohere)
    assert not applies and "logit_scale=0.5" in reason
    t5 = hf.t5(seed=None)
    applies, reason = fused_loss.fused_loss_applies(t5)
    assert not applies and "encoder-decoder" in reason


class ScaledLogits(transformers.LlamaForCausalLM):
    """A causal LM that rescales its logits after the head in a way no config field says."""

    def forward(self, *args, **kwargs):
        labels = kwargs.pop("labels", None)
        outputs = super().forward(*args, **kwargs)
        outputs.logits = outputs.logits * 3.0
        if labels is not None:
            outputs.loss = self.loss_function(outputs.logits, labels, self.config.vocab_size)
        return outputs


def test_a_model_the_measurement_disproves_keeps_its_own_loss_with_one_log_line(caplog):
    torch.manual_seed(0)
    model = ScaledLogits(transformers.LlamaConfig(**_decoder_kw()))
    assert fused_loss.fused_loss_applies(model)[0]  # nothing in its structure says otherwise
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    with caplog.at_level(logging.WARNING, logger="trainwright.modeling.fused_loss"):
        assert not fused_loss.decide(model, {"input_ids": ids}, ids)
        assert not fused_loss.decide(model, {"input_ids": ids}, ids)  # decided once
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "ScaledLogits" in lines[0] and "relative gap" in lines[0]
    assert model.training  # the measurement left the mode (and every RNG) as it was
    plain = causal_lm("llama-untied")
    assert fused_loss.decide(plain, {"input_ids": ids}, ids)


def test_compiled_model_takes_the_fused_loss_without_retracing():
    model = causal_lm("llama-untied")
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    own_loss, own = grads_of(model, False, {"input_ids": ids, "labels": ids})
    assert fused_loss.decide(model, {"input_ids": ids}, ids)  # installs the head's hook before compiling
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(model, backend="aot_eager")
    for _ in range(3):
        loss, fused = grads_of(compiled, True, {"input_ids": ids, "labels": ids})
        assert abs(float(loss) - float(own_loss)) <= 1e-6 * float(own_loss)
        assert_same_gradients(own, {k.removeprefix("_orig_mod."): v for k, v in fused.items()})
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # traced once, hook included
    with torch.no_grad():
        assert compiled(input_ids=ids).logits.shape == (
            2,
            9,
            VOCAB,
        )  # the hook is idle outside the fused loss


def test_labels_outside_the_vocabulary_are_named_with_the_vocabulary_size(tmp_path):
    hidden, weight = torch.randn(6, 8, requires_grad=True), torch.randn(16, 8)
    with pytest.raises(ValueError, match=r"labels hold \[16, 40\], outside the model's vocabulary of 16 ids"):
        linear_cross_entropy(hidden, weight, None, torch.tensor([1, 16, -100, 40, 2, 16]))
    with pytest.raises(ValueError, match=r"labels hold \[-7\]"):
        linear_cross_entropy(hidden, weight, None, torch.tensor([1, -7, -100, 3, 2, 0]))
    from conftest import tiny_gpt2

    from trainwright import Trainer, TrainingArguments

    model = tiny_gpt2()
    vocab = model.config.vocab_size
    rows = [{"input_ids": torch.arange(8) % vocab, "labels": torch.arange(8) % vocab} for _ in range(8)]
    rows[5]["labels"] = rows[5]["labels"].clone()
    rows[5]["labels"][3] = (
        vocab + 5
    )  # in the second batch: the first one is measured with the model's own loss
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=2,
        fused_linear_cross_entropy=True,
        train_sampling_strategy="sequential",
        report_to="none",
        use_cpu=True,
        save_strategy="no",
    )
    with pytest.raises(
        ValueError, match=rf"labels hold \[{vocab + 5}\], outside the model's vocabulary of {vocab}"
    ):
        Trainer(model=model, args=args, train_dataset=rows).train()
