"""FLOPs of a training step and the dense peak FLOP/s of devices: the two halves of MFU.

FLOPs per batch come, in this order, from:

1. the model's own ``flops_per_batch(batch)`` method (exact if the author wrote it so);
2. the model's ``floating_point_ops(batch)`` method (transformers v4 models: 6 x non-embedding
   parameters x tokens);
3. :func:`count_flops`: one forward + backward run under ``FlopCounterMode`` on a fake-tensor copy
   of the model and the batch (no real compute, no copy of the weights), cached per batch shape;
4. :func:`estimate_6n_flops`, the 6 x N x tokens rule, when counting is impossible.

What the automatic counter measures, and what it misses:

* it counts matmuls, convolutions and attention kernels (2 FLOPs per multiply-add); elementwise
  ops, norms, softmax, embeddings and the optimizer are not counted (they are small);
* attention is counted as full (non-causal) S x S, as if no mask were applied; a fused attention
  kernel's backward counts its recomputation of QK^T (7 matmul units per layer instead of the
  6 of the usual analytic formula), while the unfused (math) path counts 6;
* recomputation under activation checkpointing is counted, so the figure is closer to hardware
  FLOPs than to the model FLOPs of the MFU convention;
* fused or custom kernels it has no formula for (flash-attn package, Triton/Liger kernels, ...)
  count as zero;
* the backward pass is the real one: frozen weights get no weight-gradient matmul, and the first
  layer computes no input gradient, which the 6N rule ignores.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils import _pytree as pytree

from trainwright.core.modules import unwrap_model

logger = logging.getLogger(__name__)

TFLOPS = 1e12

# Dense (no 2:4 sparsity) peak TFLOP/s per device, by compute dtype. "fp32" is the non-tensor-core
# rate (or the matrix-core rate where fp32 GEMMs run on matrix cores, as on AMD Instinct); "tf32"
# is used for fp32 matmuls only when TF32 is allowed. A dtype missing from a row is not supported
# by that device's matrix units, and gets no peak (no MFU) rather than a guess.
# NVIDIA datasheets for Ampere/Hopper/Ada print the tensor-core figures "with sparsity"; those
# have been halved here. Where a datasheet prints both (L40, L40S, A10, A100), the dense one is used.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    # NVIDIA A100 datasheet (SXM4 and PCIe identical): 19.5 / 156 / 312.
    "a100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    # NVIDIA H100 datasheet, SXM column: TF32 989*, BF16/FP16 1979*, FP8 3958* (* sparse) -> halved.
    "h100-sxm": {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
    # NVIDIA H100 datasheet, PCIe column: TF32 756*, BF16/FP16 1513*, FP8 3026* -> halved.
    "h100-pcie": {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5, "fp8": 1513.0},
    # NVIDIA H100 datasheet, NVL column (per GPU): TF32 835*, BF16/FP16 1671*, FP8 3341* -> halved.
    "h100-nvl": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
    # NVIDIA H200 datasheet, SXM column: same compute as H100 SXM (TF32 989*, BF16 1979*, FP8 3958*).
    "h200-sxm": {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
    # NVIDIA H200 datasheet, NVL column: TF32 835*, BF16/FP16 1671*, FP8 3341* -> halved.
    "h200-nvl": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
    # NVIDIA L4 datasheet: FP32 30.3, TF32 120*, BF16/FP16 242*, FP8 485* -> halved.
    "l4": {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5},
    # NVIDIA L40S datasheet (dense | sparse printed): TF32 183, BF16/FP16 362.05, FP8 733.
    "l40s": {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0},
    # NVIDIA L40 datasheet (dense | sparse printed): TF32 90.5, BF16/FP16 181.05, FP8 362.
    "l40": {"fp32": 90.5, "tf32": 90.5, "bf16": 181.05, "fp16": 181.05, "fp8": 362.0},
    # NVIDIA A10 datasheet (dense | sparse printed): FP32 31.2, TF32 62.5, BF16/FP16 125.
    "a10": {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
    # A10G is an AWS-only part with no NVIDIA datasheet. AWS/NVIDIA's spec table (as reproduced in
    # Baseten's "A10 vs A10G" comparison) gives FP32 35, TF32 35, BF16/FP16 70 dense: it is NOT
    # an A10 (Composer and Lightning reuse the A10's 125, which would halve the reported MFU).
    "a10g": {"fp32": 35.0, "tf32": 35.0, "bf16": 70.0, "fp16": 70.0},
    # NVIDIA V100 datasheet: SXM2 15.7 / 125 tensor, PCIe 14 / 112, V100S PCIe 16.4 / 130 (fp16 only).
    "v100-sxm": {"fp32": 15.7, "fp16": 125.0},
    "v100-pcie": {"fp32": 14.0, "fp16": 112.0},
    "v100s-pcie": {"fp32": 16.4, "fp16": 130.0},
    # NVIDIA T4 datasheet: FP32 8.1, mixed FP16/FP32 65.
    "t4": {"fp32": 8.1, "fp16": 65.0},
    # AMD Instinct MI250X datasheet (whole OAM = 2 GCDs): FP32 matrix 95.7, FP16/BF16 383. PyTorch
    # sees each GCD as one device, so the per-device figures are halved. No TF32, no FP8.
    "mi250x": {"fp32": 47.85, "bf16": 191.5, "fp16": 191.5},
    # AMD Instinct MI300X datasheet (dense): FP32 matrix 163.4, TF32 653.7, FP16/BF16 1307.4,
    # FP8 2614.9 (the sparsity figures, twice these, are not used).
    "mi300x": {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
}

_DTYPE_NAMES = {
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "tf32": "tf32",
    "tfloat32": "tf32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "fp8": "fp8",
}


def _dtype_key(dtype: torch.dtype | str) -> str:
    if isinstance(dtype, torch.dtype):
        if dtype == torch.float32:
            return "fp32"
        if dtype == torch.bfloat16:
            return "bf16"
        if dtype == torch.float16:
            return "fp16"
        if "float8" in str(dtype):
            return "fp8"
        raise ValueError(
            f"get_peak_flops: dtype {dtype} has no peak table column; expected float32, bfloat16, "
            "float16, a float8 dtype, or one of " + ", ".join(sorted(_DTYPE_NAMES))
        )
    if isinstance(dtype, str) and dtype.lower() in _DTYPE_NAMES:
        return _DTYPE_NAMES[dtype.lower()]
    if isinstance(dtype, str) and dtype.lower().startswith("float8"):
        return "fp8"
    raise ValueError(
        f"get_peak_flops: dtype must be a torch.dtype or one of {sorted(_DTYPE_NAMES)}, got {dtype!r}"
    )


def match_device(device_name: str) -> str | None:
    """Key of `PEAK_FLOPS` for a `torch.cuda.get_device_name()` string, or None if unknown.

    Matching is on whole words of the lower-cased name, so "a10" never matches "a100" and
    "gh200" never matches "h200". Names that do not say which variant they are (a bare "H100")
    are unknown rather than guessed.
    """
    words = set(re.findall(r"[a-z0-9]+", device_name.lower()))

    def has(*prefixes: str) -> bool:
        return any(w.startswith(p) for w in words for p in prefixes)

    if "h100" in words:
        if "nvl" in words:
            return "h100-nvl"
        if "pcie" in words or "hbm2e" in words:
            return "h100-pcie"
        if "hbm3" in words or has("sxm"):
            return "h100-sxm"
        return None
    if "h200" in words:
        return "h200-nvl" if "nvl" in words else "h200-sxm"
    if "v100s" in words:
        return "v100s-pcie"
    if "v100" in words:
        if has("sxm"):
            return "v100-sxm"
        if "pcie" in words:
            return "v100-pcie"
        return None
    if "mi250x" in words:
        # ROCm may report "MI250X/MI250" for either card; the MI250 has fewer compute units.
        return None if "mi250" in words else "mi250x"
    for key in ("a100", "a10g", "a10", "l40s", "l40", "l4", "t4", "mi300x"):
        if key in words:
            return key
    return None


def tf32_enabled() -> bool:
    """Whether fp32 matmuls on CUDA may run as TF32, per PyTorch's global matmul settings."""
    # torch >= 2.9 resolves every way of setting it (set_float32_matmul_precision, allow_tf32, the
    # fp32_precision flags) into this flag; reading the legacy ones after the new API was used
    # raises, so the new flag is read first.
    precision = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
    if isinstance(precision, str):
        return precision == "tf32"
    return torch.get_float32_matmul_precision() != "highest" or bool(torch.backends.cuda.matmul.allow_tf32)


