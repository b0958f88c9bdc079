"""Data loaders built for exact resume: randomness inside data loading is a function of the
batch's place (see :class:`EpochSeededDataLoader`), and data without a sampler resumes through its
own state or by skipping batches.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import random
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from trainwright.core.preemption import shield_worker
from trainwright.data.kinds import is_iterable_dataset


def _derive_seed(*parts: int | str) -> int:
    """A 63-bit seed mixed from ``parts`` (stable across processes, platforms and Python runs)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def _seed_process_rngs(seed: int) -> None:
    """Seed the torch, numpy and random global RNGs of this (worker) process."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


class _SeededBatch(list):
    """A batch of indices that carries the RNG seed its worker must use to load it."""

    __slots__ = ("seed",)

    def __init__(self, indices: Iterable[int], seed: int) -> None:
        super().__init__(indices)
        self.seed = seed


class _Epochs:
    """A loader's epoch: `getter()` when given, else the sampler's `epoch`, else the last `set_epoch`
    value. Shared by the loader and its batch seeding, which reads it at iteration time."""

    __slots__ = ("getter", "sampler", "selected")

    def __init__(self, getter: Callable[[], int] | None, sampler: Any) -> None:
        self.getter, self.sampler, self.selected = getter, sampler, 0

    def __call__(self) -> int:
        if self.getter is not None:
            return int(self.getter())
        return int(getattr(self.sampler, "epoch", self.selected))


class _SeededBatches:
    """Wraps the loader's batch sampler: tags each batch with a seed from its place in the epoch.
    Built from the loader's values (its seed, rank and epoch source), not the loader: a
    persistent-worker loader holds its iterator, which holds this."""

    def __init__(self, batches: Any, epochs: _Epochs, seed: int, rank: int) -> None:
        self.batches, self.epochs, self.seed, self.rank = batches, epochs, seed, rank

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[_SeededBatch]:
        # Read at iteration time: persistent workers re-iterate this same object every epoch.
        epoch, sampler = self.epochs(), self.epochs.sampler
        position = int(getattr(sampler, "start", 0))
        rank = int(getattr(sampler, "rank", self.rank))
        for batch in self.batches:
            yield _SeededBatch(batch, _derive_seed("batch", self.seed, epoch, rank, position))
            position += len(batch)


def _install_batch_seeding(dataset: Any) -> None:
    """In a worker: make the fetch of every tagged batch start from the batch's own seed.

    torch's map-style fetcher calls ``dataset.__getitems__(indices)`` when the attribute exists;
    setting it on this worker's own copy of the dataset reseeds before the samples are read and
    collated, without changing the dataset object the main process holds.
    """
    inner = getattr(dataset, "__getitems__", None)

    def getitems(indices: list[int]) -> list[Any]:
        seed = getattr(indices, "seed", None)
        if seed is not None:
            _seed_process_rngs(seed)
        keys = list(indices)
        return inner(keys) if inner else [dataset[i] for i in keys]

    try:
        dataset.__getitems__ = getitems
    except AttributeError:
        warnings.warn(
            f"{type(dataset).__name__} takes no attributes (__slots__): worker RNG is seeded per worker "
            "only, so random values drawn while loading differ after a mid-epoch resume.",
            stacklevel=2,
        )


class _WorkerSetup:
    """worker_init_fn: the caller's (or trainwright.core.seed's) seeding, then per-batch seeding."""

    def __init__(self, inner: Callable[[int], None] | None, preemption_signals: Iterable[str] = ()) -> None:
        self.inner = inner
        self.preemption_signals = tuple(preemption_signals)

    def __call__(self, worker_id: int) -> None:
        # Ctrl-C reaches every process of the terminal's group, and a scheduler's SIGTERM every
        # process of the job's. A worker that died of it would fail the step being finished before
        # the preemption checkpoint; the main process decides, and stops its workers itself.
        with contextlib.suppress(ValueError, AttributeError):
            shield_worker(self.preemption_signals)
        if self.inner is not None:
            self.inner(worker_id)
        info = torch.utils.data.get_worker_info()
        if info is not None and not is_iterable_dataset(info.dataset):
            _install_batch_seeding(info.dataset)


class EpochSeededDataLoader(DataLoader):
    """A DataLoader whose randomness depends on (seed, epoch, position), never on history.

    - Order: from the sampler (see :class:`ResumableSampler`).
    - Worker base seeds: the loader's private generator is reseeded from (seed, epoch, rank)
      each time an epoch is iterated, so torch's per-worker seeds (and
      ``trainwright.core.seed.seed_worker``) are the same in a fresh, continued or resumed run.
      Starting an epoch still draws one value from the global torch RNG, where a plain DataLoader
      draws its base seed, so the model's random stream (dropout, sampling) is the one of a run on
      a plain loader (transformers'); a resumed epoch does not (see ``iterate``).
    - **With workers** (map-style datasets): before a batch is read, its worker seeds torch,
      numpy and random with a seed of (seed, epoch, rank, position of the batch's first sample
      in the epoch). The values ``__getitem__`` and ``collate_fn`` draw for a batch are then the
      same whichever worker loads it, how many workers there are, whether workers persist, and
      where the iteration started — a resume at a batch boundary sees exactly the uninterrupted
      run's values. Per-worker seeding alone cannot give this: a worker's RNG advances with every
      sample it loads, and after a resume each worker loads different batches.
    - **Without workers**: samples are loaded in the main process and draw from its global
      RNGs, in the same order as in an uninterrupted run; resume is exact when the process RNG
      state is restored from the checkpoint before iterating (trainwright's checkpoints do).
      Reseeding per batch here would hijack the model's RNG stream (dropout), and saving and
      restoring the numpy state around each batch costs ~0.2 ms.
    - IterableDatasets: only the worker seeds above are fixed; their resume goes through
      :func:`skip_iterable` or the dataset's own ``state_dict``.

    The epoch is ``epoch_getter()`` when given, else the sampler's ``epoch``, else the last
    ``set_epoch`` value. Workers ignore SIGINT and ``preemption_signals`` (SIGTERM from this
    process still stops them): the main process saves on them and stops its workers itself.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        seed: int,
        epoch_getter: Callable[[], int] | None = None,
        rank: int = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        preemption_signals: Iterable[str] = (),
        **kwargs: Any,
    ) -> None:
        if "generator" in kwargs:
            raise ValueError("EpochSeededDataLoader owns its generator; pass seed= instead of generator=.")
        self.seed = int(seed)
        self.rank = rank
        # an iteration has started (in this process, or, where a resume says so, in the run it
        # continues): with persistent workers torch draws its base seed at the first one only
        self.started = False
        super().__init__(
            dataset,
            generator=torch.Generator(),
            worker_init_fn=_WorkerSetup(worker_init_fn, preemption_signals),
            **kwargs,
        )
        self._epochs = _Epochs(epoch_getter, self.sampler)

    @property
    def epoch(self) -> int:
        return self._epochs()

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch; forwarded to the sampler and to an iterable dataset that takes it."""
        self._epochs.selected = int(epoch)
        obj: Any
        for obj in (self.sampler, self.dataset if is_iterable_dataset(self.dataset) else None):
            if callable(getattr(obj, "set_epoch", None)):
                obj.set_epoch(epoch)

    @property
    def _index_sampler(self) -> Any:
        # torch's iterators take the batches to fetch from `_index_sampler`; tagging them here
        # keeps `batch_size`, `batch_sampler` and `drop_last` their usual public meaning.
        batches = super()._index_sampler
        if self.num_workers > 0 and self._auto_collation and not is_iterable_dataset(self.dataset):
            return _SeededBatches(batches, self._epochs, self.seed, self.rank)
        return batches

    # ignore[override]: with a timeout the iterator is wrapped (to name the timeout), so it is an
    # Iterator but not torch's _BaseDataLoaderIter
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return self.iterate(from_start=getattr(self.sampler, "start", 0) == 0)

    def iterate(self, from_start: bool = True) -> Iterator[Any]:
        """An iterator over the epoch; `from_start=False`: the iteration continues a resumed epoch."""
        if from_start and not (self.persistent_workers and self.started):
            # torch's loader draws its base seed from the global RNG when an iterator starts; so does
            # this one (then unused), so the model's random stream (dropout, sampling in generate)
            # advances as under a plain DataLoader, as in transformers' runs. A resumed epoch does
            # not draw: the checkpoint's RNG state was taken after its start's draw.
            torch.empty((), dtype=torch.int64).random_()
        self.started = True
        self.generator.manual_seed(_derive_seed("workers", self.seed, self.epoch, self.rank))
        iterator = super().__iter__()
        return _NamedTimeout(iterator, self.timeout) if self.timeout and self.num_workers > 0 else iterator


class _NamedTimeout:
    """A DataLoader iterator whose timeout error names the `dataloader_timeout` argument."""

    def __init__(self, inner: Any, timeout: float) -> None:
        self._inner, self._timeout = inner, timeout

    def __iter__(self) -> _NamedTimeout:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._inner)
        except RuntimeError as exc:
            if "timed out" not in str(exc):
                raise
            raise RuntimeError(
                f"No batch came from the DataLoader workers in {self._timeout:g} s "
                f"(dataloader_timeout={self._timeout:g}): a worker is stuck or too slow. Find what "
                "blocks the dataset's __getitem__ / the collator, or raise dataloader_timeout "
                "(0 waits forever)."
            ) from exc

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _default_worker_init() -> Callable[[int], None] | None:
    """trainwright.core.seed.seed_worker when that module exists; otherwise torch's own per-worker
    seeding (base seed + worker id, already fixed by the loader's generator) is enough."""
    try:
        from trainwright.core.seed import seed_worker
    except ImportError:
        return None
    return seed_worker


def make_dataloader(
    dataset: Any,
    *,
    batch_size: int,
    sampler: Sampler | None,
    collate_fn: Callable[[list[Any]], Any] | None,
    args: Any,
    drop_last: bool,
    seed: int,
    epoch_getter: Callable[[], int] | None = None,
    device: torch.device | None = None,
    rank: int | None = None,
) -> EpochSeededDataLoader:
    """An :class:`EpochSeededDataLoader` configured from the ``dataloader_*`` arguments.

    Memory is pinned only when the data goes to a CUDA device (``device``, or CUDA being
    available when no device is given). ``rank`` defaults to the sampler's.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"make_dataloader: batch_size must be an int >= 1, got {batch_size!r}.")
    workers = int(args.dataloader_num_workers or 0)
    cuda = device.type == "cuda" if device is not None else torch.cuda.is_available()
    kwargs: dict[str, Any] = {}
    if workers > 0:
        kwargs["persistent_workers"] = bool(args.dataloader_persistent_workers)
        if args.dataloader_prefetch_factor is not None:
            kwargs["prefetch_factor"] = args.dataloader_prefetch_factor
        if getattr(args, "dataloader_timeout", 0):
            kwargs["timeout"] = float(args.dataloader_timeout)
        if getattr(args, "dataloader_multiprocessing_context", None) is not None:
            kwargs["multiprocessing_context"] = args.dataloader_multiprocessing_context
        if getattr(args, "dataloader_in_order", True) is False:
            kwargs["in_order"] = False  # workers hand batches back as they finish (torch >= 2.6)
    return EpochSeededDataLoader(
        dataset,
        seed=seed,
        epoch_getter=epoch_getter,
        rank=rank if rank is not None else int(getattr(sampler, "rank", 0)),
        worker_init_fn=_default_worker_init() if workers > 0 else None,
        preemption_signals=getattr(args, "preemption_signals", None) or (),
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=collate_fn,
        drop_last=drop_last,
        num_workers=workers,
        pin_memory=bool(args.dataloader_pin_memory) and cuda,
        **kwargs,
    )


def iterable_resume_state(dataset: Any) -> dict | None:
    """The dataset's own resume state (``state_dict()``), or None when it has none."""
    if callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None)):
        return dataset.state_dict()
    return None


