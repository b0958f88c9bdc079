"""Attention with dropout that keeps none of its ``queries x keys`` tensors for the backward.

PyTorch's fused CPU attention (``scaled_dot_product_attention``'s flash kernel) takes no dropout, so
a training forward with attention dropout on the CPU takes SDPA's math path, which keeps the
scores' softmax, the dropout noise and the dropped probabilities for its backward: three
``batch x heads x queries x keys`` tensors per layer (GPT-2, 6 layers, batch 8 x 512: 1.7 GB of
the 4.9 GB its forward keeps). :class:`DropoutAttention` computes the same attention in blocks of
query rows and keeps the inputs, each row's log-sum-exp and the dropout's kept positions as
booleans (a quarter of one fp32 tensor); its backward recomputes the probabilities block by block.
The noise is drawn exactly as the math path draws it (one ``bernoulli_`` over the whole
``batch x heads x queries x keys`` shape from the default generator), so the same RNG state gives
the same dropout, and a run keeps its RNG stream.

:func:`attention_forward` is a transformers attention function (``AttentionInterface``) that takes
this path where SDPA would take its math path for dropout on the CPU, and is transformers' own
``sdpa_attention_forward`` everywhere else.
"""

from __future__ import annotations

from typing import Any

import torch

# query rows per block: about this many ``heads x rows x keys`` elements per block tensor
_BLOCK_ELEMENTS = 1 << 23


def _mask_rows(mask: torch.Tensor | None, start: int, stop: int, keys: int) -> torch.Tensor | None:
    if mask is None:
        return None
    rows = mask if mask.shape[-2] == 1 else mask[..., start:stop, :]
    return rows if rows.shape[-1] == 1 else rows[..., :keys]


