"""FLOP counting on fake tensors, the FLOPs-per-batch resolution order and the dense peak table."""

from __future__ import annotations

import gc
import logging
import time

import pytest
import torch
from conftest import tiny_gpt2
from torch import nn

from trainwright.observe import flops
from trainwright.observe.flops import (
    PEAK_FLOPS,
    FlopsEstimator,
    count_flops,
    estimate_6n_flops,
    get_peak_flops,
    match_device,
)
from trainwright.observe.memory import TrainerMemoryTracker

T = 1e12

# ------------------------------------------------------------------------------------------
# Peak table
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, key",
    [
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100-PCIE-40GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA H200", "h200-sxm"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40", "l40"),
        ("NVIDIA L40S", "l40s"),
        ("Tesla V100-SXM2-16GB", "v100-sxm"),
        ("Tesla V100-PCIE-32GB", "v100-pcie"),
        ("Tesla V100S-PCIE-32GB", "v100s-pcie"),
        ("Tesla T4", "t4"),
        ("AMD Instinct MI250X", "mi250x"),
        ("AMD Instinct MI300X", "mi300x"),
        # unknown or ambiguous: never another device's figure
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA H100", None),
        ("Tesla V100", None),
        ("NVIDIA A100X", None),
        ("NVIDIA GeForce RTX 4090", None),
        ("AMD Instinct MI250X/MI250", None),
        ("cpu", None),
    ],
)
def test_device_name_matching(name, key):
    assert match_device(name) == key
    if key is None:
        assert get_peak_flops(name, torch.bfloat16) is None


def test_dense_peaks_for_tricky_names():
    # not the 1979 "with sparsity" headline figure
    assert get_peak_flops("NVIDIA H100 80GB HBM3", torch.bfloat16) == 989.5 * T
    assert get_peak_flops("NVIDIA H100 PCIe", "bf16") == 756.5 * T
    assert get_peak_flops("NVIDIA H100 NVL", "fp16") == 835.5 * T
    assert get_peak_flops("NVIDIA H200", "bfloat16") == 989.5 * T
    assert get_peak_flops("NVIDIA H200 NVL", torch.bfloat16) == 835.5 * T
    assert get_peak_flops("NVIDIA A100-SXM4-40GB", torch.bfloat16) == 312 * T
    assert get_peak_flops("NVIDIA A10", torch.bfloat16) == 125 * T
    assert get_peak_flops("NVIDIA A10G", torch.bfloat16) == 70 * T
    assert get_peak_flops("NVIDIA L40S", torch.bfloat16) == 362.05 * T
    assert get_peak_flops("NVIDIA H100 80GB HBM3", torch.float8_e4m3fn) == 1979 * T
    assert get_peak_flops("AMD Instinct MI300X", torch.bfloat16) == 1307.4 * T
    # a dtype the device's matrix units lack has no peak
    assert get_peak_flops("NVIDIA A100-SXM4-80GB", "fp8") is None
    assert get_peak_flops("Tesla V100-SXM2-32GB", torch.bfloat16) is None
    assert get_peak_flops("Tesla T4", torch.float16) == 65 * T


def test_table_rows_are_consistently_dense():
    # A "with sparsity" figure mixed into a row breaks these 2x ratios between tensor-core dtypes.
    for device, row in PEAK_FLOPS.items():
        if "bf16" in row and "fp16" in row:
            assert row["bf16"] == row["fp16"], device
        if "bf16" in row and "tf32" in row:
            assert 1.9 <= row["bf16"] / row["tf32"] <= 2.1, device
        if "fp8" in row:
            assert 1.9 <= row["fp8"] / row["bf16"] <= 2.1, device
        assert set(row) <= {"fp32", "tf32", "bf16", "fp16", "fp8"}, device


def test_fp32_uses_tf32_peak_only_when_tf32_is_allowed():
    a100 = "NVIDIA A100-SXM4-80GB"
    assert get_peak_flops(a100, torch.float32, allow_tf32=False) == 19.5 * T
    assert get_peak_flops(a100, torch.float32, allow_tf32=True) == 156 * T
    assert get_peak_flops(a100, "tf32") == 156 * T
    # devices without TF32 units keep the fp32 peak
    assert get_peak_flops("Tesla V100-SXM2-16GB", torch.float32, allow_tf32=True) == 15.7 * T
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert get_peak_flops(a100, torch.float32) == 19.5 * T
        torch.set_float32_matmul_precision("high")
        assert get_peak_flops(a100, torch.float32) == 156 * T
    finally:
        torch.set_float32_matmul_precision(before)


