"""Optimizer creation: decay grouping, optimizer names, optim_args, fused/foreach choice."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import pytest
import torch
from torch import nn

from trainwright.optim import optimizers as optim
from trainwright.optim.optimizers import (
    OPTIMIZER_NAMES,
    create_optimizer,
    decay_param_groups,
    get_decay_parameter_names,
    get_optimizer_cls_and_kwargs,
    parse_optim_args,
)


@dataclass
class Args:
    """The TrainingArguments fields the optimizer code reads."""

    optim: Any = "adamw_torch"
    learning_rate: float = 5e-5
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    optim_args: str | None = None


def _gpt2():
    pytest.importorskip("transformers")
    from kit import hf

    return hf.gpt2(seed=None, n_positions=32, dropout=0.1, bos_token_id=0, eos_token_id=0)


class MyRMSNorm(nn.Module):
    """A norm that is not a torch norm subclass, like the ones model libraries define."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 4)
        self.pre = nn.LayerNorm(4)  # a norm found by its type, whatever its name
        self.bn = nn.BatchNorm1d(4)
        self.gn = nn.GroupNorm(2, 4)
        self.rms = nn.RMSNorm(4)
        self.custom = MyRMSNorm(4)  # found by its class name
        self.block = nn.Module()
        self.block.q_norm = nn.Parameter(torch.ones(4))  # found by the name patterns
        self.block.norm2 = nn.Parameter(torch.ones(4))
        self.block.ln_f = nn.Parameter(torch.ones(4))
        self.block.normalizer_weight = nn.Parameter(torch.ones(4))  # "norm" inside a word is not a norm
        self.block.relative_attention_bias = nn.Embedding(3, 2)
        self.head = nn.Linear(4, 2, bias=False)


def test_decay_names_on_a_plain_module() -> None:
    decay = get_decay_parameter_names(Plain())
    assert decay == ["embed.weight", "proj.weight", "block.normalizer_weight", "head.weight"]


def test_decay_names_on_gpt2_match_transformers() -> None:
    model = _gpt2()
    decay = get_decay_parameter_names(model)
    assert {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.attn.c_attn.weight"} <= set(
        decay
    )
    assert "lm_head.weight" in decay  # tied to wte: listed under both names
    for name in decay:
        assert ".ln_" not in name and not name.endswith("bias"), name
    assert len(decay) == len(set(decay))
    from transformers import Trainer

    assert set(decay) == set(Trainer.get_decay_parameter_names(None, model))


def test_decay_names_on_llama_rmsnorm_match_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    from kit import ecosystem as eco

    sizes = dict(num_hidden_layers=1, hidden_size=16, intermediate_size=32, num_attention_heads=2)
    model = eco.llama_lm(seed=None, vocab_size=32, **sizes)
    decay = get_decay_parameter_names(model)
    assert not [n for n in decay if "norm" in n]
    assert "model.embed_tokens.weight" in decay
    assert set(decay) == set(transformers.Trainer.get_decay_parameter_names(None, model))


def test_create_optimizer_groups() -> None:
    model = Plain()
    model.proj.weight.requires_grad_(False)  # frozen: in no group
    optimizer = create_optimizer(model, Args(weight_decay=0.1, learning_rate=1e-3))
    assert isinstance(optimizer, torch.optim.AdamW)
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {id(p) for p in decay["params"]} == {
        id(model.embed.weight),
        id(model.block.normalizer_weight),
        id(model.head.weight),
    }
    expected_no_decay = {id(p) for n, p in model.named_parameters() if p.requires_grad} - {
        id(p) for p in decay["params"]
    }
    assert {id(p) for p in no_decay["params"]} == expected_no_decay
    assert id(model.proj.weight) not in expected_no_decay
    assert decay["lr"] == no_decay["lr"] == 1e-3


def test_create_optimizer_on_gpt2_has_each_tied_weight_once() -> None:
    model = _gpt2()
    optimizer = create_optimizer(model, Args(weight_decay=0.01))
    grouped = [p for group in optimizer.param_groups for p in group["params"]]
    assert len(grouped) == len({id(p) for p in grouped}) == len(list(model.parameters()))
    decay_ids = {id(p) for p in optimizer.param_groups[0]["params"]}
    assert id(model.transformer.wte.weight) in decay_ids
    assert id(model.transformer.ln_f.weight) not in decay_ids


