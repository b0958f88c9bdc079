"""`lean_activations`: the dropout attention equals SDPA's math path (same RNG state, same masks,
same gradients) while keeping no ``queries x keys`` float tensor; on transformers models built
offline the training is the model's own (dropout on), and train() gives the model back as it was."""

from __future__ import annotations

import logging
import sys

import pytest
import torch
import torch.nn.functional as F
from kit import hf
from test_model_path import assert_same_gradients, causal_lm
from test_model_path_trainer import gpt2, train

from trainwright import TrainingArguments
from trainwright.modeling import lean_activations, lean_attention

transformers = pytest.importorskip("transformers")
tokenizer, tokenizer_dir = hf.tokenizer, hf.tokenizer_dir  # session fixtures

B, H, T, D = 2, 3, 24, 8


def _qkvg(dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=g, dtype=dtype, requires_grad=True) for _ in range(3))
    return q, k, v, torch.randn(B, H, T, D, generator=g, dtype=dtype)


def _masks():
    keep = torch.rand(B, 1, T, T, generator=torch.Generator().manual_seed(1)) > 0.3
    keep[0, 0, 5] = False  # a row that attends nowhere
    additive = torch.randn(B, 1, T, T, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    return {"none": None, "bool": keep, "additive": additive}


@pytest.mark.parametrize(
    ("mask_kind", "causal"), [("none", True), ("none", False), ("bool", False), ("additive", False)]
)  # SDPA takes a mask or is_causal
@pytest.mark.parametrize("block_rows", [T, 5], ids=["one-block", "blocks-of-5"])
def test_dropout_attention_equals_sdpas_math_path(monkeypatch, mask_kind, causal, block_rows):
    mask = _masks()[mask_kind]
    monkeypatch.setattr(lean_attention, "_BLOCK_ELEMENTS", B * H * T * block_rows)
    q, k, v, grad = _qkvg()
    torch.manual_seed(5)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.3, is_causal=causal)
    ref_next = torch.rand(4)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad)
    torch.manual_seed(5)
    out = lean_attention.DropoutAttention.apply(q, k, v, mask, causal, D**-0.5, 0.3)
    assert torch.equal(torch.rand(4), ref_next)  # the RNG stream goes on as after SDPA's
    grads = torch.autograd.grad(out, (q, k, v), grad)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for mine, theirs in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-12)
    if mask_kind == "bool":
        assert torch.equal(out[0, :, 5], torch.zeros_like(out[0, :, 5]))  # as SDPA: zeros, not NaN


def _saved_bytes(fn) -> dict[str, int]:
    """Bytes of the float tensors `fn`'s graph keeps, by whether they are queries x keys sized."""
    seen: dict[int, tuple[bool, int]] = {}

    def pack(t):
        square = t.dim() == 4 and t.shape[-1] == t.shape[-2] == T and t.is_floating_point()
        seen[t.untyped_storage().data_ptr()] = (square, t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return {
        "square": sum(n for sq, n in seen.values() if sq),
        "all": sum(n for _, n in seen.values()),
    }


def test_dropout_attention_keeps_no_probabilities():
    q, k, v, _ = _qkvg(torch.float32)
    sdpa = _saved_bytes(lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True))
    lean = _saved_bytes(lambda: lean_attention.DropoutAttention.apply(q, k, v, None, True, D**-0.5, 0.1))
    assert sdpa["square"] >= 2 * B * H * T * T * 4  # the math path keeps probabilities (and more)
    assert lean["square"] == 0 and lean["all"] < sdpa["all"] / 2


def test_attention_forward_is_transformers_sdpa_where_it_does_not_take_over():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module = torch.nn.Module()
    q, k, v, _ = _qkvg(torch.float32)
    for dropout, grad in ((0.0, True), (0.1, False)):  # no dropout; or no graph being recorded
        with torch.set_grad_enabled(grad):
            torch.manual_seed(3)
            ours, _ = lean_attention.attention_forward(module, q, k, v, None, dropout=dropout)
            torch.manual_seed(3)
            theirs, _ = sdpa_attention_forward(module, q, k, v, None, dropout=dropout)
        assert torch.equal(ours, theirs)
    assert lean_attention.takes_over(q, None, 0.1, {})
    assert not lean_attention.takes_over(q, None, 0.1, {"position_bias": torch.zeros(1)})


def _bert():
    return hf.bert("mlm", vocab_size=97, num_attention_heads=4, hidden_act="gelu_new", dropout=0.1)


MODELS = {
    "gpt2": lambda: causal_lm("gpt2"),
    "llama-gqa": lambda: _with_attention_dropout(causal_lm("llama-untied")),
    "qwen2": lambda: _with_attention_dropout(causal_lm("qwen2")),
    "bert-mlm": _bert,
}


