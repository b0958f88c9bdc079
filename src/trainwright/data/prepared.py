"""A library's own DataLoader prepared as accelerate's `prepare_data_loader` prepares it
(`trainer.accelerator.prepare(loader)`: sentence-transformers and GLiNER build their training and
evaluation loaders so): this process's batches on its device.

- Order: with `use_seedable_sampler` (the default) a `RandomSampler` inside the loader is replaced
  by `EpochRandomSampler` (accelerate's `SeedableRandomSampler`): each epoch's order is a function of
  (`data_seed`, else torch's initial seed, + epoch), the same on every process and in a resumed run.
  Without it the sampler's generator carries on from epoch to epoch, process 0's state handed to
  every process when an iteration starts.
- Over several processes, as `accelerator_config` (and `accelerator.even_batches`) deal it
  (`data/distribute.py`): a map-style loader through its batch sampler (`BatchShard`), an iterable
  dataset read by process 0 and dispatched (`DispatchingLoader`). Two settings accelerate has are
  refused: `dispatch_batches=True` for a map-style loader, and `dispatch_batches=False` for an
  iterable one (the repeats completing its last batch could not be left out of an evaluation).
- `set_epoch` reaches the seedable sampler and the batch sampler; each iteration sets the
  sampler's epoch to the loader's iteration count, as accelerate's `DataLoaderShard` does.

Iterated (`iter`), batches are fetched one ahead, as accelerate's loader fetches them (a collator's
random draws in a transformers run's order), by `look_ahead.fetched_ahead`. trainwright's training
and evaluation loops take its batches as asked (`fetch_as_asked`) and fetch them one ahead
themselves (the one look-ahead, which a checkpoint keeps the batch in hand of); `real_rows_in_batch`
/ `_in_step` are then of the batch the loop holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from trainwright.core.nested import to_device
from trainwright.data.distribute import BatchShard, DataDealing, DispatchingLoader
from trainwright.data.kinds import is_iterable_dataset
from trainwright.data.loaders import EpochSeededDataLoader
from trainwright.data.look_ahead import fetched_ahead


class EpochRandomSampler(RandomSampler):
    """accelerate's `SeedableRandomSampler`: `sampler`'s draws, its generator seeded with
    `seed + epoch` when an iteration starts."""

    def __init__(self, sampler: RandomSampler, seed: int) -> None:
        generator = sampler.generator if sampler.generator is not None else torch.Generator()
        super().__init__(
            sampler.data_source,
            replacement=sampler.replacement,
            num_samples=sampler._num_samples,
            generator=generator,
        )
        self.seed, self.epoch = int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        assert self.generator is not None  # set in __init__
        self.generator.manual_seed(self.seed + self.epoch)
        yield from super().__iter__()


def _batch_sampler(loader: DataLoader) -> Any:
    """The loader's batch sampler (one given as its `sampler` included), or None."""
    return loader.sampler if isinstance(loader.sampler, BatchSampler) else loader.batch_sampler


def _loader_kwargs(loader: DataLoader) -> dict[str, Any]:
    """What a rebuilt loader keeps of `loader`: collation, workers, memory pinning."""
    kwargs = {
        "collate_fn": loader.collate_fn,
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        # trainwright's loader seeds its workers from a private generator; rebuilt as a plain
        # loader it draws its base seed from the global RNG, as the one transformers prepares
        "generator": None if isinstance(loader, EpochSeededDataLoader) else loader.generator,
        "persistent_workers": loader.persistent_workers,
    }
    if getattr(loader, "pin_memory_device", ""):
        kwargs["pin_memory_device"] = loader.pin_memory_device
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    return kwargs


