"""Batches fetched one ahead, as accelerate's `DataLoaderShard` fetches them: the one look-ahead of
trainwright's training loop, its evaluation loop and a loader of `trainer.accelerator.prepare`.

transformers' Trainer iterates every loader (training and evaluation) through accelerate's loader,
which fetches the next batch before it yields the current one, to know the last. A collator or a
dataset that draws from the global RNG (`DataCollatorForLanguageModeling`'s masks, an augmentation)
therefore draws batch k+1's numbers before the step that trains batch k, between that step's
dropout and the previous one's. `LookAhead` fetches in that order, so a run's random streams are a
transformers run's.

A checkpoint written between two steps has a batch in hand: fetched, its numbers drawn, not yet
trained. The data position counts consumed batches only, so a resume needs that batch again:

- **stored** (the common case, decided once per run at its first batch): the batch in hand is a
  mapping of names to tensors (a collator's dict, a `BatchEncoding`), so the checkpoint holds it
  itself as safetensors (`stored_state`), and the resumed epoch yields it first and starts
  its data one batch further: the sampler at the next batch's first sample, a loader without one
  skipping one more batch, an iterable dataset whose own state came back (taken after the fetch)
  where it is;
- **fetched again**: a batch that cannot be stored so (nested containers, strings, an object of the
  collator's own) makes the
  run capture the RNG state before each fetch instead (~55 us a batch; with an iterable dataset of
  its own state, that state too), which the checkpoint keeps (`fetched_from`) and a resume fetches
  the batch in hand from.

A resumed epoch's start (its iterator, the skipped batches, a batch fetched again) moves none of
the checkpoint's RNG state. The per-batch facts a loader reports about "the batch just yielded"
(`real_rows_in_batch` / `_in_step` of a prepared or dispatched loader) are of the batch its
consumer holds: `position(fetched)`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from trainwright.checkpoint.files import BATCH_IN_HAND_NAME, CheckpointError
from trainwright.checkpoint.rng import capture_rng_state, restore_rng_state
from trainwright.data.loaders import EpochSeededDataLoader, iterate_epoch, skip_iterable
from trainwright.modeling.loss import batch_size

logger = logging.getLogger(__name__)

END = object()  # nothing in hand: the epoch's batches are exhausted, or none is fetched yet
_NONE = object()  # no batch given to start with: the first one is fetched

_BATCH_ENCODING = "BatchEncoding"


class LookAhead:
    """Batches fetched one ahead (see the module docstring). `checkpointed`: a training run's, whose
    batch in hand a checkpoint keeps; else an evaluation's or a prepared loader's outside the loop."""

    # slots: the run reads and writes them per batch, and CPython specializes slot access
    __slots__ = (
        "in_hand",
        "live",
        "captures",
        "fetched_from",
        "dataset_before",
        "_dataset",
        "_resume",
        "_walking",
    )

    def __init__(self, checkpointed: bool = False) -> None:
        self.in_hand: Any = END  # fetched and not yet handed out
        self.live = False  # an iteration is under way (its consumer holds a batch)
        # whether each fetch captures the RNG state first: decided at a checkpointed run's first batch
        self.captures: bool | None = None if checkpointed else False
        self.fetched_from: dict[str, Any] | None = None  # the RNG state the batch in hand was fetched from
        self.dataset_before: Any = None  # an iterable dataset's own state then
        self._dataset: Any = None  # the training loader's dataset (its own state is captured too)
        self._resume: tuple[Any, dict[str, Any] | None] = (_NONE, None)  # a checkpoint's batch, or its RNG
        self._walking: object = None  # the iteration under way (an earlier one's end changes nothing)

    # -- iterating -----------------------------------------------------------------------------
    def over(self, start: Callable[[], tuple[Iterator[Any], Any]]) -> Iterator[Any]:
        """The batches of `start()` (an iterator and a first batch, or `_NONE`), called at the first
        batch asked for, as accelerate's loader starts its iterator then."""
        return self._walk(start)

    def _walk(self, start: Callable[[], tuple[Iterator[Any], Any]]) -> Iterator[Any]:
        self.live, self._walking = True, (token := object())
        try:
            batches, current = start()
            if current is _NONE:
                current = next(batches, END)
            if current is END:
                return
            if self.captures is None:  # once a run: a batch the checkpoint cannot hold is fetched again
                self.captures = not storable(current)
            if self.captures:
                yield from self._capturing(batches, current)
                return
            while current is not END:
                self.in_hand = following = next(batches, END)
                yield current
                current = following
        finally:
            if self._walking is token:
                self.live, self.in_hand = False, END

    def _capturing(self, batches: Iterator[Any], current: Any) -> Iterator[Any]:
        dataset = self._dataset
        has_state = callable(getattr(dataset, "state_dict", None)) and callable(
            getattr(dataset, "load_state_dict", None)
        )
        state_of = dataset.state_dict if has_state else None
        while current is not END:
            self.fetched_from = capture_rng_state()
            self.dataset_before = state_of() if state_of is not None else None
            self.in_hand = following = next(batches, END)
            yield current
            current = following

    def position(self, fetched: int) -> int:
        """The index (in its loader's iteration) of the batch the consumer holds, from the batches the
        loader has handed over; -1 once the iteration is over."""
        if not self.live:
            return -1
        return fetched - (1 if self.in_hand is END else 2)

    def forget_resume(self) -> None:
        """A checkpoint's batch in hand is not used: the resumed epoch's rest comes from elsewhere (a
        subclass's `get_resumed_dataloader`), its first batch fetched there."""
        self._resume = (_NONE, None)

    def drop(self) -> None:
        """The epoch is left: what is in hand is not the next batch of the position any more."""
        self.in_hand, self.fetched_from, self.dataset_before = END, None, None

    # -- a training run's epochs ---------------------------------------------------------------
    def epoch(
        self, loader: Any, batches_done: int, samples_done: int, geometry: Any, restored: bool
    ) -> Iterator[Any]:
        """The epoch's batches after the `batches_done` (`samples_done` samples) a resumed run already
        consumed, the checkpoint's batch in hand first; `restored`: an iterable dataset's own state
        came back (it continues where the checkpoint was taken)."""
        (hand, rng), self._resume = self._resume, (_NONE, None)
        self._dataset = getattr(loader, "dataset", None)

        def start() -> tuple[Iterator[Any], Any]:
            if not (batches_done or hand is not _NONE or rng is not None):
                return iterate_epoch(loader, True, self), _NONE
            return self._continue(loader, hand, rng, batches_done, samples_done, geometry, restored)

        return self._walk(start)

    def _continue(
        self, loader: Any, hand: Any, rng: Any, done: int, samples: int, geometry: Any, restored: bool
    ) -> tuple[Iterator[Any], Any]:
        """A resumed epoch's iterator and first batch: the stored batch in hand (the data then one
        batch further), or that batch fetched again from its RNG state; none of it moves the
        checkpoint's RNG state (the loader's start, the batches skipped, the batch fetched again)."""
        _say_workers(loader)
        sampler: Any = getattr(loader, "sampler", None)
        ahead = 0 if hand is _NONE else 1
        if hand is not _NONE and callable(place := getattr(loader, "place", None)):
            hand = place(hand)  # a prepared loader's device
        saved = capture_rng_state()
        if hasattr(sampler, "set_start"):  # seen samples are skipped in the sampler, never loaded
            if ahead:
                samples += min(geometry[0], geometry[1] - samples) if geometry else batch_size(hand)
            sampler.set_start(samples)
            batches = iterate_epoch(loader, samples == 0, self)
        else:  # a restored iterable dataset continues after the batch in hand (or before it: `rng`)
            batches = skip_iterable(loader, 0 if restored else done + ahead, consumer=self)
        if rng is not None:
            restore_rng_state(rng)
            hand = next(batches, END)
        restore_rng_state(saved)
        return batches, hand

    def resume_with(self, batch: Any = _NONE, rng: dict[str, Any] | None = None) -> None:
        """A checkpoint's batch in hand (yielded first by the next epoch), or the RNG state to fetch
        it again from."""
        self._resume = (batch, rng)

    # -- what a checkpoint keeps ---------------------------------------------------------------
    def holds(self) -> bool:
        """Whether a batch is in hand, to be kept by a checkpoint written now."""
        return self.in_hand is not END

    def stored_in_hand(self) -> dict[str, Any]:
        """The checkpoint's file of the batch in hand (`stored_state`); an error where it cannot be
        stored, although the run's first batch could (then a resume could not be exact)."""
        state = stored_state(self.in_hand)
        if state is None:
            raise CheckpointError(
                f"The training batch fetched ahead of the next step is a {_kind(self.in_hand)} that a "
                "checkpoint cannot hold as safetensors (a mapping of names to contiguous tensors), "
                "although the run's first batch was one: give every batch the same kind (the collator's "
                "output), so that the checkpoint can keep the batch in hand and the resume be exact."
            )
        return state