def _with_attention_dropout(model):
    for module in model.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.2
    return model


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_model_trains_as_its_own_and_is_given_back(name, caplog):
    model = MODELS[name]().train()
    ids = torch.randint(1, 97, (3, 20), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    mask[0, :6] = 0  # padding: transformers' SDPA mask reaches the lean attention
    inputs = {"input_ids": ids, "attention_mask": mask, "labels": ids}
    before = [type(m) for m in model.modules()]

    def loss_and_grads():
        model.zero_grad(set_to_none=True)
        torch.manual_seed(7)  # the same dropout in both
        loss = model(**inputs).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    own_loss, own = loss_and_grads()
    calls = []
    real = lean_attention.DropoutAttention.apply
    with caplog.at_level(logging.INFO, logger="trainwright"):
        with lean_activations.applied(model):
            assert model.config._attn_implementation == lean_activations.ATTENTION
            lean_attention.DropoutAttention.apply = lambda *a: calls.append(1) or real(*a)
            try:
                loss, lean = loss_and_grads()
            finally:
                lean_attention.DropoutAttention.apply = real
    assert calls  # the lean attention ran, every layer through it
    torch.testing.assert_close(loss, own_loss, rtol=1e-6, atol=0)
    assert_same_gradients(own, lean, rel=1e-5)
    assert [type(m) for m in model.modules()] == before and model.config._attn_implementation == "sdpa"
    gelus = {"gpt2": 2, "bert-mlm": 3}.get(name, 0)  # BERT: 2 layers and its MLM head
    assert f"{gelus} Python GELU modules" in caplog.text or (gelus == 0 and "no Python GELU" in caplog.text)


def test_compiled_runs_keep_their_attention_and_a_model_with_nothing_lean_is_said(caplog):
    model = causal_lm("llama-untied")
    with caplog.at_level(logging.INFO, logger="trainwright"):
        with lean_activations.applied(model, compiled=True):
            assert model.config._attn_implementation == "sdpa"
    assert "no Python GELU modules; attention kept (torch_compile" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trainwright"):
        with lean_activations.applied(torch.nn.Sequential(torch.nn.Linear(2, 2))):
            pass
    assert "attention kept (not a transformers model)" in caplog.text
    assert any(r.levelno == logging.WARNING for r in caplog.records)


def test_a_model_on_eager_attention_keeps_it_and_still_gets_one_op_gelu(caplog):
    torch.manual_seed(0)
    config = hf.gpt2_config(vocab_size=97, dropout=0.1)
    model = transformers.GPT2LMHeadModel._from_config(config, attn_implementation="eager")
    with caplog.at_level(logging.INFO, logger="trainwright"):
        with lean_activations.applied(model):
            assert model.config._attn_implementation == "eager"  # its own eager attention, not SDPA's
            assert type(model.transformer.h[0].mlp.act).__name__ == "GELUTanh"
    assert (
        "2 Python GELU modules as one op; attention kept (its attention is ['eager'], not sdpa)"
        in caplog.text
    )


@pytest.mark.parametrize(
    "extra",
    [{}, {"fused_linear_cross_entropy": True}, {"activation_checkpointing": True}, {"padding_free": True}],
    ids=["own-loss", "fused-loss", "activation-checkpointing", "padding-free"],
)
def test_lean_activations_train_like_the_model_and_give_it_back(tokenizer, tmp_path, monkeypatch, extra):
    _, own_losses, own_weights = train(tokenizer, tmp_path, "own", gpt2(tokenizer, dropout=0.1), **extra)
    model = gpt2(tokenizer, dropout=0.1)
    calls = []
    real = lean_attention.DropoutAttention.apply
    monkeypatch.setattr(lean_attention.DropoutAttention, "apply", lambda *a: calls.append(1) or real(*a))
    act = model.transformer.h[0].mlp.act
    _, losses, weights = train(tokenizer, tmp_path, "lean", model, lean_activations=True, **extra)
    forwards = (
        2 if extra.get("activation_checkpointing") else 1
    )  # a checkpointed layer runs again in backward
    assert (
        len(calls) == 3 * 2 * 2 * forwards
    )  # steps x micro-batches x layers, all through the lean attention
    assert losses == pytest.approx(own_losses, rel=1e-5)
    for k in own_weights:
        torch.testing.assert_close(weights[k], own_weights[k], rtol=0, atol=1e-5, msg=k)
    assert model.transformer.h[0].mlp.act is act and model.config._attn_implementation == "sdpa"


def test_lean_activations_must_be_a_bool():
    with pytest.raises(ValueError, match="lean_activations"):
        TrainingArguments("out", lean_activations="yes")


def test_under_cpu_autocast_it_is_sdpas_attention_in_bf16():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, H * D, generator=g)
    weight = (torch.randn(H * D, 3 * H * D, generator=g) / 8).requires_grad_()

    def run(attention):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            q, k, v = (x @ weight).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
            torch.manual_seed(1)
            out = attention(q, k, v)
        out.float().sum().backward()
        grad, weight.grad = weight.grad, None
        return out, grad

    ref, ref_grad = run(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True)
    )
    out, grad = run(lambda q, k, v: lean_attention.DropoutAttention.apply(q, k, v, None, True, D**-0.5, 0.2))
    assert out.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)  # bf16 rounding, the same dropout
    assert float((grad - ref_grad).norm() / ref_grad.norm()) < 1e-3


def test_which_gelu_modules_become_one_op():
    from transformers import activations as act

    model = torch.nn.ModuleDict(
        {
            "new": act.NewGELUActivation(),
            "fast": act.FastGELUActivation(),
            "tanh_python": act.GELUTanh(use_gelu_tanh_python=True),
            "erf_python": act.GELUActivation(use_gelu_python=True),
            "tanh_op": act.GELUTanh(),  # already one op
            "quick": act.QuickGELUActivation(),  # another function: kept
        }
    )
    x = torch.randn(64, dtype=torch.float64)
    own = {name: m(x) for name, m in model.items()}
    originals = dict(model.items())
    with lean_activations.applied(model):
        swapped = {name for name, m in model.items() if m is not originals[name]}
        for name, m in model.items():
            torch.testing.assert_close(m(x), own[name], rtol=0, atol=1e-7)  # the same function
    assert swapped == {"new", "fast", "tanh_python", "erf_python"}
    assert dict(model.items()) == originals


def test_without_transformers_a_plain_model_trains_as_it_is(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` fails
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.GELU())
    with caplog.at_level(logging.INFO, logger="trainwright"):
        with lean_activations.applied(model):
            pass
    assert "no Python GELU modules; attention kept (not a transformers model)" in caplog.text