def get_peak_flops(
    device_name: str, dtype: torch.dtype | str, allow_tf32: bool | None = None
) -> float | None:
    """Dense peak FLOP/s of one device for matmuls in `dtype`, or None when not known.

    fp32 uses the TF32 peak when TF32 is allowed (`allow_tf32`, or PyTorch's matmul precision
    settings when it is None) and the device has TF32 units. An unknown device, or a dtype the
    device's matrix units do not support, gives None: never another device's figure.
    """
    key = _dtype_key(dtype)
    device = match_device(device_name)
    if device is None:
        return None
    row = PEAK_FLOPS[device]
    if key == "fp32":
        use_tf32 = tf32_enabled() if allow_tf32 is None else allow_tf32
        if use_tf32 and "tf32" in row:
            key = "tf32"
    value = row.get(key)
    return None if value is None else value * TFLOPS


# ---------------------------------------------------------------------------------------------
# Counting
# ---------------------------------------------------------------------------------------------

# Hooks belong to the real model (and may have side effects, e.g. storing activations): the
# counting copy gets empty hook tables instead of copies.
_HOOK_TABLES = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)


def _cpu_attention_formulas() -> dict[Any, Callable[..., int]]:
    """FLOP formulas for the CPU flash-attention kernels, which torch's counter lacks.

    Same convention as its CUDA attention formulas: forward = QK^T + PV, backward = recomputed
    QK^T + 4 gradient matmuls, full S x S (no causal halving).
    """
    from torch.utils import flop_counter

    forward_op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward_op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    count_fwd = getattr(flop_counter, "sdpa_flop_count", None)
    count_bwd = getattr(flop_counter, "sdpa_backward_flop_count", None)
    formulas: dict[Any, Callable[..., int]] = {}
    if forward_op is not None and count_fwd is not None:

        def forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
            return count_fwd(query, key, value)

        formulas[forward_op] = forward
    if backward_op is not None and count_bwd is not None:

        def backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
            return count_bwd(grad_out, query, key, value)

        formulas[backward_op] = backward
    return formulas