def test_decay_param_groups_for_a_custom_optimizer_class() -> None:
    model = Plain()
    groups = decay_param_groups(model, 0.3)
    assert [g["weight_decay"] for g in groups] == [0.3, 0.0]
    assert [id(p) for p in groups[0]["params"]] == [
        id(model.embed.weight),
        id(model.proj.weight),
        id(model.block.normalizer_weight),
        id(model.head.weight),
    ]
    torch.optim.SGD(groups, lr=0.1)  # usable as is by any optimizer class


def test_create_optimizer_keeps_an_empty_group_as_upstream_and_needs_trainable_params() -> None:
    no_bias = nn.Sequential(nn.Linear(3, 3, bias=False), nn.Linear(3, 1, bias=False))
    optimizer = create_optimizer(no_bias, Args(weight_decay=0.1))
    # transformers' two groups, the no-decay one empty: optimizer files load across the libraries
    assert [len(g["params"]) for g in optimizer.param_groups] == [2, 0]
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="Linear has no parameters with requires_grad=True"):
        create_optimizer(frozen, Args())


def test_optimizer_names_map_to_classes() -> None:
    expected = {
        "adamw_torch": torch.optim.AdamW,
        "adamw_hf": torch.optim.AdamW,
        "adamw_torch_fused": torch.optim.AdamW,
        "adamw_torch_foreach": torch.optim.AdamW,
        "sgd": torch.optim.SGD,
        "adagrad": torch.optim.Adagrad,
        "rmsprop": torch.optim.RMSprop,
    }
    for name, cls in expected.items():
        got, kwargs = get_optimizer_cls_and_kwargs(Args(optim=name, learning_rate=0.02))
        assert got is cls, name
        assert kwargs["lr"] == 0.02
        create_optimizer(nn.Linear(2, 2), Args(optim=name)).step()  # the kwargs are accepted by the class
    assert set(expected) <= set(OPTIMIZER_NAMES)


def test_adamw_kwargs_and_alias() -> None:
    args = Args(optim="adamw_torch", learning_rate=3e-4, adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-6)
    cls, kwargs = get_optimizer_cls_and_kwargs(args)
    assert cls is torch.optim.AdamW
    assert kwargs == {"lr": 3e-4, "betas": (0.8, 0.95), "eps": 1e-6}
    args.optim = "adamw_hf"
    assert get_optimizer_cls_and_kwargs(args) == (cls, kwargs)
    args.optim = "adamw_torch_foreach"
    assert get_optimizer_cls_and_kwargs(args)[1] == {**kwargs, "foreach": True}
    _, sgd_kwargs = get_optimizer_cls_and_kwargs(Args(optim="sgd", learning_rate=0.5))
    assert sgd_kwargs == {"lr": 0.5}  # no Adam settings leak into other optimizers


def test_names_accept_enums_and_legacy_adafactor_flag() -> None:
    class OptimizerNames(str, Enum):
        SGD = "sgd"

    assert get_optimizer_cls_and_kwargs(Args(optim=OptimizerNames.SGD))[0] is torch.optim.SGD
    training_args = pytest.importorskip("transformers.training_args")
    assert (
        get_optimizer_cls_and_kwargs(Args(optim=training_args.OptimizerNames.ADAGRAD))[0]
        is torch.optim.Adagrad
    )
    legacy = Args(optim="sgd")
    legacy.adafactor = True
    cls, kwargs = get_optimizer_cls_and_kwargs(legacy)
    assert cls.__name__ == "Adafactor" and kwargs["lr"] == legacy.learning_rate


def test_unknown_optimizer_lists_the_choices() -> None:
    with pytest.raises(ValueError, match="optim: unknown optimizer 'adamw_quantum'") as info:
        get_optimizer_cls_and_kwargs(Args(optim="adamw_quantum"))
    for name in OPTIMIZER_NAMES:
        assert repr(name) in str(info.value)


def test_parse_optim_args_types() -> None:
    parsed = parse_optim_args(
        " momentum=0.9, nesterov=True,dampening=0 ,centered=false,betas=(0.9, 0.95),name=abc,x=None,eps=1e-6"
    )
    assert parsed == {
        "momentum": 0.9,
        "nesterov": True,
        "dampening": 0,
        "centered": False,
        "betas": (0.9, 0.95),
        "name": "abc",
        "x": None,
        "eps": 1e-6,
    }
    assert isinstance(parsed["dampening"], int) and isinstance(parsed["momentum"], float)
    assert parse_optim_args(None) == parse_optim_args("") == {}
    assert parse_optim_args({"momentum": "0.5", "nesterov": True}) == {"momentum": 0.5, "nesterov": True}
    assert parse_optim_args("momentum=0.9,") == {"momentum": 0.9}


