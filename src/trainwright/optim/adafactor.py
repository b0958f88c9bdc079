"""Adafactor with transformers' update rule (`transformers.optimization.Adafactor`).

`optim="adafactor"` is transformers' Adafactor with `scale_parameter=False, relative_step=False`
(T5 fine-tuning recipes rely on its trajectory; `torch.optim.Adafactor` is another algorithm).
transformers is an optional dependency: where it is installed, its class is used (so
`get_optimizer_cls_and_kwargs` returns upstream's class); otherwise `Adafactor` below, which
computes the same update in the same order of operations, so the weights are equal bit for bit
(`tests/optim/test_optim_adafactor.py` steps both side by side).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _rms(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.norm(2) / (tensor.numel() ** 0.5)


class Adafactor(torch.optim.Optimizer):
    """Adafactor (Shazeer & Stern, 2018) as transformers implements it, for runs without transformers.

    Arguments and defaults are transformers': `lr` (None with `relative_step=True`), `eps=(1e-30,
    1e-3)` (squared-gradient and parameter-scale floors), `clip_threshold=1.0` (RMS cap of the
    update), `decay_rate=-0.8`, `beta1=None` (no first moment), `weight_decay=0.0`,
    `scale_parameter=True`, `relative_step=True`, `warmup_init=False`. Parameters with two or more
    dimensions keep factored row/column second moments. State per parameter: `step` (int), `RMS`,
    `exp_avg_sq` or `exp_avg_sq_row`/`exp_avg_sq_col`, and `exp_avg` with `beta1`.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | None = None,
        eps: tuple[float, float] = (1e-30, 1e-3),
        clip_threshold: float = 1.0,
        decay_rate: float = -0.8,
        beta1: float | None = None,
        weight_decay: float = 0.0,
        scale_parameter: bool = True,
        relative_step: bool = True,
        warmup_init: bool = False,
    ) -> None:
        if lr is not None and relative_step:
            raise ValueError("Adafactor: cannot combine a manual `lr` with `relative_step=True`")
        if warmup_init and not relative_step:
            raise ValueError("Adafactor: `warmup_init=True` requires `relative_step=True`")
        defaults = dict(
            lr=lr,
            eps=eps,
            clip_threshold=clip_threshold,
            decay_rate=decay_rate,
            beta1=beta1,
            weight_decay=weight_decay,
            scale_parameter=scale_parameter,
            relative_step=relative_step,
            warmup_init=warmup_init,
        )
        super().__init__(params, defaults)

    @staticmethod
    def _get_lr(group: dict[str, Any], state: dict[str, Any]) -> Any:
        """The step size: the external lr, or 1/sqrt(step) capped; times max(eps[1], RMS) when scaling."""
        step_size = group["lr"]
        if group["relative_step"]:
            cap = 1e-6 * state["step"] if group["warmup_init"] else 1e-2
            step_size = min(cap, 1.0 / math.sqrt(state["step"]))
        if not group["scale_parameter"]:
            return 1.0 * step_size
        return max(group["eps"][1], state["RMS"]) * step_size

    @staticmethod
    def _init_state(state: dict[str, Any], grad: torch.Tensor, factored: bool, first_moment: bool) -> None:
        shape = grad.shape
        state["step"] = 0
        if first_moment:
            state["exp_avg"] = torch.zeros_like(grad)
        if factored:
            state["exp_avg_sq_row"] = torch.zeros(shape[:-1]).to(grad)
            state["exp_avg_sq_col"] = torch.zeros(shape[:-2] + shape[-1:]).to(grad)
        else:
            state["exp_avg_sq"] = torch.zeros_like(grad)
        state["RMS"] = 0

    @staticmethod
    def _second_moment_update(
        state: dict[str, Any], grad: torch.Tensor, beta2t: float, eps0: float, factored: bool
    ) -> torch.Tensor:
        """grad scaled by the inverse root of the running mean of grad² (factored: its row x column estimate)."""
        squared = grad**2 + eps0
        if not factored:
            state["exp_avg_sq"].mul_(beta2t).add_(squared, alpha=1.0 - beta2t)
            return state["exp_avg_sq"].rsqrt().mul_(grad)
        row, col = state["exp_avg_sq_row"], state["exp_avg_sq_col"]
        row.mul_(beta2t).add_(squared.mean(dim=-1), alpha=1.0 - beta2t)
        col.mul_(beta2t).add_(squared.mean(dim=-2), alpha=1.0 - beta2t)
        row_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
        col_factor = col.unsqueeze(-2).rsqrt()
        return torch.mul(row_factor, col_factor).mul_(grad)

    def _step_param(self, param: torch.Tensor, group: dict[str, Any]) -> None:
        assert param.grad is not None
        grad = param.grad.float() if param.grad.dtype in _LOW_PRECISION else param.grad
        if grad.is_sparse:
            raise RuntimeError("Adafactor does not support sparse gradients")
        factored, first_moment = grad.dim() >= 2, group["beta1"] is not None
        state = self.state[param]
        if not state:
            self._init_state(state, grad, factored, first_moment)
        else:  # moved with the parameter (a state loaded on another device or dtype)
            for key in ("exp_avg", "exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq"):
                if key in state:
                    state[key] = state[key].to(grad)
        work = param.float() if param.dtype in _LOW_PRECISION else param
        state["step"] += 1
        state["RMS"] = _rms(work)
        lr = self._get_lr(group, state)
        beta2t = 1.0 - math.pow(state["step"], group["decay_rate"])
        update = self._second_moment_update(state, grad, beta2t, group["eps"][0], factored)
        update.div_((_rms(update) / group["clip_threshold"]).clamp_(min=1.0))
        update.mul_(lr)
        if first_moment:
            state["exp_avg"].mul_(group["beta1"]).add_(update, alpha=1 - group["beta1"])
            update = state["exp_avg"]
        if group["weight_decay"] != 0:
            work.add_(work, alpha=-group["weight_decay"] * lr)
        work.add_(-update)
        if work is not param:
            param.copy_(work)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """One update of every parameter that has a gradient; returns the closure's loss if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._step_param(param, group)
        return loss


def adafactor_class() -> type[torch.optim.Optimizer]:
    """transformers' `Adafactor` where transformers is installed (upstream's class), else ours."""
    if importlib.util.find_spec("transformers") is not None:
        from transformers.optimization import Adafactor as UpstreamAdafactor

        return UpstreamAdafactor  # type: ignore[no-any-return]
    return Adafactor
