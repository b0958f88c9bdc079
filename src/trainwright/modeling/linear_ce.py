"""Linear + cross-entropy in chunks of tokens: an LM head's loss and gradients without its logits.

``linear_cross_entropy(hidden, weight, bias, targets)`` equals
``cross_entropy(hidden @ weight.T + bias, targets, ignore_index=-100, reduction="sum") / N`` (N:
``num_items_in_batch``, else the number of targets), with the same optional label smoothing as
trainwright's ``LabelSmoother``. The ``tokens x vocabulary`` logits are never held whole: the tokens
are cut into chunks of at most ``chunk_size`` rows and each chunk's logits live only while its loss
and its gradients are computed.

The gradients are computed in the forward pass, chunk by chunk, while the chunk's logits are at
hand (the gradient w.r.t. the hidden states, the weight and the bias; the backward pass only scales
them by the incoming gradient). That makes the fused loss three matrix products per chunk, as many as
the unfused logits + loss + backward, where recomputing the logits in the backward would cost a
fourth. Under autocast the products run in the autocast dtype and everything after them (log-sum-exp,
softmax, the loss) in float32, as transformers' loss does with ``logits.float()``.
"""

from __future__ import annotations

from typing import Any

import torch

IGNORE_INDEX = -100

# Logits per chunk: as many as the hidden states hold (the loss's temporaries then stay the size of
# the hidden states, like Liger's kernel), at least 2**23 (32 MiB in float32: few enough chunks that
# the passes over the weight's gradient and the kernel launches stay a small part of a step) and at
# most 2**26 (256 MiB).
MIN_CHUNK_ELEMENTS, MAX_CHUNK_ELEMENTS = 2**23, 2**26