@pytest.mark.parametrize("bad", ["momentum", "momentum=", "=0.9", "a=1,b"])
def test_parse_optim_args_rejects_malformed_items(bad: str) -> None:
    with pytest.raises(ValueError, match="optim_args: expected comma-separated key=value pairs"):
        parse_optim_args(bad)


def test_parse_optim_args_rejects_duplicates() -> None:
    with pytest.raises(ValueError, match="'momentum' is given twice"):
        parse_optim_args("momentum=0.9,momentum=0.8")


def test_optim_args_reach_the_optimizer() -> None:
    args = Args(optim="sgd", learning_rate=0.1, optim_args="momentum=0.9,nesterov=true")
    optimizer = create_optimizer(nn.Linear(2, 2), args)
    assert optimizer.defaults["momentum"] == 0.9 and optimizer.defaults["nesterov"] is True
    # they override the values taken from the other arguments
    _, kwargs = get_optimizer_cls_and_kwargs(Args(optim_args="eps=1e-5,betas=(0.5,0.6),amsgrad=True"))
    assert kwargs["eps"] == 1e-5 and kwargs["betas"] == (0.5, 0.6) and kwargs["amsgrad"] is True


def test_optim_args_unknown_key_names_the_optimizer() -> None:
    with pytest.raises(
        ValueError, match=r"optim_args \['centred'\] not accepted by RMSprop \(optim='rmsprop'\).*centered"
    ):
        get_optimizer_cls_and_kwargs(Args(optim="rmsprop", optim_args="centred=true"))
    with pytest.raises(ValueError, match=r"optim_args \['momentum'\] not accepted by AdamW"):
        get_optimizer_cls_and_kwargs(Args(optim="adamw_torch", optim_args="momentum=0.9"))


def test_optim_args_weight_decay_conflicting_with_weight_decay_is_an_error() -> None:
    with pytest.raises(
        ValueError, match=r"optim_args sets weight_decay=0.5 but weight decay comes from weight_decay \(0.1\)"
    ):
        create_optimizer(nn.Linear(2, 2), Args(optim="sgd", weight_decay=0.1, optim_args="weight_decay=0.5"))
    create_optimizer(nn.Linear(2, 2), Args(optim="sgd", weight_decay=0.1, optim_args="weight_decay=0.1"))


def test_fused_is_chosen_on_cpu_where_torch_has_it() -> None:
    model = nn.Linear(4, 4)
    _, kwargs = get_optimizer_cls_and_kwargs(Args(optim="adamw_torch_fused"), model)
    if "cpu" in optim._fused_devices():
        assert kwargs.get("fused") is True and "foreach" not in kwargs
        optimizer = create_optimizer(model, Args(optim="adamw_torch_fused"))
        assert optimizer.defaults["fused"] is True
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
    else:
        assert "fused" not in kwargs


def test_fused_falls_back_to_foreach_then_to_default(monkeypatch) -> None:
    model = nn.Linear(4, 4)
    monkeypatch.setattr(optim, "_fused_devices", lambda: {"cuda"})
    monkeypatch.setattr(optim, "_foreach_devices", lambda: {"cuda", "cpu"})
    assert get_optimizer_cls_and_kwargs(Args(optim="adamw_torch_fused"), model)[1].get("foreach") is True
    monkeypatch.setattr(optim, "_foreach_devices", lambda: {"cuda"})
    _, kwargs = get_optimizer_cls_and_kwargs(Args(optim="adamw_torch_fused"), model)
    assert "fused" not in kwargs and "foreach" not in kwargs


def test_fused_without_a_model_depends_on_torch_support(monkeypatch) -> None:
    monkeypatch.setattr(optim, "_fused_devices", lambda: {"cuda", "cpu", "mps", "xpu"})
    assert get_optimizer_cls_and_kwargs(Args(optim="adamw_torch_fused"))[1].get("fused") is True
    monkeypatch.setattr(optim, "_fused_devices", lambda: {"cuda"})
    assert "fused" not in get_optimizer_cls_and_kwargs(Args(optim="adamw_torch_fused"))[1]