class PreparedLoader:
    """A library's loader as accelerate prepares it; see the module docstring. `loader` is the loader
    this process iterates (rebuilt around `shard`, or the dispatching one); `sampler` the random
    sampler whose epoch it sets; `synced` the generator handed from process 0 at each iteration."""

    def __init__(
        self,
        loader: Any,
        device: torch.device | None,
        non_blocking: bool = False,
        *,
        shard: BatchShard | None = None,
        sampler: Any = None,
        synced: torch.Generator | None = None,
        runtime: Any = None,
    ) -> None:
        self.loader, self.device, self.non_blocking = loader, device, non_blocking
        self.shard, self._sampler, self._synced, self._runtime = shard, sampler, synced, runtime
        self.deals_whole_batches = shard is not None or bool(getattr(loader, "deals_whole_batches", False))
        self.iteration = 0  # accelerate's: the epoch an iteration gives the sampler
        self._yielded = 0  # batches handed over in this iteration
        self._consumer: Any = None  # the look-ahead that holds them (`look_ahead.LookAhead`)

    def set_epoch(self, epoch: int) -> None:
        """The epoch, to the sampler and the batch sampler (as transformers' loop sets it on them)."""
        self.iteration = int(epoch)
        for obj in (self.shard if self.shard is not None else _batch_sampler(self.loader), self._sampler):
            if callable(getattr(obj, "set_epoch", None)):
                obj.set_epoch(epoch)
        if callable(getattr(self.loader, "set_epoch", None)):  # a dispatching loader: its dataset
            self.loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        return fetched_ahead(self)

    def place(self, batch: Any) -> Any:
        """`batch` on this loader's device (a checkpoint's batch in hand, read back on the CPU)."""
        return batch if self.device is None else to_device(batch, self.device, self.non_blocking)

    def fetch_as_asked(self, consumer: Any = None) -> Iterator[Any]:
        """The batches on the device, each fetched when asked for; `consumer` is the look-ahead that
        fetches them one ahead (the facts of "the batch just yielded" are then of the one it holds)."""
        # the iteration starts now (a look-ahead calls this at the first batch asked for, as accelerate's
        # loader starts its iterator; a resumed epoch where the RNG state it draws goes back)
        self._consumer = consumer
        if callable(getattr(self._sampler, "set_epoch", None)):
            self._sampler.set_epoch(self.iteration)
        if self._synced is not None and self._runtime is not None:  # process 0's generator state
            self._synced.set_state(self._runtime.broadcast_object(self._synced.get_state()))
        self._yielded = 0
        inner = getattr(self.loader, "fetch_as_asked", None)
        return self._batches(inner(consumer) if callable(inner) else iter(self.loader), consumer)

    def _batches(self, iterator: Iterator[Any], consumer: Any) -> Iterator[Any]:
        try:
            for batch in iterator:
                self._yielded += 1
                yield batch if self.device is None else to_device(batch, self.device, self.non_blocking)
            self.iteration += 1
        finally:
            if consumer is None:
                self._yielded = 0  # the iteration is over: no batch of it is current any more

    def _position(self) -> int:
        """The index of the batch just yielded to the consumer (-1: none)."""
        consumer = self._consumer
        return consumer.position(self._yielded) if consumer is not None else self._yielded - 1

    @property
    def real_rows_in_step(self) -> int | None:
        """Of the global step just yielded (every process's batch, gathered in rank order), the
        first rows that are real samples (None: all are): `gather_for_metrics` keeps those."""
        if self.shard is not None:
            rows, i = self.shard.step_rows, self._position()
            return rows[i] if 0 <= i < len(rows) else None
        return getattr(self.loader, "real_rows_in_step", None)

    @property
    def real_rows_in_batch(self) -> int | None:
        """Of the batch just yielded, the first rows that are real samples where repeats complete
        the epoch's last (None: all are); the evaluation leaves the repeats out."""
        if self.shard is not None:
            rows, i = self.shard.real_rows, self._position()
            return rows[i] if 0 <= i < len(rows) else None
        return getattr(self.loader, "real_rows_in_batch", None)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("loader", "_consumer"):
            raise AttributeError(name)
        return getattr(self.loader, name)