def default_chunk_size(vocab_size: int, rows: int, hidden_size: int) -> int:
    """Tokens per chunk: about the hidden states' number of elements in logits, within the bounds."""
    elements = min(max(rows * hidden_size, MIN_CHUNK_ELEMENTS), MAX_CHUNK_ELEMENTS)
    return max(1, elements // max(vocab_size, 1))


def _compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The dtype the head's matrix products run in: autocast's when it is on, else the input's."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return hidden.dtype


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        denominator: torch.Tensor,
        label_smoothing: float,
        chunk_size: int,
        compute_dtype: torch.dtype,
        grads: tuple[bool, bool, bool],
    ) -> torch.Tensor:
        want_hidden, want_weight, want_bias = grads
        rows, vocab = hidden.shape[0], weight.shape[0]
        w = weight.to(compute_dtype)
        b = bias.to(compute_dtype) if bias is not None else None
        denominator = denominator.to(torch.promote_types(compute_dtype, torch.float32))
        scale = torch.where(denominator > 0, 1.0 / denominator, torch.zeros_like(denominator))
        any_grad = want_hidden or want_weight or want_bias
        exact = torch.promote_types(compute_dtype, torch.float32)  # the loss's dtype: float32 or float64
        total = torch.zeros((), dtype=exact, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=exact, device=weight.device) if want_weight else None
        grad_bias = torch.zeros(vocab, dtype=exact, device=weight.device) if want_bias else None
        eps = label_smoothing
        for start in range(0, rows, chunk_size):
            h = hidden[start : start + chunk_size].to(compute_dtype)
            t = targets[start : start + chunk_size]
            logits = (torch.mm(h, w.t()) if b is None else torch.addmm(b, h, w.t())).to(exact)
            valid = t != IGNORE_INDEX
            safe = torch.where(valid, t, 0).unsqueeze(1)
            lse = torch.logsumexp(logits, dim=1)
            row_loss = lse - logits.gather(1, safe).squeeze(1)
            if eps:
                row_loss = (1.0 - eps) * row_loss + eps * (lse - logits.mean(dim=1))
            total += torch.where(valid, row_loss, 0.0).sum()
            if not any_grad:
                continue
            # d loss / d logits: softmax - (1 - eps) one-hot - eps / V, per valid row, times 1/N
            probs = logits.sub_(lse.unsqueeze(1)).exp_()
            del logits
            if eps:
                probs.sub_(eps / vocab)
            probs.scatter_add_(1, safe, torch.full_like(safe, eps - 1.0, dtype=probs.dtype))
            probs.mul_((valid.to(probs.dtype) * scale).unsqueeze(1))
            g = probs.to(compute_dtype)
            if grad_hidden is not None:
                grad_hidden[start : start + chunk_size] = torch.mm(g, w)
            if grad_weight is not None:
                if compute_dtype == exact:
                    grad_weight.addmm_(g.t(), h)
                else:
                    grad_weight += torch.mm(g.t(), h)
            if grad_bias is not None:
                grad_bias += probs.sum(dim=0)
            del probs, g
        ctx.grads = (
            grad_hidden,
            grad_weight.to(weight.dtype) if grad_weight is not None else None,
            grad_bias.to(bias.dtype) if grad_bias is not None and bias is not None else None,
        )
        return total / denominator

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple:  # type: ignore[override]
        grad_hidden, grad_weight, grad_bias = ctx.grads
        ctx.grads = None
        out = []
        for grad in (grad_hidden, grad_weight, grad_bias):
            out.append(grad.mul_(grad_output.to(grad.dtype)) if grad is not None else None)
        return (*out, None, None, None, None, None, None)


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    *,
    num_items_in_batch: torch.Tensor | int | None = None,
    label_smoothing: float = 0.0,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Cross-entropy of ``hidden @ weight.T + bias`` against ``targets`` (-100: ignored), summed and
    divided by ``num_items_in_batch`` (else by the number of targets), without the logits tensor.

    ``hidden`` is ``(..., H)``, ``targets`` the matching ``(...)``, ``weight`` ``(V, H)``; targets are
    used as given (shift them first for next-token prediction). ``label_smoothing`` mixes in the mean
    over the vocabulary as ``LabelSmoother`` does.
    """
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"linear_cross_entropy: label_smoothing must be in [0, 1), got {label_smoothing!r}.")
    size = hidden.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != size:
        raise ValueError(
            f"linear_cross_entropy: weight of shape {tuple(weight.shape)} does not take hidden states of "
            f"width {size}."
        )
    flat = hidden.reshape(-1, size)
    flat_targets = targets.reshape(-1).to(flat.device)
    if flat_targets.shape[0] != flat.shape[0]:
        raise ValueError(
            f"linear_cross_entropy: {flat.shape[0]} hidden states but {flat_targets.shape[0]} targets."
        )
    if num_items_in_batch is None:
        denominator = (flat_targets != IGNORE_INDEX).sum().float()
    else:
        denominator = torch.as_tensor(num_items_in_batch, device=flat.device).float()
    chunk = chunk_size or default_chunk_size(weight.shape[0], flat.shape[0], size)
    grad_on = torch.is_grad_enabled()
    grads = (
        grad_on and flat.requires_grad,
        grad_on and weight.requires_grad,
        grad_on and bias is not None and bias.requires_grad,
    )
    try:
        return _ChunkedLinearCrossEntropy.apply(
            flat,
            weight,
            bias,
            flat_targets,
            denominator,
            float(label_smoothing),
            chunk,
            _compute_dtype(flat),
            grads,
        )
    except (IndexError, RuntimeError) as exc:  # found only on failure: no check on the hot path
        named = _labels_outside(flat_targets, weight.shape[0])
        if named is None:
            raise
        raise named from exc


def _labels_outside(targets: torch.Tensor, vocab: int) -> ValueError | None:
    """The error naming the labels outside the vocabulary, where some are (else None)."""
    outside = targets[(targets != IGNORE_INDEX) & ((targets < 0) | (targets >= vocab))]
    if not outside.numel():
        return None
    values = outside.unique()[:5].tolist()
    return ValueError(
        f"fused_linear_cross_entropy: the labels hold {values}, outside the model's vocabulary of {vocab} "
        f"ids (0 to {vocab - 1}; -100 is ignored). Fix the labels (or the tokenizer's vocabulary size)."
    )


__all__ = ["default_chunk_size", "linear_cross_entropy"]
