"""Samplers, dataloaders and collators built for exact resume.

Two rules shape this module:

- **Order is a function of (seed, epoch).** A sampler draws its permutation from a private
  ``torch.Generator`` seeded with ``seed + epoch``; it never touches the global RNG. Resuming in
  epoch ``e`` at position ``k`` is ``set_epoch(e)`` + ``set_start(k)``: the sampler slices its
  index list, so no skipped sample is ever loaded or collated.
- **Randomness inside data loading is a function of the batch's place.** See
  :class:`EpochSeededDataLoader` for what is guaranteed with and without worker processes.

A single process is world size 1 of the same sharding code that DDP ranks run.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import itertools
import logging
import math
import random
import signal
import sys
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
_LABEL_KEYS = ("label", "label_ids")


# ---------------------------------------------------------------------------------- helpers
def has_length(obj: Any) -> bool:
    """Whether ``len(obj)`` works (an IterableDataset without ``__len__`` raises TypeError)."""
    try:
        return len(obj) is not None
    except (TypeError, NotImplementedError):
        return False


def _is_hf_map_dataset(obj: Any) -> bool:
    module = sys.modules.get("datasets")
    return module is not None and isinstance(obj, module.Dataset)


def is_iterable_dataset(dataset: Any) -> bool:
    """True for datasets a sampler cannot index: torch/datasets IterableDatasets or no ``__len__``."""
    module = sys.modules.get("datasets")
    if isinstance(dataset, IterableDataset):
        return True
    if module is not None and isinstance(dataset, module.IterableDataset):
        return True
    return not has_length(dataset)


def _derive_seed(*parts: int | str) -> int:
    """A 63-bit seed mixed from ``parts`` (stable across processes, platforms and Python runs)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def _seed_process_rngs(seed: int) -> None:
    """Seed the torch, numpy and random global RNGs of this (worker) process."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


# ---------------------------------------------------------------------------------- samplers
class ResumableSampler(Sampler[int]):
    """Sampler whose order depends only on (seed, epoch) and which can start mid-epoch.

    With ``num_replicas > 1`` it shards like ``DistributedSampler``: the epoch's order is padded
    (by repeating from its start) to a multiple of ``num_replicas`` unless ``drop_last`` (which
    cuts the tail instead), and rank ``r`` takes positions ``r::num_replicas``. Padded duplicates
    are the last sample of the last ``num_padding`` ranks; :func:`trainwright.loop.evaluation.interleave_shards` turns
    gathered per-rank results back into dataset order so they can be trimmed.

    ``set_start(k)``: the next iteration begins at this rank's ``k``-th sample of the epoch (no
    sample before it is produced). ``set_epoch(e)`` with a new epoch resets the start to 0, so a
    loop calls ``set_epoch`` then, when resuming, ``set_start``.
    """

    _identity_fields: tuple[str, ...] = ("num_samples", "num_replicas", "shuffle")

    def __init__(
        self,
        num_samples: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        drop_last: bool = False,
    ) -> None:
        if not isinstance(num_samples, int) or num_samples < 0:
            raise ValueError(f"ResumableSampler: num_samples must be an int >= 0, got {num_samples!r}.")
        if not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(f"ResumableSampler: num_replicas must be an int >= 1, got {num_replicas!r}.")
        if not isinstance(rank, int) or not 0 <= rank < num_replicas:
            raise ValueError(f"ResumableSampler: rank must be in [0, {num_replicas}), got {rank!r}.")
        self.num_samples = num_samples
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.num_replicas = num_replicas
        self.rank = rank
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self.start = 0

    # -- geometry ---------------------------------------------------------------------------
    @property
    def _total(self) -> int:
        """Length of the epoch's order after padding / cutting, over all ranks."""
        n, r = self.num_samples, self.num_replicas
        return (n // r) * r if self.drop_last else math.ceil(n / r) * r

    @property
    def num_padding(self) -> int:
        """Duplicated samples this epoch adds over all ranks (0 with drop_last)."""
        return max(self._total - self.num_samples, 0)

    def __len__(self) -> int:
        """This rank's samples in a whole epoch, whatever the start.

        The trainer derives steps per epoch (and so the schedule and the epoch of a resumed
        step) from this; a length that shrank after ``set_start`` would change them on resume.
        """
        return self._total // self.num_replicas

    # -- order ------------------------------------------------------------------------------
    def _generator(self) -> torch.Generator:
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return generator

    def _epoch_order(self) -> torch.Tensor:
        """The whole epoch's order over every rank, before padding."""
        if not self.shuffle:
            return torch.arange(self.num_samples)
        return torch.randperm(self.num_samples, generator=self._generator())

    def _shard(self, order: torch.Tensor) -> torch.Tensor:
        total = self._total
        if total <= len(order):
            order = order[:total]
        else:  # pad by cycling the order from its start (pad may exceed len(order) when tiny)
            repeats = math.ceil(total / len(order))
            order = order.repeat(repeats)[:total]
        return order[self.rank : total : self.num_replicas]

    def rank_order(self) -> list[int]:
        """This rank's whole-epoch order (ignoring the start)."""
        return self._shard(self._epoch_order()).tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self._shard(self._epoch_order())[self.start :].tolist())

    # -- position ---------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to iterate; a different epoch than the current one starts at 0."""
        if epoch != self.epoch:
            self.start = 0
        self.epoch = int(epoch)

    def set_start(self, position: int) -> None:
        """Begin the next iteration after ``position`` of this rank's samples of the epoch."""
        if not isinstance(position, int) or not 0 <= position <= len(self):
            raise ValueError(
                f"{type(self).__name__}.set_start: position must be an int in [0, {len(self)}] "
                f"(this rank's samples per epoch), got {position!r}."
            )
        self.start = position

    # -- checkpointing ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, int | bool]:
        """Plain ints/bools: where this sampler is and what defines its order."""
        return {
            "epoch": self.epoch,
            "seed": self.seed,
            "start": self.start,
            "num_samples": self.num_samples,
            "num_replicas": self.num_replicas,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore epoch, start and seed; refuse a state whose order cannot match this sampler.

        The saved seed wins (with a warning when it differs) so that the interrupted epoch is
        replayed exactly.
        """
        expected = set(self.state_dict())
        missing = sorted(expected - set(state))
        if missing:
            raise ValueError(f"{type(self).__name__}.load_state_dict: the saved state lacks {missing}.")
        for name in self._identity_fields:
            if state[name] != getattr(self, name):
                raise ValueError(
                    f"{type(self).__name__}.load_state_dict: {name} differs (saved {state[name]!r}, "
                    f"now {getattr(self, name)!r}); the saved position would mean other samples."
                )
        if int(state["seed"]) != self.seed:
            warnings.warn(
                f"{type(self).__name__}: the checkpoint's data seed {state['seed']} replaces {self.seed} "
                "so that the interrupted epoch continues in its own order.",
                stacklevel=2,
            )
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.set_start(int(state["start"]))


def _lengths_of(dataset: Any, length_column_name: str) -> list[int]:
    """Per-sample lengths: a ``length_column_name`` column, else ``len(item["input_ids"])``."""
    if _is_hf_map_dataset(dataset):
        columns = dataset.column_names
        if length_column_name in columns:
            return [int(v) for v in dataset[length_column_name]]
        if "input_ids" in columns:
            return [len(v) for v in dataset["input_ids"]]
        raise ValueError(
            f"LengthGroupedSampler: the dataset has neither a {length_column_name!r} column nor "
            f"'input_ids' (columns: {columns}); pass lengths= or set length_column_name."
        )
    logger.warning(
        "LengthGroupedSampler: reading all %d items once to measure their length; pass lengths= or "
        "give items a %r key to avoid this.",
        len(dataset),
        length_column_name,
    )
    lengths = []
    for i in range(len(dataset)):
        item = dataset[i]
        if isinstance(item, Mapping) and length_column_name in item:
            lengths.append(int(item[length_column_name]))
        elif isinstance(item, Mapping) and "input_ids" in item:
            lengths.append(len(item["input_ids"]))
        else:
            raise ValueError(
                f"LengthGroupedSampler: item {i} is a {type(item).__name__} without a "
                f"{length_column_name!r} or 'input_ids' key; pass lengths= explicitly."
            )
    return lengths


class LengthGroupedSampler(ResumableSampler):
    """Shuffled order in which neighbours have similar lengths (less padding per batch).

    Each epoch: a permutation from (seed, epoch) is cut into mega-batches of
    ``batch_size * num_replicas * mega_batch_mult`` samples; each mega-batch is sorted longest
    first; the mega-batch holding the longest sample goes first, so a batch that does not fit in
    memory fails on step one rather than hours in. ``mega_batch_mult`` defaults to 50, lowered
    for small datasets so there are still about four mega-batches to shuffle between. Grouping
    uses the global batch (``batch_size * num_replicas``) so that all ranks of a step get samples
    of similar length. Same resumable interface as :class:`ResumableSampler`.
    """

    _identity_fields = (*ResumableSampler._identity_fields, "batch_size")

    def __init__(
        self,
        batch_size: int,
        *,
        dataset: Any = None,
        lengths: Sequence[int] | None = None,
        length_column_name: str = "length",
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        drop_last: bool = False,
        mega_batch_mult: int | None = None,
    ) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"LengthGroupedSampler: batch_size must be an int >= 1, got {batch_size!r}.")
        if lengths is None:
            if dataset is None:
                raise ValueError("LengthGroupedSampler: give lengths= or a dataset to read them from.")
            lengths = _lengths_of(dataset, length_column_name)
        elif dataset is not None and has_length(dataset) and len(lengths) != len(dataset):
            raise ValueError(
                f"LengthGroupedSampler: lengths has {len(lengths)} entries but the dataset {len(dataset)} items."
            )
        super().__init__(
            len(lengths), shuffle=True, seed=seed, num_replicas=num_replicas, rank=rank, drop_last=drop_last
        )
        self.lengths = torch.as_tensor(list(lengths), dtype=torch.long)
        self.batch_size = batch_size
        group = batch_size * num_replicas
        if mega_batch_mult is None:
            mega_batch_mult = max(1, min(50, len(lengths) // (4 * group)))
        self.mega_batch_mult = mega_batch_mult
        self._mega_size = group * mega_batch_mult

    def _epoch_order(self) -> torch.Tensor:
        perm = torch.randperm(self.num_samples, generator=self._generator())
        if self.num_samples == 0:
            return perm
        megas = []
        for chunk in perm.split(self._mega_size):
            # stable sort keeps the random order among equal lengths
            order = torch.sort(self.lengths[chunk], descending=True, stable=True).indices
            megas.append(chunk[order])
        firsts = torch.stack([self.lengths[m[0]] for m in megas])
        longest = int(torch.argmax(firsts))  # first mega-batch holding the maximum length
        megas.insert(0, megas.pop(longest))
        return torch.cat(megas)

    def state_dict(self) -> dict[str, int | bool]:
        return {**super().state_dict(), "batch_size": self.batch_size}


_STRATEGIES = ("random", "sequential", "group_by_length")


def build_sampler(
    dataset: Any, args: Any, runtime: Any, *, train: bool, batch_size: int | None = None
) -> Sampler | None:
    """The sampler for a training or evaluation dataset (None for an IterableDataset).

    Training follows ``args.train_sampling_strategy`` ("random", "sequential",
    "group_by_length"; ``args.group_by_length`` is the v4 spelling) with seed ``args.data_seed``
    or ``args.seed``. Evaluation is in order, sharded over ranks without dropping anything: the
    padded duplicates are counted in ``num_padding`` so gathered predictions can be trimmed.
    """
    if is_iterable_dataset(dataset):
        return None
    n = len(dataset)
    shard = {"num_replicas": runtime.world_size, "rank": runtime.rank}
    if not train:
        return ResumableSampler(n, shuffle=False, drop_last=False, **shard)
    seed = args.data_seed if args.data_seed is not None else args.seed
    strategy = getattr(args, "train_sampling_strategy", "random") or "random"
    if getattr(args, "group_by_length", False):
        strategy = "group_by_length"
    if strategy not in _STRATEGIES:
        raise ValueError(f"train_sampling_strategy must be one of {list(_STRATEGIES)}, got {strategy!r}.")
    drop_last = bool(args.dataloader_drop_last)
    if strategy == "group_by_length":
        return LengthGroupedSampler(
            batch_size or args.per_device_train_batch_size,
            dataset=dataset,
            length_column_name=args.length_column_name,
            seed=seed,
            drop_last=drop_last,
            **shard,
        )
    return ResumableSampler(n, shuffle=strategy == "random", seed=seed, drop_last=drop_last, **shard)


# ---------------------------------------------------------------------------------- dataloader
class _SeededBatch(list):
    """A batch of indices that carries the RNG seed its worker must use to load it."""

    __slots__ = ("seed",)

    def __init__(self, indices: Iterable[int], seed: int) -> None:
        super().__init__(indices)
        self.seed = seed


class _SeededBatches:
    """Wraps the loader's batch sampler: tags each batch with a seed from its place in the epoch."""

    def __init__(self, batches: Any, loader: EpochSeededDataLoader) -> None:
        self.batches = batches
        # A weak reference: a persistent-worker loader holds its iterator, which holds this; a
        # strong cycle would keep the workers alive until the garbage collector runs.
        self._loader = weakref.ref(loader)

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[_SeededBatch]:
        loader = self._loader()
        if loader is None:
            raise RuntimeError("the DataLoader of this batch sampler no longer exists")
        # Read at iteration time: persistent workers re-iterate this same object every epoch.
        epoch, sampler = loader.epoch, loader.sampler
        position = int(getattr(sampler, "start", 0))
        rank = int(getattr(sampler, "rank", loader.rank))
        for batch in self.batches:
            yield _SeededBatch(batch, _derive_seed("batch", loader.seed, epoch, rank, position))
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

    def __init__(self, inner: Callable[[int], None] | None) -> None:
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        # Ctrl-C reaches every process of the terminal's group. A worker that got it would stop
        # (torch's worker loop exits on KeyboardInterrupt) and the step being finished before the
        # preemption checkpoint could not get its batches; the main process decides, and stops
        # its workers itself.
        with contextlib.suppress(ValueError, AttributeError):
            signal.signal(signal.SIGINT, signal.SIG_IGN)
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
      ``trainwright.core.seed.seed_worker``) are the same in a fresh, continued or resumed run. It
      also means iterating never draws from the global torch RNG, as a plain DataLoader does.
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
    ``set_epoch`` value.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        seed: int,
        epoch_getter: Callable[[], int] | None = None,
        rank: int = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        **kwargs: Any,
    ) -> None:
        if "generator" in kwargs:
            raise ValueError("EpochSeededDataLoader owns its generator; pass seed= instead of generator=.")
        self.seed = int(seed)
        self.rank = rank
        self._epoch_getter = epoch_getter
        self._epoch = 0
        super().__init__(
            dataset, generator=torch.Generator(), worker_init_fn=_WorkerSetup(worker_init_fn), **kwargs
        )

    @property
    def epoch(self) -> int:
        if self._epoch_getter is not None:
            return int(self._epoch_getter())
        return int(getattr(self.sampler, "epoch", self._epoch))

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch; forwarded to the sampler and to an iterable dataset that takes it."""
        self._epoch = int(epoch)
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
            return _SeededBatches(batches, self)
        return batches

    # ignore[override]: with a timeout the iterator is wrapped (to name the timeout), so it is an
    # Iterator but not torch's _BaseDataLoaderIter
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
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
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=collate_fn,
        drop_last=drop_last,
        num_workers=workers,
        pin_memory=bool(args.dataloader_pin_memory) and cuda,
        **kwargs,
    )


def sampler_geometry(dataloader: Any) -> tuple[int, int] | None:
    """(batch size, this process's samples per epoch) when the loader cuts its batches in order
    from a resumable sampler, so that each batch's number of samples is known without reading
    it (a packed batch's tensors do not show it); None for any other loader."""
    sampler: Any = getattr(dataloader, "sampler", None)
    size = getattr(dataloader, "batch_size", None)
    if not hasattr(sampler, "set_start") or not isinstance(size, int) or size < 1:
        return None
    return size, len(sampler)


def num_examples(dataloader: Any) -> int:
    """Samples in the dataloader's dataset, else batches x batch size."""
    dataset = getattr(dataloader, "dataset", None)
    if dataset is not None and has_length(dataset):
        return len(dataset)
    batch_size = getattr(dataloader, "batch_size", None)
    if batch_size and has_length(dataloader):
        return len(dataloader) * batch_size
    raise ValueError(
        f"num_examples: neither the dataset ({type(dataset).__name__}) nor the dataloader has a length."
    )


# ---------------------------------------------------------------------------------- iterable resume
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


def skip_iterable(dataloader_or_iterable: Iterable[Any], num_batches: int) -> Iterator[Any]:
    """Iterator over what is left after ``num_batches`` batches, for data without a sampler.

    Prefer restoring the dataset's own state (:func:`iterable_resume_state`), which skips nothing.
    This fallback has to load and collate every skipped batch, so it warns once with the count.
    """
    if num_batches < 0:
        raise ValueError(f"skip_iterable: num_batches must be >= 0, got {num_batches}.")
    iterator = iter(dataloader_or_iterable)
    if num_batches:
        warnings.warn(
            f"Skipping {num_batches} batches by iterating over them: the data has no sampler to start "
            "mid-epoch and no state_dict()/load_state_dict() to restore its position, so each skipped "
            "batch is loaded and collated. Give the dataset state_dict()/load_state_dict() "
            "(datasets.IterableDataset has them) to resume without reading them.",
            stacklevel=2,
        )
        for _ in itertools.islice(iterator, num_batches):
            pass
    return iterator


# ---------------------------------------------------------------------------------- collators
def _as_mapping(feature: Any) -> Mapping[str, Any]:
    if isinstance(feature, Mapping):
        return feature
    if hasattr(feature, "__dict__"):
        return vars(feature)
    raise TypeError(
        f"default_data_collator: a feature must be a mapping or an object, got {type(feature).__name__}."
    )


def _is_integer(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return not (value.is_floating_point() or value.is_complex())
    if isinstance(value, np.ndarray):
        return np.issubdtype(value.dtype, np.integer) or value.dtype == np.bool_
    if isinstance(value, (list, tuple)):
        return _is_integer(value[0]) if value else True
    return isinstance(value, (int, np.integer, bool))


def _to_tensor(key: str, values: list[Any], dtype: torch.dtype | None = None) -> torch.Tensor:
    first = values[0]
    try:
        if isinstance(first, torch.Tensor):
            out = torch.stack(values)
        elif isinstance(first, np.ndarray):
            out = torch.from_numpy(np.stack(values))
        else:
            out = torch.tensor(values)
    except (ValueError, RuntimeError) as err:
        raise ValueError(
            f"default_data_collator: feature {key!r} cannot be stacked ({err}); sequences of different "
            "lengths need PaddingCollator or pad_sequence_collator."
        ) from err
    return out.to(dtype) if dtype is not None else out


def default_data_collator(features: Sequence[Any], return_tensors: str = "pt") -> dict[str, Any]:
    """Stack a list of dicts (or objects with attributes) into a dict of tensors.

    ``label`` or ``label_ids`` becomes ``labels``, int64 for integer labels and float32 for float
    labels (floating tensors keep their dtype). Keys whose first value is None or a string are
    dropped: they cannot become a tensor. ``return_tensors="np"`` gives numpy arrays instead.
    """
    if return_tensors not in ("pt", "np"):
        raise ValueError(
            f"default_data_collator: return_tensors must be 'pt' or 'np', got {return_tensors!r}."
        )
    if not features:
        raise ValueError("default_data_collator: got an empty batch.")
    first = features[0]
    if (
        return_tensors == "pt"
        and type(first) is dict
        and not any(k in first for k in _LABEL_KEYS)
        and all(isinstance(v, torch.Tensor) for v in first.values())
    ):  # dicts of tensors, the common case: stack each key (what the general path does, minus its checks)
        try:
            return {k: torch.stack([f[k] for f in features]) for k in first}
        except (RuntimeError, KeyError, TypeError):
            pass  # the general path gives the clear error
    rows = [_as_mapping(f) for f in features]
    first = rows[0]
    batch: dict[str, Any] = {}
    label_key = next((k for k in _LABEL_KEYS if first.get(k) is not None), None)
    if label_key is not None:
        values = [row[label_key] for row in rows]
        integer = _is_integer(values[0])
        floating_tensor = isinstance(values[0], torch.Tensor) and not integer
        dtype = torch.long if integer else None if floating_tensor else torch.float32
        batch["labels"] = _to_tensor("labels", values, dtype)
    for key, value in first.items():
        if key in _LABEL_KEYS or value is None or isinstance(value, str):
            continue
        batch[key] = _to_tensor(key, [row[key] for row in rows])
    if return_tensors == "np":
        batch = {k: v.numpy() for k, v in batch.items()}
    return batch


class PaddingCollator:
    """Pads a batch with the tokenizer's (or processor's tokenizer's) ``pad`` method.

    ``label``/``label_ids`` are renamed ``labels``. Variable-length label sequences are not
    padded by ``pad``; use :func:`pad_sequence_collator` for those.
    """

    def __init__(
        self,
        processing_class: Any,
        padding: bool | str = True,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
        return_tensors: str = "pt",
    ) -> None:
        owner = processing_class
        if not callable(getattr(owner, "pad", None)):
            owner = getattr(processing_class, "tokenizer", None)
        if not callable(getattr(owner, "pad", None)):
            raise TypeError(
                f"PaddingCollator needs a tokenizer (or processor) with a pad() method, got "
                f"{type(processing_class).__name__}."
            )
        self.tokenizer = owner
        self.padding = padding
        self.max_length = max_length
        self.pad_to_multiple_of = pad_to_multiple_of
        self.return_tensors = return_tensors

    def __call__(self, features: list[Mapping[str, Any]]) -> dict[str, Any]:
        batch = self.tokenizer.pad(
            features,
            padding=self.padding,
            max_length=self.max_length,
            pad_to_multiple_of=self.pad_to_multiple_of,
            return_tensors=self.return_tensors,
        )
        batch = dict(batch)
        for key in _LABEL_KEYS:
            if key in batch:
                batch["labels"] = batch.pop(key)
        return batch


def _pad(values: list[Any], pad_value: int) -> torch.Tensor:
    seqs = [torch.as_tensor(v) for v in values]
    longest = max(int(s.shape[0]) for s in seqs)
    out = torch.full((len(seqs), longest, *seqs[0].shape[1:]), pad_value, dtype=seqs[0].dtype)
    for row, seq in enumerate(seqs):
        out[row, : seq.shape[0]] = seq
    return out


def _pad_sequences(features: Sequence[Mapping[str, Any]], pad_token_id: int, label_pad_token_id: int) -> dict:
    rows = [_as_mapping(f) for f in features]
    pads = {"input_ids": pad_token_id, "attention_mask": 0, "labels": label_pad_token_id}
    # only sequences are padded: a scalar label (classification) is stacked like any other key
    pads = {k: v for k, v in pads.items() if k in rows[0] and torch.as_tensor(rows[0][k]).dim() > 0}
    batch = {key: _pad([r[key] for r in rows], value) for key, value in pads.items()}
    if "input_ids" in batch and "attention_mask" not in batch:
        mask = torch.zeros(batch["input_ids"].shape[:2], dtype=torch.long)
        for row, r in enumerate(rows):
            mask[row, : len(r["input_ids"])] = 1
        batch["attention_mask"] = mask
    rest = [{k: v for k, v in r.items() if k not in pads} for r in rows]
    if rest[0]:
        batch.update(default_data_collator(rest))
    return batch


def pad_sequence_collator(
    pad_token_id: int = 0, label_pad_token_id: int = IGNORE_INDEX
) -> Callable[[Sequence[Mapping[str, Any]]], dict[str, torch.Tensor]]:
    """A collator that right-pads ``input_ids`` (with ``pad_token_id``), ``attention_mask`` (0,
    built from the lengths when absent) and ``labels`` (``label_pad_token_id``); other keys are
    stacked by :func:`default_data_collator`. Picklable, so it works with spawned workers."""
    return partial(_pad_sequences, pad_token_id=pad_token_id, label_pad_token_id=label_pad_token_id)


# ---------------------------------------------------------------------------------- columns
def _unwrap(model: Any) -> Any:
    """The module under DDP (``.module``) and torch.compile (``._orig_mod``) wrappers."""
    while True:
        if getattr(model, "_orig_mod", None) is not None:
            model = model._orig_mod
        elif isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def forward_arg_names(model: Any, label_names: Iterable[str] = ()) -> set[str]:
    """Named parameters of ``model.forward`` plus "label", "label_ids" and ``label_names``:
    the batch keys the model can be given."""
    params = inspect.signature(_unwrap(model).forward).parameters.values()
    named = {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    return named | set(_LABEL_KEYS) | set(label_names)


class RemoveColumnsCollator:
    """Drops batch keys the model does not accept, then calls ``collate_fn``.

    For data that is not a ``datasets.Dataset`` (whose columns :func:`remove_unused_columns`
    removes up front). Logs the dropped keys once.
    """

    def __init__(
        self, collate_fn: Callable[[list[Any]], Any], keep: set[str], description: str | None = None
    ) -> None:
        self.collate_fn = collate_fn
        self.keep = set(keep)
        self.description = description
        self._logged = False

    def _drop(self, feature: Any) -> Any:
        if not isinstance(feature, Mapping):
            return feature
        if not self._logged:
            self._logged = True
            ignored = sorted(set(feature) - self.keep)
            if ignored:
                where = f" of the {self.description} set" if self.description else ""
                logger.info(
                    "Ignoring columns%s that the model's forward does not take: %s.",
                    where,
                    ", ".join(ignored),
                )
        return {k: v for k, v in feature.items() if k in self.keep}

    def __call__(self, features: list[Any]) -> Any:
        first = features[0] if features else None
        if isinstance(first, Mapping) and self.keep.issuperset(first):
            return self.collate_fn(features)  # nothing to drop (the common case): no copies
        return self.collate_fn([self._drop(f) for f in features])


def remove_unused_columns(dataset: Any, keep: set[str], description: str | None = None) -> Any:
    """A ``datasets.Dataset`` without the columns the model does not take; other data unchanged."""
    if not _is_hf_map_dataset(dataset):
        return dataset
    columns = list(dataset.column_names)
    ignored = [c for c in columns if c not in keep]
    if len(ignored) == len(columns):
        raise ValueError(
            f"No column of the {description + ' ' if description else ''}dataset {columns} is an argument of the model's forward "
            f"({sorted(keep)}): nothing would be left to train on. Rename the columns or set "
            "remove_unused_columns=False."
        )
    if ignored:
        logger.info("Removing dataset columns the model's forward does not take: %s.", ", ".join(ignored))
        dataset = dataset.remove_columns(ignored)
    return dataset


# ---------------------------------------------------------------------------------- label targets
def count_items(
    inputs: Mapping[str, Any], *, shift: bool, label_name: str = "labels", ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """Label targets the loss averages over, as a tensor on the labels' device (no host sync).

    ``shift=True`` for a causal LM: it predicts token ``t+1`` from position ``t``, so the first
    label of each sequence is never a target.
    """
    labels = inputs.get(label_name) if isinstance(inputs, Mapping) else None
    if not isinstance(labels, torch.Tensor):
        raise ValueError(f"count_items: the batch has no tensor {label_name!r} (keys: {list(inputs)}).")
    if shift:
        labels = labels[..., 1:]
    return (labels != ignore_index).sum()


_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")


def is_causal_lm(model: Any) -> bool:
    """Whether the model's labels are shifted inside its loss (next-token prediction).

    A custom module states it with the attribute ``label_shift = True`` (trainwright's contract;
    ``False`` overrides the guesses below). Otherwise: a transformers class named
    ``*ForCausalLM`` / ``*LMHeadModel``, a ``loss_type`` of "ForCausalLM", or a config that is a
    decoder without being encoder-decoder.
    """
    model = _unwrap(model)
    declared = getattr(model, "label_shift", None)
    if declared is not None:
        return bool(declared)
    if type(model).__name__.endswith(_CAUSAL_SUFFIXES):
        return True
    config = getattr(model, "config", None)
    if (
        getattr(model, "loss_type", None) == "ForCausalLM"
        or getattr(config, "loss_type", None) == "ForCausalLM"
    ):
        return True
    return bool(getattr(config, "is_decoder", False)) and not bool(
        getattr(config, "is_encoder_decoder", False)
    )


__all__ = [
    "IGNORE_INDEX",
    "EpochSeededDataLoader",
    "LengthGroupedSampler",
    "PaddingCollator",
    "RemoveColumnsCollator",
    "ResumableSampler",
    "build_sampler",
    "count_items",
    "default_data_collator",
    "forward_arg_names",
    "has_length",
    "is_causal_lm",
    "is_iterable_dataset",
    "iterable_resume_state",
    "load_iterable_resume_state",
    "make_dataloader",
    "num_examples",
    "pad_sequence_collator",
    "remove_unused_columns",
    "skip_iterable",
]
