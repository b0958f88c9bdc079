"""How one run weights its micro-batches' losses, so that an accumulated step (and one over several
processes) gives the full batch's update: token-weighted, not a mean of per-micro-batch means.

What does not change within a run is decided once, when the run starts: whether the step's items
are summed over processes (and the factor DDP / FSDP average over), whether a labelled loss already
divides by the step's items (the model takes ``num_items_in_batch``, or ``compute_loss_func`` or
the label smoother does), which labels count (shifted for a causal LM). A ``**kwargs`` forward is
measured once on the first step with targets (``probe``), then decided like the rest. Each step only
counts its items; each micro-batch only scales its loss.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import torch

from trainwright.modeling.loss import LossFacts, has_no_targets, items_in_batch, loss_divides_by_items


def _never(inputs: Any) -> bool:
    return False


def _always(inputs: Any) -> bool:
    return True


def _has_labels(inputs: Any) -> bool:
    return isinstance(inputs, Mapping) and "labels" in inputs


class StepWeights:
    """The weighting of one run's steps (built per run: a retry or a new `train()` builds another).

    facts: the model's loss facts (`LossFacts`); custom_loss: labels go to `compute_loss_func` or
    the label smoother, which divide by the step's items; scaled_for_ga: a Trainer subclass's own
    `loss_is_scaled_for_ga` (None: not said); runtime: the processes (`all_reduce`, `device`,
    `gradient_average_size`); across: sum the items over processes (`average_tokens_across_devices`
    over several); on_empty: told of a step with no target at all (the run's loss log: it holds
    nothing of the weights or the Trainer, so no cycle). The probe that measures a `**kwargs`
    forward (it clears `facts.probe` once settled) is the Trainer's, handed in at `count`.
    """

    def __init__(
        self,
        facts: LossFacts,
        *,
        custom_loss: bool,
        scaled_for_ga: bool | None,
        runtime: Any,
        across: bool,
        on_empty: Callable[[], None] | None = None,
    ) -> None:
        self.label_shift = facts.label_shift
        self._facts, self._custom, self._declared = facts, custom_loss, scaled_for_ga
        self._runtime = runtime if across else None
        self._factor = runtime.gradient_average_size if across else None  # DDP/FSDP average over them
        self._probing = facts.probe
        self._on_empty = on_empty
        self._normalised = self._decide()

    def _decide(self) -> Callable[[Any], bool]:
        """Whether a micro-batch's loss is already ``sum / N`` (N: the step's items), as a test of
        its inputs (the model divides only when it gets labels)."""
        if self._declared is not None:  # the subclass's word, for every micro-batch
            return _always if self._declared else _never
        divides = loss_divides_by_items(
            accepts_loss_kwargs=self._facts.accepts_loss_kwargs, custom_loss=self._custom
        )
        return _has_labels if divides else _never

    def _empty(self) -> torch.Tensor:
        if self._on_empty is not None:
            self._on_empty()
        return torch.zeros((), dtype=torch.long)

    def count(self, micro_batches: list, probe: Callable[[list, torch.Tensor], None]) -> torch.Tensor | None:
        """Items (label targets, else samples) in a step's micro-batches over every process; None
        when the step is one micro-batch on one process that has targets (its mean needs no weight).
        A step with no target anywhere is a CPU 0 (and told); on an accelerator the total is not
        read back (no sync), so it is clamped to 1: an empty step weighs 0, not 0/0. `probe`
        measures a `**kwargs` forward on a step while that is not settled."""
        shift = self.label_shift
        if len(micro_batches) == 1 and self._runtime is None:
            return self._empty() if has_no_targets(micro_batches[0], shift) else None
        # a tensor: micro_batches is not empty (sum's type also allows its start, 0)
        total = cast(torch.Tensor, sum(items_in_batch(b, shift) for b in micro_batches))
        if self._runtime is not None:
            total = self._runtime.all_reduce(total.to(self._runtime.device), data_only=True)
        if total.device.type != "cpu":
            total = total.clamp(min=1)
        elif not total:
            return self._empty()
        if self._probing:
            self._settle(micro_batches, total, probe)
        return total

    def _settle(
        self, micro_batches: list, total: torch.Tensor, probe: Callable[[list, torch.Tensor], None]
    ) -> None:
        """Measure a `**kwargs` forward on this step (it may wait for a step with targets)."""
        probe(micro_batches, total)
        if not self._facts.probe:
            self._probing = False
            self._normalised = self._decide()

    def share(self, inputs: Any, num_items: torch.Tensor | None) -> torch.Tensor | None:
        """This micro-batch's items (a CPU count, before the batch moves: no sync), or None when its
        loss needs no weight: the step is one micro-batch, or the loss is ``sum / N`` already."""
        if num_items is None or self._normalised(inputs):
            return None
        return items_in_batch(inputs, self.label_shift)

    def scale(
        self, loss: torch.Tensor, share: torch.Tensor | None, num_items: torch.Tensor | None
    ) -> torch.Tensor:
        """A micro-batch's mean loss as its part of the step's: weighted by ``share / num_items``,
        times the processes whose gradients DDP / FSDP average (`Runtime.gradient_average_size`).
        A loss that is ``sum / N`` already (no share) is left as `compute_loss` returned it: as
        upstream, the `compute_loss` that divides by N multiplies by the processes itself
        (`across_processes`; TRL's SFT and GRPO trainers do it in their own)."""
        if share is None:
            return loss
        if share.device.type == "cpu" and not share:
            # no target in this micro-batch: a mean loss is 0/0 = NaN, and its weight is 0; its
            # gradient is zero either way, so it must not turn the step's logged loss into NaN
            loss = torch.nan_to_num(loss, nan=0.0)
        loss = loss * (share.to(loss.device) / cast(torch.Tensor, num_items).to(loss.device))
        return self.across_processes(loss)

    def across_processes(self, loss: torch.Tensor) -> torch.Tensor:
        """A loss over the step's items on every process (``sum / N``), times the processes whose
        gradients DDP / FSDP average (with `average_tokens_across_devices` over several), so that
        their mean is the step's gradient."""
        return loss * self._factor if self._factor is not None else loss
