"""Which process loads which batch: `accelerator_config`'s data settings, as accelerate defines them.

- `split_batches=True`: the loader's batch (`per_device_*_batch_size`) is the global batch; each of
  the N processes gets 1/N of it (the batch size must divide by N). A sampler deals the epoch's
  order in blocks (`ResumableSampler(block=...)`), an iterable dataset is cut per chunk.
- `dispatch_batches` (None: True for an iterable dataset, as accelerate): process 0 alone iterates
  the data, one global batch at a time (`per_device x N` samples, or `per_device` with
  `split_batches`), sends it to every process, and each takes its slice (`DispatchingLoader`). The
  last incomplete global batch is completed with samples of the first, as accelerate's
  `DataLoaderDispatcher` does (unless `dataloader_drop_last`); evaluation cuts them again. One
  difference: the global batch is collated at once (accelerate collates each process's part apart
  and refuses parts of different shapes), so a padding collator pads it to its longest sample.
- `dispatch_batches=False` with an iterable dataset: every process reads the whole stream and
  keeps its slice of each chunk (`IterableShard`, accelerate's `IterableDatasetShard`).
- `even_batches=False`: a sampler repeats no sample to even out the processes
  (`ResumableSampler(even=False)`); iterable data is always evened out (as accelerate).
- `use_seedable_sampler=False`: the shuffling seed is drawn from torch's global RNG (process 0's
  draw) instead of `data_seed` / `seed`; it is kept in the sampler's state, so a resume is exact.

A library's own DataLoader (`trainer.accelerator.prepare(loader)`, `data/prepared.py`) is dealt by
its batch sampler's batches: `BatchShard`, accelerate's `BatchSamplerShard`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.utils.data import IterableDataset

from trainwright.core.nested import concat_batches, slice_batch
from trainwright.data.kinds import is_iterable_dataset


def _config(args: Any, key: str, default: Any) -> Any:
    config = getattr(args, "accelerator_config", None)
    return getattr(config, key, default) if config is not None else default


@dataclass(frozen=True)
class DataDealing:
    """The data settings for one dataset on this process; see the module docstring."""

    world: int
    rank: int
    split: bool
    dispatch: bool
    even: bool
    seedable: bool

    @classmethod
    def of(cls, dataset: Any, args: Any, runtime: Any) -> DataDealing:
        # data-parallel ranks: processes that share a batch (tensor-parallel peers) are one
        world, dispatch = int(runtime.data_world_size), _config(args, "dispatch_batches", None)
        return cls(
            world=world,
            rank=int(runtime.data_rank),
            split=bool(_config(args, "split_batches", False)),
            dispatch=world > 1 and (is_iterable_dataset(dataset) if dispatch is None else bool(dispatch)),
            even=_config(args, "even_batches", True) is not False,
            seedable=_config(args, "use_seedable_sampler", True) is not False,
        )

    def process_batch(self, batch_size: int) -> int:
        """Samples per batch on each process for a loader batch of `batch_size`."""
        if not self.split:
            return batch_size
        if batch_size % self.world:
            raise ValueError(
                f"accelerator_config['split_batches']=True: the batch size ({batch_size}) is the global batch, "
                f"split over {self.world} processes; it must be a multiple of {self.world}"
            )
        return batch_size // self.world

    def loader_batch(self, batch_size: int) -> int:
        """The batch size of the torch DataLoader this process builds."""
        if self.dispatch:  # process 0 reads whole global batches
            return batch_size if self.split else batch_size * self.world
        return self.process_batch(batch_size)

    def sharding(self, batch_size: int) -> dict[str, Any]:
        """`ResumableSampler` keyword arguments: who takes which positions of the epoch's order."""
        if self.dispatch:  # one global order, read by process 0 and dealt by the DispatchingLoader
            return {"num_replicas": 1, "rank": 0}
        block = self.process_batch(batch_size) if self.split else 1
        return {"num_replicas": self.world, "rank": self.rank, "block": block, "even": self.even}

    def check_same_steps(self, sampler: Any, batch_size: int) -> None:
        """Training with `even_batches=False`: every process must take the same number of steps
        (each waits for the others in its step's gradient all-reduce), so an epoch that would give
        them different numbers of batches is refused rather than left to hang."""
        if self.even or self.dispatch or not hasattr(sampler, "rank_lengths"):
            return
        per = self.process_batch(batch_size)
        batches = [-(-n // per) for n in sampler.rank_lengths()]
        if len(set(batches)) > 1:
            raise ValueError(
                f"accelerator_config['even_batches']=False: {sampler.num_samples} training samples in batches of "
                f"{per} give the {self.world} processes {batches} batches per epoch, but every process must "
                "take the same number of optimizer steps (each waits for the others in the gradient "
                "all-reduce). Use even_batches=True (samples are repeated to even them out), "
                "dataloader_drop_last=True, or a dataset size that divides evenly."
            )

    def draw_seed(self, runtime: Any) -> int:
        """A shuffling seed from torch's global RNG (every process draws, process 0's is used)."""
        drawn = int(torch.empty((), dtype=torch.int64).random_().item())
        return int(runtime.broadcast_object(drawn))

    def dataset(self, dataset: Any, batch_size: int, drop_last: bool, train: bool) -> Any:
        """The dataset this process's DataLoader reads (an iterable one cut per process)."""
        if self.dispatch or self.world == 1 or not is_iterable_dataset(dataset):
            return dataset
        return IterableShard(
            dataset, batch_size, drop_last, self.world, self.rank, self.split, complete=train
        )

    def wrap(self, loader: Any, runtime: Any, drop_last: bool) -> Any:
        """`loader` itself, or the DispatchingLoader around it."""
        return DispatchingLoader(loader, runtime, drop_last) if self.dispatch else loader


class IterableShard(IterableDataset):
    """accelerate's `IterableDatasetShard`: the whole stream is read; of each chunk of
    `batch_size x processes` samples (`batch_size` with `split`) this process yields its slice. In
    training (`complete`) the last incomplete chunk is completed with the first chunk's samples,
    unless `drop_last`, so that every process takes the same number of steps; an evaluation leaves
    it incomplete (accelerate completes it and drops the repeats when gathering: the same results).
    Its state (`state_dict`) is the dataset's, the same on every process.

    accelerate reads only this process's shards of a `datasets.IterableDataset` that has at least
    one per process; trainwright reads the stream on every process, so that the processes never
    run out of data at different steps (which would leave them waiting for each other)."""

    deals_whole_batches = True  # each process's batch is a contiguous slice of a chunk

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        drop_last: bool,
        num_processes: int,
        process_index: int,
        split: bool,
        complete: bool = True,
    ) -> None:
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.num_processes, self.process_index, self.split = num_processes, process_index, split
        self.complete = complete
        if callable(getattr(dataset, "state_dict", None)) and callable(
            getattr(dataset, "load_state_dict", None)
        ):
            self.state_dict, self.load_state_dict = dataset.state_dict, dataset.load_state_dict

    def set_epoch(self, epoch: int) -> None:
        if callable(getattr(self.dataset, "set_epoch", None)):
            self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        chunk_size = self.batch_size if self.split else self.batch_size * self.num_processes
        mine = chunk_size // self.num_processes if self.split else self.batch_size
        lo, hi = self.process_index * mine, (self.process_index + 1) * mine
        first: list[Any] | None = None
        chunk: list[Any] = []
        for item in self.dataset:
            chunk.append(item)
            if len(chunk) == chunk_size:
                yield from chunk[lo:hi]
                first = chunk if first is None else first
                chunk = []
        if chunk and not self.drop_last:
            first = chunk if first is None else first
            while self.complete and len(chunk) < chunk_size:
                chunk = chunk + first
            yield from chunk[lo:hi]


class BatchShard:
    """accelerate's `BatchSamplerShard`: this process's batches of a batch sampler's epoch.

    Without `split`, the batches are dealt in turn (batch i to process i % N), a group of N going
    out once its last batch is whole; with `split`, each batch is cut into N slices of
    `batch_size / N`, one per process. The end of the epoch follows the batch sampler's `drop_last`
    (an incomplete group, or a last short batch, is dropped) or else `even`: every process gets a
    whole batch, the missing samples taken in order from the epoch's first batches (the first N
    batches, or the first batch with `split`), or, with `even=False`, what is there. For each batch
    of the iteration under way, `real_rows` holds how many of its first rows are real samples where
    repeats complete it (None: all are), and `step_rows` how many of the global step's are (the
    first ones of the processes' batches gathered in rank order; None: all are)."""

    deals_whole_batches = True  # each process's batch is one batch (or a slice) of a global step

    def __init__(self, batch_sampler: Any, world: int, rank: int, split: bool, even: bool) -> None:
        self.batch_sampler, self.world, self.rank = batch_sampler, world, rank
        self.split, self.even = split, even
        self.batch_size: int | None = getattr(batch_sampler, "batch_size", None)
        self.drop_last = bool(getattr(batch_sampler, "drop_last", False))
        if split and (self.batch_size is None or self.batch_size % world):
            raise ValueError(
                f"accelerator_config['split_batches']=True: the batch sampler's batch size ({self.batch_size}) "
                f"is the global batch, split over {world} processes; it must be a multiple of {world}"
            )
        self.real_rows: list[int | None] = []
        self.step_rows: list[int | None] = []

    def set_epoch(self, epoch: int) -> None:
        """The epoch, to the batch sampler and its sampler (as accelerate's loader and transformers'
        loop set it on them)."""
        obj: Any
        for obj in (self.batch_sampler, getattr(self.batch_sampler, "sampler", None)):
            if callable(getattr(obj, "set_epoch", None)):
                obj.set_epoch(epoch)

    def __len__(self) -> int:
        batches = len(self.batch_sampler)
        if self.split:
            return batches
        whole, rest = divmod(batches, self.world)
        if not rest or self.drop_last:
            return whole
        return whole + 1 if self.even or self.rank < rest else whole

    def __iter__(self) -> Iterator[list[int]]:
        # before the first batch is asked for: a loader's iterator reads ahead
        self.real_rows, self.step_rows = [], []
        return self._sliced() if self.split else self._dealt()

    def _out(self, batch: list[int], real: int | None = None, step: int | None = None) -> list[int]:
        self.real_rows.append(real)
        self.step_rows.append(step)
        return batch

    def _sliced(self) -> Iterator[list[int]]:
        size = cast(int, self.batch_size)
        per = size // self.world
        lo, hi = self.rank * per, (self.rank + 1) * per
        first: list[int] = []
        last: list[int] = []
        for batch in self.batch_sampler:
            last = list(batch)
            first = first or last
            if len(last) == size:
                yield self._out(last[lo:hi])
        if self.drop_last or not last or len(last) == size:
            return
        if not self.even:
            if len(last) > lo:
                yield self._out(last[lo:hi])
            return
        completed = last + [first[i % len(first)] for i in range(size)]
        yield self._out(completed[lo:hi], min(max(len(last) - lo, 0), per), len(last))

    def _dealt(self) -> Iterator[list[int]]:
        size, world, rank = self.batch_size, self.world, self.rank
        head: list[list[int]] = []  # the epoch's first batches: the repeats that complete its end
        group: list[list[int]] = []
        for batch in self.batch_sampler:
            group.append(list(batch))
            if len(head) < world:
                head.append(group[-1])
            if len(group) == world and (size is None or len(group[-1]) == size):
                yield self._out(group[rank])
                group = []
        if not group or self.drop_last:
            return
        mine = group[rank] if rank < len(group) else None
        if not self.even:
            if mine:
                yield self._out(mine)
            return
        yield from self._evened(group, head)

    def _evened(self, group: list[list[int]], head: list[list[int]]) -> Iterator[list[int]]:
        """The last group of the epoch made whole: a short last batch completed and the missing
        batches made of repeats, in order from the epoch's first batches."""
        size, rank = self.batch_size, self.rank
        step = sum(len(b) for b in group)  # the real samples of this last global step
        if rank < len(group) and (size is None or len(group[rank]) == size):
            yield self._out(group[rank], None, step)
            return
        flat = [i for b in head for i in b]
        short = size is not None and len(group[-1]) < size  # the epoch's last batch, to complete
        taken = 0
        for slot in range(len(group) - 1 if short else len(group), self.world):
            own = group[slot] if slot < len(group) else []
            if size is None:  # batches of any size: whole batches repeated
                batch = head[taken % len(head)]
                taken += 1
            else:
                need = size - len(own)
                batch = own + [flat[(taken + i) % len(flat)] for i in range(need)]
                taken += need
            if slot == rank:
                yield self._out(batch, len(own), step)
                return


def batch_rows(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    values = (
        batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    )
    for value in values:
        rows = batch_rows(value)
        if rows >= 0:
            return rows
    return -1


class _RankView:
    """The sampler of a dispatched map-style loader as one process sees it: positions and lengths
    in this process's samples (a global batch of N x b samples gives each process b)."""

    def __init__(self, sampler: Any, world: int, rank: int, per_process: int, drop_last: bool) -> None:
        self.base, self.num_replicas, self.rank = sampler, world, rank
        self.per_process, self.drop_last = per_process, drop_last
        self.num_padding = 0  # the DispatchingLoader marks the rows it repeats

    def __len__(self) -> int:
        total, group = len(self.base), self.num_replicas * self.per_process
        return (total // group) * self.per_process if self.drop_last else -(-total // self.num_replicas)

    @property
    def epoch(self) -> int:
        return int(self.base.epoch)

    def set_epoch(self, epoch: int) -> None:
        self.base.set_epoch(epoch)

    def set_start(self, position: int) -> None:
        self.base.set_start(min(position * self.num_replicas, len(self.base)))

    def state_dict(self) -> dict[str, Any]:
        return dict(self.base.state_dict())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.base.load_state_dict(state)


class DispatchingLoader:
    """accelerate's `DataLoaderDispatcher`: process 0 iterates `base` (whole global batches), sends
    each batch to every process, and each yields its slice. `real_rows_in_batch` is, for the batch
    just yielded (to the look-ahead's consumer, where one fetches them: `fetch_as_asked`), how many
    of its rows are not repeats completing the last batch (None: all)."""

    deals_whole_batches = True  # each process's batch is a contiguous slice of a global batch

    def __init__(self, base: Any, runtime: Any, drop_last: bool) -> None:
        self.base, self.runtime, self.drop_last = base, runtime, drop_last
        self.world, self.rank = int(runtime.data_world_size), int(runtime.data_rank)  # whose slice
        self.reader = runtime.is_main_process  # process 0 reads the data for everyone
        self.dataset = base.dataset
        self.batch_size = base.batch_size // self.world if base.batch_size else None
        sampler = getattr(base, "sampler", None)
        self.sampler = (
            _RankView(sampler, self.world, self.rank, self.batch_size or 1, drop_last)
            if hasattr(sampler, "set_start")
            else None
        )
        self._fetched = 0  # batches handed over in this iteration
        self._completed: tuple[int, int, int] | None = None  # the last batch: (index, real rows, global rows)
        self._consumer: Any = None  # the look-ahead that holds the batches (`look_ahead.LookAhead`)

    def set_epoch(self, epoch: int) -> None:
        if callable(getattr(self.base, "set_epoch", None)):
            self.base.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.base)  # one batch per global batch; TypeError for data without a length

    def _fetch(self, iterator: Iterator[Any] | None) -> Any:
        batch = None
        if self.reader:
            assert iterator is not None
            batch = next(iterator, None)
        return self.runtime.broadcast_object(batch)

    def _facts(self) -> tuple[int, int, int] | None:
        """The completed last batch's facts, while it is the batch just yielded."""
        completed, consumer = self._completed, self._consumer
        index = consumer.position(self._fetched) if consumer is not None else self._fetched - 1
        return completed if completed is not None and completed[0] == index else None

    @property
    def real_rows_in_batch(self) -> int | None:
        facts = self._facts()
        return None if facts is None else facts[1]

    @property
    def real_rows_in_step(self) -> int | None:
        """Of the global batch just yielded, its rows before the repeats (None: no repeats)."""
        facts = self._facts()
        return None if facts is None else facts[2]

    def __iter__(self) -> Iterator[Any]:
        return self.fetch_as_asked(None)

    def fetch_as_asked(self, consumer: Any = None) -> Iterator[Any]:
        """The slices, each global batch read when asked for; `consumer`: the look-ahead holding them."""
        self._consumer, self._fetched, self._completed = consumer, 0, None
        return self._slices(iter(self.base) if self.reader else None)  # started now, as torch's loader

    def _slices(self, iterator: Iterator[Any] | None) -> Iterator[Any]:
        # Process 0 reads one global batch per batch asked for: its dataset's state (what a
        # checkpoint keeps of an iterable dataset) is then exactly the batches handed out.
        first = None
        while (batch := self._fetch(iterator)) is not None:
            first = batch if first is None else first
            rows = batch_rows(batch)
            if rows < 0:
                raise TypeError(
                    "accelerator_config dispatch_batches: a batch with no tensor cannot be split between "
                    f"processes (got a {type(batch).__name__}); collate samples into tensors"
                )
            per = -(-rows // self.world)
            if rows % self.world:  # the last global batch: complete it with the first one's samples
                while batch_rows(batch) < per * self.world:
                    batch = concat_batches(batch, slice_batch(first, slice(0, self.world)))
                self._completed = (self._fetched, min(max(rows - self.rank * per, 0), per), rows)
            self._fetched += 1
            yield slice_batch(batch, slice(self.rank * per, (self.rank + 1) * per))
        if self._consumer is None:
            self._completed = None  # the iteration is over: no batch of it is current any more