def prepare_loader(
    loader: DataLoader,
    args: Any,
    runtime: Any,
    device: torch.device | None,
    even_batches: bool,
    data_seed: int | None,
) -> PreparedLoader:
    """`loader` prepared for this process (see the module docstring); `even_batches` is the
    accelerator's (a library may set it apart from `accelerator_config`)."""
    config = getattr(args, "accelerator_config", None)
    non_blocking = bool(getattr(config, "non_blocking", False))
    dealing = dataclasses.replace(DataDealing.of(loader.dataset, args, runtime), even=even_batches)
    if is_iterable_dataset(loader.dataset):
        if dealing.world == 1:
            return PreparedLoader(loader, device, non_blocking)
        return PreparedLoader(_dispatched(loader, dealing, runtime), device, non_blocking)
    batches = _batch_sampler(loader)
    sampler, synced = _ordered(batches, dealing, data_seed)
    if dealing.world == 1:
        return PreparedLoader(loader, device, non_blocking, sampler=sampler)
    if dealing.dispatch:
        raise NotImplementedError(
            "trainer.accelerator.prepare(DataLoader) of a map-style dataset with accelerator_config "
            "dispatch_batches=True: trainwright dispatches only iterable datasets' batches from process 0; "
            "leave dispatch_batches unset (None) or False, and each process loads its own batches."
        )
    if batches is None:
        raise ValueError(
            "trainer.accelerator.prepare(DataLoader) over several processes: the loader has no batch "
            "sampler to deal (batch_size=None without a BatchSampler); give it a batch_size or a batch_sampler."
        )
    shard = BatchShard(batches, dealing.world, dealing.rank, dealing.split, dealing.even)
    if isinstance(loader.sampler, BatchSampler):  # batches of indices fetched whole (batch_size=None)
        rebuilt = DataLoader(loader.dataset, sampler=shard, batch_size=None, **_loader_kwargs(loader))
    else:
        rebuilt = DataLoader(loader.dataset, batch_sampler=shard, **_loader_kwargs(loader))
    return PreparedLoader(
        rebuilt, device, non_blocking, shard=shard, sampler=sampler, synced=synced, runtime=runtime
    )


def _ordered(batches: Any, dealing: DataDealing, data_seed: int | None) -> tuple[Any, torch.Generator | None]:
    """The batch sampler's sampler, made seedable (use_seedable_sampler: a RandomSampler replaced in
    place, as accelerate does), and the generator process 0 hands the others at each iteration
    (without it: the sampler's own, carrying on from epoch to epoch)."""
    sampler: Any = getattr(batches, "sampler", None)
    if isinstance(sampler, RandomSampler) and dealing.seedable:
        seed = data_seed if data_seed is not None else torch.initial_seed()
        sampler = batches.sampler = EpochRandomSampler(sampler, seed)
        return sampler, None
    if dealing.seedable or not hasattr(sampler, "generator"):
        return sampler, None
    if sampler.generator is None:  # seeded from this process's RNG: process 0's is used
        sampler.generator = torch.Generator()
        sampler.generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
    return sampler, sampler.generator if dealing.world > 1 else None


def _dispatched(loader: DataLoader, dealing: DataDealing, runtime: Any) -> DispatchingLoader:
    """An iterable dataset's loader read by process 0 in global batches and dealt in slices."""
    if not dealing.dispatch:
        raise NotImplementedError(
            "trainer.accelerator.prepare(DataLoader) of an iterable dataset with accelerator_config "
            "dispatch_batches=False: each process would read the stream and keep its slice, the last "
            "batch completed with repeats that an evaluation could not leave out. Leave dispatch_batches "
            "unset (None) or True: process 0 reads the batches and deals them."
        )
    if loader.batch_size is None:
        raise ValueError(
            "trainer.accelerator.prepare(DataLoader) of an iterable dataset over several processes: its "
            "loader must batch the samples (batch_size), so that process 0 can deal whole batches."
        )
    # with split_batches, a batch size the processes do not divide is refused
    dealing.process_batch(loader.batch_size)
    size = dealing.loader_batch(loader.batch_size)
    base = DataLoader(loader.dataset, batch_size=size, drop_last=loader.drop_last, **_loader_kwargs(loader))
    return DispatchingLoader(base, runtime, loader.drop_last)