def _default_loss(outputs: Any) -> torch.Tensor:
    """The model's loss if it returned one, else the sum of its logits / first output tensor."""
    if isinstance(outputs, torch.Tensor):
        return outputs.sum()
    if isinstance(outputs, Mapping):  # includes transformers' ModelOutput
        loss = outputs.get("loss")
        if isinstance(loss, torch.Tensor):
            return loss.sum()
        logits = outputs.get("logits")
        if isinstance(logits, torch.Tensor):
            return logits.sum()
        values = list(outputs.values())
    elif isinstance(outputs, (tuple, list)):
        values = list(outputs)
    else:
        values = []
    for value in values:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.sum()
    raise TypeError(
        f"count_flops: cannot find a loss or a floating-point tensor in the output {type(outputs)}"
    )


class _FakeStepCounter:
    """Counts one training step on a fake-tensor copy of a model, built once and reused.

    Fake tensors carry shape, dtype and device but no storage, so the copy costs no parameter
    memory and nothing is computed; the real model is never called.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model
        self._mode: Any = None
        self._copy: torch.nn.Module | None = None

    def _build(self) -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        # Real tensors met during the forward (e.g. kept in plain Python containers) are
        # converted to fake on the fly instead of failing.
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        memo: dict[int, Any] = {}

        def fake(t: torch.Tensor) -> torch.Tensor:
            if id(t) not in memo:
                f: torch.Tensor = mode.from_tensor(t)
                if isinstance(t, torch.nn.Parameter):
                    f = torch.nn.Parameter(f, requires_grad=t.requires_grad)
                memo[id(t)] = f
            return memo[id(t)]

        for module in self._model.modules():
            for table in _HOOK_TABLES:
                hooks = module.__dict__.get(table)
                if hooks is not None:
                    memo[id(hooks)] = type(hooks)()
            for t in (*module._parameters.values(), *module._buffers.values()):
                if t is not None:
                    fake(t)
            for value in vars(module).values():
                if isinstance(value, torch.Tensor):
                    fake(value)
        # deepcopy takes every tensor from the memo (shared / tied weights stay shared) and copies
        # only the Python structure of the modules.
        self._copy = copy.deepcopy(self._model, memo)
        self._mode = mode

    def count(self, batch: Mapping[str, Any], loss_fn: Callable[[Any, Any], torch.Tensor] | None) -> int:
        from torch.utils.flop_counter import FlopCounterMode

        if self._copy is None:
            self._build()
        assert self._copy is not None
        mode = self._mode
        device = _model_device(self._model)

        def fake_input(t: torch.Tensor) -> torch.Tensor:
            # batches are counted on the CPU copy the loop holds; the model may live on an accelerator
            f = mode.from_tensor(t)
            if device is not None and f.device != device:
                with mode:
                    f = f.to(device)
            return f

        fake_batch = pytree.tree_map_only(torch.Tensor, fake_input, dict(batch))
        try:
            counter = FlopCounterMode(display=False, custom_mapping=_cpu_attention_formulas())
            with mode, counter, torch.enable_grad():
                outputs = self._copy(**fake_batch)
                loss = loss_fn(outputs, fake_batch) if loss_fn is not None else _default_loss(outputs)
                if loss.requires_grad:
                    loss.backward()
        finally:
            for p in self._copy.parameters():
                p.grad = None
        return int(counter.get_total_flops())


def _model_device(model: torch.nn.Module) -> torch.device | None:
    """The device of the model's first parameter (None for a model without parameters)."""
    for p in model.parameters():
        return p.device
    return None


