"""`lean_activations`: the same functions, computed by kernels that keep less for the backward.

For one `train()` call (restored when it ends, so the model the user holds afterwards is made of
its own modules again):

* transformers' Python tanh-GELU modules (`NewGELUActivation`, GPT-2's ``gelu_new``;
  `FastGELUActivation`; ``gelu_python_tanh``) and Python erf-GELU (``gelu_python``) become
  transformers' own one-op modules (`GELUTanh`, `GELUActivation`): the formula keeps four
  intermediate tensors per call for its backward, the op keeps its input (rounding may differ in
  the last bit, as transformers documents for `GELUTanh`);
* a model on transformers' SDPA attention gets :func:`~trainwright.modeling.lean_attention.attention_forward`,
  which is SDPA except where SDPA would keep three ``queries x keys`` tensors per layer (dropout on
  the CPU); not under `torch_compile` (the compiled graph decides what it keeps).

What applies is decided per model and said in one log line; a model with nothing to make lean
trains as it is, with that line saying so.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from torch import nn

from trainwright.modeling import lean_attention

logger = logging.getLogger(__name__)

ATTENTION = "trainwright_sdpa"


def _one_op_gelu(act: Any, module: nn.Module) -> nn.Module | None:
    """transformers' one-op module computing what `module` computes in Python, or None (`act`:
    ``transformers.activations``)."""
    kind: Any = type(module)
    if kind in (act.NewGELUActivation, act.FastGELUActivation):
        return act.GELUTanh()
    python_forms = {act.GELUTanh: "_gelu_tanh_python", act.GELUActivation: "_gelu_python"}
    bound = getattr(getattr(module, "act", None), "__func__", None)
    if kind in python_forms and bound is getattr(kind, python_forms[kind]):
        return kind()
    return None


def _swap_activations(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """Replace the Python GELU modules in place: (parent, name, original) of each."""
    try:
        from transformers import activations as act
    except ImportError:  # a plain PyTorch model without transformers installed: none to replace
        return []
    swapped = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            lean = _one_op_gelu(act, child)
            if lean is not None:
                setattr(parent, name, lean)
                swapped.append((parent, name, child))
    return swapped


def _pretrained(model: nn.Module) -> Any:
    """The outermost transformers `PreTrainedModel` in `model` (under DDP, compile, PEFT), or None."""
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return None
    return next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)


def _attention_refusal(base: Any, compiled: bool) -> str | None:
    if base is None:
        return "not a transformers model"
    if compiled:
        return "torch_compile: the compiled graph decides what it keeps"
    implementations = {
        m.config._attn_implementation
        for m in base.modules()
        if hasattr(getattr(m, "config", None), "_attn_implementation")
    }
    if implementations != {"sdpa"}:
        return f"its attention is {sorted(map(str, implementations))}, not sdpa"
    if not base._can_set_attn_implementation():
        return "it does not take transformers' AttentionInterface"
    return None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, lean_attention.attention_forward)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)  # the masks SDPA takes


@contextlib.contextmanager
def applied(model: nn.Module, compiled: bool = False) -> Iterator[None]:
    """`model` with lean activations while the block runs; its own modules and attention after."""
    swapped = _swap_activations(model)
    base = _pretrained(model)
    refusal = _attention_refusal(base, compiled)
    if base is not None and refusal is None:
        _register()
        base.set_attn_implementation(ATTENTION)
        if base.config._attn_implementation != ATTENTION:
            refusal = "transformers kept its attention implementation"
    name = type(base if base is not None else model).__name__
    attention = (
        f"attention kept ({refusal})" if refusal else "SDPA attention without the probabilities under dropout"
    )
    gelus = f"{len(swapped)} Python GELU modules as one op" if swapped else "no Python GELU modules"
    log = logger.info if swapped or not refusal else logger.warning
    log("lean_activations: %s: %s; %s.", name, gelus, attention)
    try:
        yield
    finally:
        for parent, child_name, original in swapped:
            setattr(parent, child_name, original)
        if base is not None and refusal is None:
            base.set_attn_implementation("sdpa")