def test_fused_is_not_chosen_for_unsupported_params() -> None:
    complex_model = nn.Linear(2, 2, dtype=torch.complex64)  # fused AdamW needs real floating point
    _, kwargs = get_optimizer_cls_and_kwargs(Args(optim="adamw_torch_fused"), complex_model)
    assert "fused" not in kwargs
    create_optimizer(complex_model, Args(optim="adamw_torch_fused")).step()
    meta_model = nn.Linear(2, 2, device="meta")
    assert "fused" not in get_optimizer_cls_and_kwargs(Args(optim="adamw_torch_fused"), meta_model)[1]


def test_explicit_kernel_choice_in_optim_args_wins() -> None:
    _, kwargs = get_optimizer_cls_and_kwargs(
        Args(optim="adamw_torch_fused", optim_args="foreach=False"), nn.Linear(2, 2)
    )
    assert kwargs["foreach"] is False and "fused" not in kwargs


def _adamw_run(steps: int, state: dict | None = None, **kernel: Any) -> tuple[list[torch.Tensor], dict]:
    torch.manual_seed(0)
    params = [nn.Parameter(torch.randn(67, 33)), nn.Parameter(torch.randn(301))]
    optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, **kernel)
    generator = torch.Generator().manual_seed(1)
    done = 0
    if state is not None:
        for p, saved in zip(params, state["params"]):
            p.data.copy_(saved)
        optimizer.load_state_dict(state["optimizer"])
        done = state["done"]
        generator.set_state(state["generator"])
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator)
        optimizer.step()
        done += 1
    snapshot = {
        "params": [p.detach().clone() for p in params],
        "optimizer": optimizer.state_dict(),
        "done": done,
        "generator": generator.get_state(),
    }
    return snapshot["params"], snapshot


@pytest.mark.skipif("cpu" not in optim._fused_devices(), reason="this torch has no fused AdamW on CPU")
def test_fused_cpu_adamw_is_close_to_the_for_loop_and_resumes_exactly(tmp_path) -> None:
    loop, _ = _adamw_run(20, foreach=False)
    foreach, _ = _adamw_run(20, foreach=True)
    fused, _ = _adamw_run(20, fused=True)
    assert all(torch.equal(a, b) for a, b in zip(loop, foreach))
    # fused is not bit-identical to the for-loop on CPU (see the optim module docstring), only close
    for a, b in zip(loop, fused):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    # but it is deterministic, and a resume through torch.save / weights_only load is exact
    assert all(torch.equal(a, b) for a, b in zip(fused, _adamw_run(20, fused=True)[0]))
    _, halfway = _adamw_run(8, fused=True)
    torch.save(halfway, tmp_path / "state.pt")
    resumed, _ = _adamw_run(12, torch.load(tmp_path / "state.pt", weights_only=True), fused=True)
    assert all(torch.equal(a, b) for a, b in zip(fused, resumed))


def test_adafactor_takes_decay_groups_and_optim_args() -> None:
    from trainwright.optim.adafactor import adafactor_class

    model = nn.Linear(4, 3)
    optimizer = create_optimizer(model, Args(optim="adafactor", learning_rate=1e-2, weight_decay=0.1))
    assert isinstance(optimizer, adafactor_class())
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    before = model.weight.detach().clone()
    model(torch.randn(5, 4)).pow(2).sum().backward()
    optimizer.step()
    assert not torch.equal(before, model.weight)
    _, kwargs = get_optimizer_cls_and_kwargs(
        Args(optim="adafactor", optim_args="beta1=0.9,clip_threshold=2.0")
    )
    assert kwargs == {
        "lr": 5e-5,
        "scale_parameter": False,
        "relative_step": False,
        "beta1": 0.9,
        "clip_threshold": 2.0,
    }


def test_names_agree_with_the_optimizer_names_enum() -> None:
    from trainwright.core.enums import OptimizerNames

    assert set(OptimizerNames.values()) == set(OPTIMIZER_NAMES)
    cls, kwargs = get_optimizer_cls_and_kwargs(Args(optim=OptimizerNames.ADAMW_TORCH_FOREACH))
    assert cls is torch.optim.AdamW and kwargs["foreach"] is True
