"""DDP's settings where the arguments leave them unset, as transformers decides them."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from kit import hf

from trainwright.distributed.engine import find_unused_default


def test_find_unused_parameters_defaults_as_transformers_decides_it():
    args = SimpleNamespace(activation_checkpointing=False)
    assert find_unused_default(args, torch.nn.Linear(2, 2)) is True  # not a transformers model: on
    model = hf.gpt2()
    assert find_unused_default(args, model) is True
    model.gradient_checkpointing_enable()
    assert find_unused_default(args, model) is False  # checkpointed activations: off
    assert find_unused_default(SimpleNamespace(activation_checkpointing=True), hf.gpt2()) is False