def test_tf32_flag_of_the_new_precision_api_is_read():
    # After the fp32_precision API is used, reading the legacy flags raises in torch >= 2.9.
    matmul = torch.backends.cuda.matmul
    if not isinstance(getattr(matmul, "fp32_precision", None), str):
        pytest.skip("this torch has no fp32_precision API")
    before = matmul.fp32_precision
    try:
        matmul.fp32_precision = "tf32"
        assert get_peak_flops("NVIDIA A100-SXM4-80GB", torch.float32) == 156 * T
        matmul.fp32_precision = "ieee"
        assert get_peak_flops("NVIDIA A100-SXM4-80GB", torch.float32) == 19.5 * T
    finally:
        matmul.fp32_precision = before


def test_bad_dtype_is_rejected_with_the_allowed_values():
    with pytest.raises(ValueError, match="dtype must be a torch.dtype or one of"):
        get_peak_flops("NVIDIA A100-SXM4-80GB", "int3")
    with pytest.raises(ValueError, match="float64"):
        get_peak_flops("NVIDIA A100-SXM4-80GB", torch.float64)


# ------------------------------------------------------------------------------------------
# Counting
# ------------------------------------------------------------------------------------------


class MLP(nn.Module):
    forwards = 0  # counts every forward, the fake copy's included

    def __init__(self, sizes=(16, 32, 8)):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))

    def forward(self, x, labels=None):
        type(self).forwards += 1
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return {"loss": nn.functional.mse_loss(x, labels), "logits": x}


def _mlp_batch(batch_size, sizes=(16, 32, 8)):
    return {"x": torch.randn(batch_size, sizes[0]), "labels": torch.randn(batch_size, sizes[-1])}


def test_mlp_count_equals_the_analytic_6_b_sum_in_out():
    sizes, b = (16, 32, 24, 8), 4
    model = MLP(sizes)
    matmul = sum(i * o for i, o in zip(sizes[:-1], sizes[1:]))
    batch = _mlp_batch(b, sizes)
    batch["x"].requires_grad_(True)
    # 2 (forward) + 2 (input gradient) + 2 (weight gradient) FLOPs per weight per sample
    assert count_flops(model, batch) == 6 * b * matmul
    # Data needs no gradient: the first layer skips its input-gradient matmul (the counter sees
    # the real backward; the 6N rule does not).
    batch = _mlp_batch(b, sizes)
    assert count_flops(model, batch) == 6 * b * matmul - 2 * b * sizes[0] * sizes[1]


def test_frozen_layer_gets_no_weight_gradient_flops():
    sizes, b = (16, 32, 8), 4
    model = MLP(sizes)
    model.layers[1].requires_grad_(False)
    # layer 0: fwd + weight grad; layer 1: fwd + input grad (no weight grad)
    assert count_flops(model, _mlp_batch(b, sizes)) == b * (4 * 16 * 32 + 4 * 32 * 8)


def test_custom_loss_fn_is_used():
    model = MLP()

    def forward_only(outputs, batch):
        return outputs["logits"].detach().sum()  # no graph: nothing to backward

    assert count_flops(model, _mlp_batch(4), loss_fn=forward_only) == 2 * 4 * (16 * 32 + 32 * 8)


def _gpt2_flops(model, batch_size, seq, attention_units):
    """Linear layers 6 FLOPs per weight per token (the first layer, the embedding, needs no input
    gradient matmul); attention `attention_units` matmuls of 2*B*S*S*d FLOPs per layer."""
    cfg = model.config
    tokens = batch_size * seq
    linear = sum(m.weight.numel() for m in model.modules() if type(m).__name__ == "Conv1D")
    linear += cfg.n_embd * cfg.vocab_size  # the (tied) output projection
    attention = attention_units * 2 * batch_size * seq * seq * cfg.n_embd * cfg.n_layer
    return 6 * tokens * linear + attention


def test_tiny_gpt2_count_matches_analytic_formula_and_leaves_the_model_alone():
    model = tiny_gpt2(dropout=0.0)
    b, s = 4, 16
    ids = torch.randint(0, model.config.vocab_size, (b, s))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    batch = {"input_ids": ids, "attention_mask": mask, "labels": ids}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    calls = []
    model.register_forward_hook(lambda *a: calls.append("forward"))
    model.transformer.h[0].register_forward_pre_hook(lambda *a: calls.append("pre"))
    rng = torch.get_rng_state()

    counted = count_flops(model, batch)

    # Without dropout SDPA runs the fused CPU flash kernel: forward QK^T + PV (2 units), backward
    # recomputes QK^T and 4 gradient matmuls (5 units). The usual analytic formula has 2 + 4.
    assert counted == _gpt2_flops(model, b, s, attention_units=7)
    analytic = _gpt2_flops(model, b, s, attention_units=6)
    six_n = estimate_6n_flops(model, batch)
    print(
        f"tiny GPT-2: counted / 6N = {counted / six_n:.3f}, counted / analytic(6N + attention) = {counted / analytic:.3f}"
    )
    assert counted > six_n  # 6N ignores attention and the tied output projection
    assert calls == []  # no real forward ran, and the real model's hooks never fired
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert not any(isinstance(p, torch._subclasses.FakeTensor) for p in model.parameters())
    assert torch.equal(rng, torch.get_rng_state())