def fetched_ahead(loader: Any) -> Iterator[Any]:
    """`loader`'s batches, each fetched one ahead, uncheckpointed: an evaluation's, a prepared
    loader's iterated outside the training loop."""
    ahead = LookAhead()
    return ahead.over(lambda: (iterate_epoch(loader, True, ahead), _NONE))


def storable(batch: Any) -> bool:
    """Whether a checkpoint can hold `batch` as safetensors (`stored_state`): a mapping (a dict, a
    `BatchEncoding`) of names to contiguous tensors."""
    if not (type(batch) is dict or (type(batch).__name__ == _BATCH_ENCODING and isinstance(batch, Mapping))):
        return False
    return all(
        type(k) is str and isinstance(v, torch.Tensor) and v.is_contiguous() and not v.is_sparse
        for k, v in batch.items()
    )


def stored_state(batch: Any) -> dict[str, Any] | None:
    """What a checkpoint holds of `batch` (None where it cannot: `storable`): {"tensors": copies of its
    tensors on the CPU (the step trains the batch on while an async save writes them), "metadata":
    {"layout": JSON of its keys' order and whether it was a `BatchEncoding` (rebuilt as one)}}."""
    if not storable(batch):
        return None
    tensors = {k: v.detach().to("cpu", copy=True) for k, v in batch.items()}
    layout = {"mapping": _BATCH_ENCODING if type(batch) is not dict else "dict", "keys": list(batch)}
    # one metadata entry: safetensors writes several in a hash map's order, which varies between saves
    return {"tensors": tensors, "metadata": {"layout": json.dumps(layout, sort_keys=True)}}