def load_iterable_resume_state(dataset: Any, state: Mapping[str, Any]) -> None:
    """Restore a state from :func:`iterable_resume_state`; the dataset then continues from there."""
    if not callable(getattr(dataset, "load_state_dict", None)):
        raise ValueError(
            f"{type(dataset).__name__} has no load_state_dict: it cannot resume from a saved state."
        )
    dataset.load_state_dict(state)


def iterate_epoch(dataloader: Iterable[Any], from_start: bool, consumer: Any = None) -> Iterator[Any]:
    """An iterator over the loader's batches, fetched as they are asked for; `from_start=False` when
    it continues a resumed epoch (an `EpochSeededDataLoader` then does not draw its start's value
    from the global RNG again). A loader that looks ahead itself when iterated (a prepared one) gives
    its batches as asked, for `consumer` (a `look_ahead.LookAhead`) to fetch them one ahead."""
    if isinstance(dataloader, EpochSeededDataLoader):
        return dataloader.iterate(from_start=from_start)
    as_asked = getattr(dataloader, "fetch_as_asked", None)
    if callable(as_asked):
        return as_asked(consumer)
    return iter(dataloader)


def skip_iterable(
    dataloader_or_iterable: Iterable[Any], num_batches: int, consumer: Any = None
) -> Iterator[Any]:
    """Iterator over what is left after ``num_batches`` batches, for data without a sampler.

    Prefer restoring the dataset's own state (:func:`iterable_resume_state`), which skips nothing.
    This fallback has to load and collate every skipped batch, so it warns once with the count.
    """
    if num_batches < 0:
        raise ValueError(f"skip_iterable: num_batches must be >= 0, got {num_batches}.")
    iterator = iterate_epoch(dataloader_or_iterable, from_start=num_batches == 0, consumer=consumer)
    if num_batches:
        warnings.warn(
            f"Skipping {num_batches} batches by iterating over them: the data has no sampler to start "
            "mid-epoch and no state_dict()/load_state_dict() to restore its position, so each skipped "
            "batch is loaded and collated. Give the dataset state_dict()/load_state_dict() "
            "(datasets.IterableDataset has them) to resume without reading them.",
            stacklevel=2,
        )
        skipped = sum(1 for _ in itertools.islice(iterator, num_batches))
        if skipped < num_batches:  # the epoch would silently become the next one's start
            raise ValueError(
                f"Resuming: the data ended after {skipped} of the {num_batches} batches the checkpoint had "
                "read in this epoch: it is shorter than the data the checkpoint was written with (or "
                "another one). Resume with the same data, or pass ignore_data_skip=True to start the "
                "epoch from its first batch."
            )
    return iterator