def test_unfused_attention_path_counts_the_analytic_six_units():
    model = tiny_gpt2(dropout=0.1)  # attention dropout in training selects SDPA's math path
    ids = torch.randint(0, model.config.vocab_size, (4, 16))
    assert count_flops(model, {"input_ids": ids, "labels": ids}) == _gpt2_flops(
        model, 4, 16, attention_units=6
    )


class DataDependent(nn.Module):
    forwards = 0

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, labels=None):
        type(self).forwards += 1
        h = self.proj(x)
        if h.sum() > 0:  # reads a value: impossible on fake tensors
            h = h * 2
        return {"loss": h.pow(2).mean()}


def test_count_flops_returns_none_when_the_model_cannot_run_on_fake_tensors(caplog):
    caplog.set_level(logging.WARNING, logger="trainwright.observe.flops")
    assert count_flops(DataDependent(), {"x": torch.randn(2, 8)}) is None
    assert "FLOP counting failed for DataDependent" in caplog.text


@pytest.mark.parametrize(
    "n_layer",
    [4, pytest.param(12, marks=pytest.mark.slow)],
)
def test_counting_a_large_model_does_not_copy_its_weights(n_layer):
    pytest.importorskip("transformers")
    from kit import hf

    # GPT-2 small's width, heads, vocabulary and positions (its default embedding dropout)
    sizes = dict(n_layer=n_layer, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024, embd_pdrop=0.1)
    model = hf.gpt2(bos_token_id=0, eos_token_id=0, **sizes)
    config = model.config
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ids = torch.randint(0, config.vocab_size, (8, 128))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    gc.collect()
    tracker = TrainerMemoryTracker(skip_memory_metrics=False)
    tracker.start("train")
    started = time.perf_counter()
    counted = count_flops(model, batch)
    seconds = time.perf_counter() - started
    metrics: dict = {}
    tracker.stop_and_update_metrics("train", metrics)
    peak = metrics["train_mem_cpu_alloc_delta"] + metrics["train_mem_cpu_peaked_delta"]
    print(
        f"GPT-2 n_layer={n_layer} n_embd=768, batch 8 x 128: count_flops {seconds:.2f} s, "
        f"{counted / 1e12:.3f} TFLOPs, peak RSS +{peak / 2**20:.1f} MiB vs weights {weight_bytes / 2**20:.0f} MiB"
    )
    assert counted == _gpt2_flops(model, 8, 128, attention_units=7)
    assert peak < 0.1 * weight_bytes


# ------------------------------------------------------------------------------------------
# 6N estimate and the FLOPs-per-batch resolution order
# ------------------------------------------------------------------------------------------


def test_6n_estimate_uses_non_embedding_parameters_and_tokens():
    model = tiny_gpt2()
    ids = torch.zeros(3, 10, dtype=torch.long)
    embedding = model.transformer.wte.weight.numel() + model.transformer.wpe.weight.numel()
    n = sum(p.numel() for p in model.parameters()) - embedding  # the tied lm_head counts once, as wte
    assert estimate_6n_flops(model, {"input_ids": ids}) == 6 * n * 30
    mlp = MLP()
    n_mlp = sum(p.numel() for p in mlp.parameters())
    assert estimate_6n_flops(mlp, _mlp_batch(5)) == 6 * n_mlp * 5  # no input_ids: batch size
    with pytest.raises(ValueError, match="the batch has no tensor"):
        estimate_6n_flops(mlp, {"x": [1, 2]})


def test_model_flops_per_batch_comes_first(caplog):
    caplog.set_level(logging.INFO, logger="trainwright.observe.flops")

    class WithMethod(MLP):
        def flops_per_batch(self, batch):
            return 123 * batch["x"].shape[0]

        def floating_point_ops(self, batch):
            raise AssertionError("must not be called")

    MLP.forwards = 0
    estimator = FlopsEstimator(WithMethod())
    assert estimator(_mlp_batch(4)) == 492
    assert estimator.source == "model.flops_per_batch"
    assert MLP.forwards == 0
    assert "FLOPs per batch from model.flops_per_batch" in caplog.text