def batch_from_state(state: Mapping[str, Any]) -> Any:
    """The batch `stored_state` kept, its keys in their order."""
    tensors = state["tensors"]
    try:
        layout = json.loads(state["metadata"]["layout"])
        batch = {k: tensors[k] for k in layout["keys"]}
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(
            f"The checkpoint's batch in hand ({BATCH_IN_HAND_NAME}) does not describe its tensors (metadata "
            f"'layout': {exc!r}); delete the file to fetch that batch again (knowingly not bit-exact)"
        ) from exc
    if layout.get("mapping") == _BATCH_ENCODING:
        try:
            from transformers import BatchEncoding
        except ImportError:  # written where transformers was installed: a dict of the same keys
            return batch
        return BatchEncoding(batch)
    return batch


def _kind(obj: Any) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


def _say_workers(loader: Any) -> None:
    """A resumed epoch of a loader whose workers are seeded when its iterator starts (not trainwright's,
    seeded per batch) cannot give the interrupted run's random numbers: said, not hidden."""
    workers = getattr(loader, "num_workers", 0)
    if workers and not isinstance(getattr(loader, "loader", loader), EpochSeededDataLoader):
        logger.warning(
            "Resuming mid-epoch with a data loader (%s) that loads in %d worker(s), seeded when an epoch's "
            "iterator starts: their random numbers (augmentations, a collator's draws) are not the "
            "interrupted run's, so the resumed run is not bit-exact.",
            type(loader).__name__,
            workers,
        )