def count_flops(
    model: torch.nn.Module,
    batch: Mapping[str, Any],
    *,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
) -> int | None:
    """FLOPs of one forward + backward of `model(**batch)`, counted on a fake-tensor copy.

    The loss is `loss_fn(outputs, batch)` if given, else the model's `loss` output, else the sum
    of its logits. Nothing runs on real data, the real model is untouched (its hooks do not
    fire), and no parameter or buffer memory is allocated (the modules' other Python attributes
    are deep-copied). Returns None when the model cannot run on
    fake tensors (e.g. it reads tensor values with `.item()` or calls a kernel with no fake
    implementation). See the module docstring for what the count includes.
    """
    try:
        return _FakeStepCounter(unwrap_model(model)).count(batch, loss_fn)
    except Exception as exc:  # any failure means "cannot count": the caller falls back
        logger.warning("FLOP counting failed for %s: %s: %s", type(model).__name__, type(exc).__name__, exc)
        return None


def non_embedding_parameters(model: torch.nn.Module) -> int:
    embedding = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen and id(p) not in embedding:
            seen.add(id(p))
            total += p.numel()
    return total


def _first_tensor(batch: Mapping[str, Any]) -> torch.Tensor | None:
    for leaf in pytree.tree_leaves(dict(batch)):
        if isinstance(leaf, torch.Tensor):
            return leaf
    return None


def estimate_6n_flops(model: torch.nn.Module, batch: Mapping[str, Any]) -> int:
    """6 x non-embedding parameters x tokens (tokens = `input_ids.numel()`, else the batch size).

    The 2 (forward) + 4 (backward) FLOPs per parameter per token rule; it ignores attention,
    the output projection of tied embeddings and frozen weights.
    """
    ids = batch.get("input_ids")
    if isinstance(ids, torch.Tensor):
        tokens = ids.numel()
    else:
        first = _first_tensor(batch)
        if first is None:
            raise ValueError(f"estimate_6n_flops: the batch has no tensor (keys: {sorted(batch)})")
        tokens = first.shape[0] if first.dim() else 1
    return 6 * non_embedding_parameters(model) * tokens