def test_floating_point_ops_comes_second():
    class WithFpo(MLP):
        def floating_point_ops(self, batch):
            return 6 * 1000 * batch["x"].shape[0]

    estimator = FlopsEstimator(WithFpo())
    assert estimator(_mlp_batch(2)) == 12000
    assert estimator.source == "model.floating_point_ops"


def test_counter_is_used_and_cached_per_batch_shape(caplog):
    caplog.set_level(logging.INFO, logger="trainwright.observe.flops")
    model = MLP()
    wrapped = nn.DataParallel(model)  # wrappers are looked through
    estimator = FlopsEstimator(wrapped)
    assert estimator.model is wrapped and estimator.module is model
    MLP.forwards = 0
    expected = count_flops(model, _mlp_batch(4))
    assert MLP.forwards == 1
    assert estimator(_mlp_batch(4)) == expected
    assert estimator(_mlp_batch(4)) == expected
    assert MLP.forwards == 2  # counted once for this shape
    assert estimator.source == "flop_counter"
    assert estimator(_mlp_batch(6)) == expected * 6 / 4
    assert MLP.forwards == 3
    batch = _mlp_batch(4)
    batch["x"] = batch["x"].double()
    model.double()
    estimator(batch)
    assert MLP.forwards == 4  # another dtype is another entry
    assert "FLOPs per batch from flop_counter" in caplog.text


def test_six_n_is_the_last_fallback_and_counting_is_not_retried(caplog):
    caplog.set_level(logging.INFO, logger="trainwright.observe.flops")
    model = DataDependent()
    estimator = FlopsEstimator(model)
    DataDependent.forwards = 0
    batch = {"x": torch.randn(3, 8)}
    assert estimator(batch) == estimate_6n_flops(model, batch) == 6 * 72 * 3
    assert estimator.source == "6N"
    assert estimator({"x": torch.randn(5, 8)}) == 6 * 72 * 5
    assert DataDependent.forwards == 1
    assert "using the 6N estimate instead" in caplog.text


def test_shapes_beyond_the_counting_limit_use_6n(caplog):
    caplog.set_level(logging.WARNING, logger="trainwright.observe.flops")
    model = MLP()
    estimator = FlopsEstimator(model, max_counted_shapes=1)
    assert estimator(_mlp_batch(2)) == count_flops(model, _mlp_batch(2))
    assert estimator(_mlp_batch(3)) == estimate_6n_flops(model, _mlp_batch(3))
    assert estimator.source == "6N"
    estimator(_mlp_batch(5))
    assert caplog.text.count("distinct batch shapes") == 1
    # shapes already counted still are
    assert estimator(_mlp_batch(2)) == count_flops(model, _mlp_batch(2))
    assert estimator.source == "flop_counter"


def test_bad_estimator_inputs_are_rejected():
    class Attr(MLP):
        flops_per_batch = 5

    with pytest.raises(TypeError, match="Attr.flops_per_batch must be a method"):
        FlopsEstimator(Attr())
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        FlopsEstimator(lambda x: x)
    with pytest.raises(ValueError, match="max_counted_shapes"):
        FlopsEstimator(MLP(), max_counted_shapes=-1)


def test_tf32_enabled_reflects_matmul_precision():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert flops.tf32_enabled() is False
        torch.set_float32_matmul_precision("high")
        assert flops.tf32_enabled() is True
    finally:
        torch.set_float32_matmul_precision(before)


def test_compiled_models_are_counted_on_the_eager_copy():
    model = MLP()
    eager = count_flops(model, _mlp_batch(4))
    compiles = []

    def backend(graph_module, inputs):
        compiles.append(1)
        return graph_module.forward

    compiled = torch.compile(model, backend=backend)
    estimator = FlopsEstimator(compiled)
    assert estimator.module is model  # the wrapper is looked through
    calls = []
    model.layers[0].register_forward_hook(lambda *a: calls.append(1))
    model.compile(backend=backend)  # compiled in place too
    assert estimator(_mlp_batch(4)) == eager
    assert count_flops(compiled, _mlp_batch(4)) == eager
    assert calls == [] and compiles == []  # neither the real model nor dynamo ran


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a GPU: the loop's CPU batch against a CUDA model"
)
def test_cpu_batch_counts_on_a_cuda_model():
    model = tiny_gpt2()
    batch = {"input_ids": torch.randint(0, 64, (2, 16)), "labels": torch.randint(0, 64, (2, 16))}
    on_cpu = flops.count_flops(model, batch)
    assert on_cpu > 0
    assert flops.count_flops(model.cuda(), batch) == on_cpu