class _Blocks:
    """The per-block recomputation shared by forward and backward."""

    def __init__(
        self, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, causal: bool, scale: float
    ):
        self.query, self.key, self.mask, self.causal, self.scale = query, key, mask, causal, scale
        batch, heads, rows, _ = query.shape
        self.compute = torch.promote_types(query.dtype, torch.float32)
        per_row = max(1, batch * heads * key.shape[2])
        self.rows = rows
        self.step = max(1, _BLOCK_ELEMENTS // per_row)

    def spans(self) -> list[tuple[int, int, int]]:
        """(first row, row after the last, keys seen): a causal block sees keys up to its last row."""
        keys = self.key.shape[2]
        return [
            (start, stop, min(keys, stop) if self.causal else keys)
            for start in range(0, self.rows, self.step)
            for stop in (min(start + self.step, self.rows),)
        ]

    def scores(self, start: int, stop: int, keys: int) -> torch.Tensor:
        q = self.query[:, :, start:stop].to(self.compute)
        k = self.key[:, :, :keys].to(self.compute)
        s = torch.matmul(q, k.transpose(-1, -2)).mul_(self.scale)
        if self.causal:  # upper-left aligned, as SDPA's is_causal
            row = torch.arange(start, stop, device=s.device)[:, None]
            s.masked_fill_(torch.arange(keys, device=s.device)[None, :] > row, float("-inf"))
        rows = _mask_rows(self.mask, start, stop, keys)
        if rows is not None:
            s = s.masked_fill(rows.logical_not(), float("-inf")) if rows.dtype == torch.bool else s + rows
        return s


class DropoutAttention(torch.autograd.Function):
    """``softmax(q k^T * scale + mask) -> dropout(p) -> @ v`` on ``(batch, heads, rows, dim)``
    tensors, keeping the kept-position booleans and each row's log-sum-exp instead of the
    probabilities. `mask` is None, boolean (True attends) or additive, broadcastable to
    ``(batch, heads, rows, keys)``; a row that attends nowhere gives zeros (as SDPA's math path)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        causal: bool,
        scale: float,
        p: float,
    ) -> torch.Tensor:
        with torch.autocast(query.device.type, enabled=False):  # fp32 inside, forward and backward alike
            blocks = _Blocks(query, key, mask, causal, scale)
            batch, heads, rows, _ = query.shape
            keep = torch.empty((batch, heads, rows, key.shape[2]), dtype=torch.bool, device=query.device)
            keep.bernoulli_(1.0 - p)
            out = torch.empty((*query.shape[:3], value.shape[-1]), dtype=blocks.compute, device=query.device)
            lse = torch.empty((batch, heads, rows, 1), dtype=blocks.compute, device=query.device)
            for start, stop, keys in blocks.spans():
                s = blocks.scores(start, stop, keys)
                top = torch.logsumexp(s, dim=-1, keepdim=True)
                top.masked_fill_(top == float("-inf"), 0.0)
                prob = s.sub_(top).exp_().mul_(keep[:, :, start:stop, :keys]).mul_(1.0 / (1.0 - p))
                out[:, :, start:stop] = torch.matmul(prob, value[:, :, :keys].to(blocks.compute))
                lse[:, :, start:stop] = top
            ctx.save_for_backward(query, key, value, mask, keep, lse)
            ctx.causal, ctx.scale, ctx.p = causal, scale, p
            return out.to(query.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        with torch.autocast(grad_out.device.type, enabled=False):
            query, key, value, mask, keep, lse = ctx.saved_tensors
            blocks = _Blocks(query, key, mask, ctx.causal, ctx.scale)
            c = blocks.compute
            v = value.to(c)
            grad_out = grad_out.to(c)
            dq = torch.zeros(query.shape, dtype=c, device=query.device)
            dk = torch.zeros(key.shape, dtype=c, device=key.device)
            dv = torch.zeros(value.shape, dtype=c, device=value.device)
            inv = 1.0 / (1.0 - ctx.p)
            for start, stop, keys in blocks.spans():
                prob = blocks.scores(start, stop, keys).sub_(lse[:, :, start:stop]).exp_()
                kept = keep[:, :, start:stop, :keys]
                g = grad_out[:, :, start:stop]
                dropped = prob * kept * inv
                dv[:, :, :keys] += torch.matmul(dropped.transpose(-1, -2), g)
                del dropped
                dprob = torch.matmul(g, v[:, :, :keys].transpose(-1, -2)).mul_(kept).mul_(inv)
                ds = dprob.sub_((dprob * prob).sum(dim=-1, keepdim=True)).mul_(prob).mul_(ctx.scale)
                dq[:, :, start:stop] = torch.matmul(ds, key[:, :, :keys].to(c))
                dk[:, :, :keys] += torch.matmul(ds.transpose(-1, -2), query[:, :, start:stop].to(c))
            return dq.to(query.dtype), dk.to(key.dtype), dv.to(value.dtype), None, None, None, None


def takes_over(
    query: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float, kwargs: dict
) -> bool:
    """Whether :func:`attention_forward` computes this call itself: training with dropout on the
    CPU, eager, plain tensors, none of SDPA's extras (a position bias, a paged cache, softcapping)."""
    return (
        dropout > 0.0
        and query.device.type == "cpu"
        and torch.is_grad_enabled()
        and type(query) is torch.Tensor
        and not torch.compiler.is_compiling()
        and (attention_mask is None or not attention_mask.requires_grad)
        and kwargs.get("position_bias") is None
        and kwargs.get("cache") is None
        and kwargs.get("softcap") is None
        and not kwargs.get("output_attentions", False)
    )


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention function, with :class:`DropoutAttention` where SDPA would
    take its math path (dropout on the CPU). Same arguments and result as
    ``transformers.integrations.sdpa_attention.sdpa_attention_forward``."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    if not takes_over(query, attention_mask, dropout, kwargs):
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    rows = query.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(rows > 1 and attention_mask is None and causal)
    if causal and key.shape[2] > rows:  # as SDPA's path: the keys past the queries are masked anyway
        key, value = key[:, :, :rows], value[:, :, :rows]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = DropoutAttention.apply(query, key, value, attention_mask, causal, scale, float(dropout))
    return out.transpose(1, 2).contiguous(), None