def _signature(value: Any) -> Any:
    """Hashable description of a batch's structure: keys, shapes and dtypes, not values."""
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return tuple((key, _signature(v)) for key, v in value.items())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *(_signature(v) for v in value))
    return type(value).__name__


class FlopsEstimator:
    """FLOPs of one training step (forward + backward) on a batch, from the best source available.

    ``flops = estimator(batch)`` for each batch. Sources, in order: the model's
    ``flops_per_batch(batch)``, the model's ``floating_point_ops(batch)``, the automatic counter
    (cached per batch keys/shapes/dtypes; at most `max_counted_shapes` distinct shapes are
    counted, later new shapes use the 6N estimate), then the 6N estimate. `source` names the
    one used for the latest batch; the first use of each source is logged. `model` is the
    object given; wrappers (DDP, DataParallel, torch.compile) are looked through.
    """

    SOURCES = ("model.flops_per_batch", "model.floating_point_ops", "flop_counter", "6N")

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
        max_counted_shapes: int = 64,
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"FlopsEstimator: model must be a torch.nn.Module, got {type(model).__name__}")
        if (
            isinstance(max_counted_shapes, bool)
            or not isinstance(max_counted_shapes, int)
            or max_counted_shapes < 0
        ):
            raise ValueError(
                f"FlopsEstimator: max_counted_shapes must be an int >= 0, got {max_counted_shapes!r}"
            )
        module = unwrap_model(model)
        for name in ("flops_per_batch", "floating_point_ops"):
            attr = getattr(module, name, None)
            if attr is not None and not callable(attr):
                raise TypeError(
                    f"FlopsEstimator: {type(module).__name__}.{name} must be a method taking the batch, "
                    f"got {type(attr).__name__}"
                )
        self.model = model
        self.module = module  # what is counted
        self.loss_fn = loss_fn
        self.max_counted_shapes = max_counted_shapes
        # the model's own FLOP method, looked up once (it is called for every batch)
        self._per_batch: tuple[str, Callable] | None = next(
            (
                (f"model.{name}", getattr(module, name))
                for name in ("flops_per_batch", "floating_point_ops")
                if getattr(module, name, None) is not None
            ),
            None,
        )
        self.source: str | None = None
        self._cache: dict[Any, int] = {}
        self._counter = _FakeStepCounter(module)
        self._counter_failed = False
        self._cap_warned = False
        self._logged_sources: set[str] = set()

    def __call__(self, batch: Mapping[str, Any]) -> float:
        """FLOPs of one forward + backward of the model on `batch`."""
        if self._per_batch is not None:
            return self._use(self._per_batch[0], float(self._per_batch[1](batch)))
        if not self._counter_failed:
            key = _signature(batch)
            flops = self._cache.get(key)
            if flops is None and len(self._cache) < self.max_counted_shapes:
                flops = self._count(batch)
                if flops is not None:
                    self._cache[key] = flops
            elif flops is None and not self._cap_warned:
                self._cap_warned = True
                logger.warning(
                    "FLOP counter: more than %d distinct batch shapes; new shapes use the 6N estimate "
                    "(pad batches to fixed lengths, or give the model a flops_per_batch method)",
                    self.max_counted_shapes,
                )
            if flops is not None:
                return self._use("flop_counter", float(flops))
        return self._use("6N", float(estimate_6n_flops(self.module, batch)))

    def _count(self, batch: Mapping[str, Any]) -> int | None:
        try:
            return self._counter.count(batch, self.loss_fn)
        except Exception as exc:  # the model cannot run on fake tensors: stop trying
            self._counter_failed = True
            logger.warning(
                "FLOP counting failed for %s (%s: %s); using the 6N estimate instead",
                type(self.module).__name__,
                type(exc).__name__,
                exc,
            )
            return None

    def _use(self, source: str, flops: float) -> float:
        if source is self.source:
            return flops
        self.source = source
        if source not in self._logged_sources:
            self._logged_sources.add(source)
            logger.info("FLOPs per batch from %s (%s)", source, type(self.module).__name__)
        return flops
