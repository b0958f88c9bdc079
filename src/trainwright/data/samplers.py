"""Resumable samplers: the order is a function of (seed, epoch), never of the global RNG, and an
epoch can start at any position (``set_start``) without loading the samples before it.

A single process is world size 1 of the same sharding code that DDP ranks run.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import Sampler

from trainwright.data.distribute import DataDealing
from trainwright.data.kinds import has_length, is_hf_map_dataset, is_iterable_dataset

logger = logging.getLogger(__name__)


class ResumableSampler(Sampler[int]):
    """Sampler whose order depends only on (seed, epoch) and which can start mid-epoch.

    With ``num_replicas > 1`` it shards like ``DistributedSampler``: the epoch's order is padded
    (by repeating from its start) to a multiple of ``num_replicas`` unless ``drop_last`` (which
    cuts the tail instead), and rank ``r`` takes positions ``r::num_replicas``. Padded duplicates
    are the last sample of the last ``num_padding`` ranks; :func:`trainwright.loop.eval.gather.interleave_shards` turns
    gathered per-rank results back into dataset order so they can be trimmed.

    ``block`` (accelerate's ``split_batches``): the order is dealt in blocks of ``block`` positions
    instead of one, rank ``r`` taking blocks ``r, r + num_replicas, ...``, so that each global batch
    of ``block * num_replicas`` positions is split into one slice per rank; padding and cutting then
    work in whole global batches. ``even=False`` (accelerate's ``even_batches=False``): nothing is
    repeated, so ranks may hold different numbers of samples.

    ``set_start(k)``: the next iteration begins at this rank's ``k``-th sample of the epoch (no
    sample before it is produced). ``set_epoch(e)`` with a new epoch resets the start to 0, so a
    loop calls ``set_epoch`` then, when resuming, ``set_start``.
    """

    _identity_fields: tuple[str, ...] = ("num_samples", "num_replicas", "shuffle", "block", "even")
    # written by later versions only: a state saved without them was saved with these values
    _OPTIONAL_STATE = {"block": 1, "even": True}

    def __init__(
        self,
        num_samples: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        drop_last: bool = False,
        block: int = 1,
        even: bool = True,
        drawn_seed: bool = False,
    ) -> None:
        if not isinstance(block, int) or block < 1:
            raise ValueError(f"ResumableSampler: block must be an int >= 1, got {block!r}.")
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
        self.block, self.even = block, bool(even)
        self.drawn_seed = drawn_seed  # drawn from torch's global RNG: a checkpoint's seed replaces it quietly
        self.epoch = 0
        self.start = 0

    # -- geometry ---------------------------------------------------------------------------
    @property
    def _total(self) -> int:
        """Length of the epoch's order after padding / cutting, over all ranks."""
        n, group = self.num_samples, self.num_replicas * self.block
        if self.drop_last:
            return (n // group) * group
        return math.ceil(n / group) * group if self.even else n

    @property
    def num_padding(self) -> int:
        """Duplicated samples this epoch adds over all ranks (0 with drop_last)."""
        return max(self._total - self.num_samples, 0)

    def _rank_count(self, total: int, rank: int) -> int:
        """How many of the first `total` positions of the epoch's order go to `rank`."""
        group = self.num_replicas * self.block
        rounds, rest = divmod(total, group)
        return rounds * self.block + min(max(rest - rank * self.block, 0), self.block)

    def __len__(self) -> int:
        """This rank's samples in a whole epoch, whatever the start.

        The trainer derives steps per epoch (and so the schedule and the epoch of a resumed
        step) from this; a length that shrank after ``set_start`` would change them on resume.
        """
        return self._rank_count(self._total, self.rank)

    def rank_lengths(self) -> list[int]:
        """Every rank's samples per epoch (they differ only with ``even=False``)."""
        return [self._rank_count(self._total, r) for r in range(self.num_replicas)]

    @property
    def num_real(self) -> int:
        """This rank's samples that are not padding repeats."""
        return self._rank_count(min(self._total, self.num_samples), self.rank)

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
        if self.block == 1:
            return order[self.rank : total : self.num_replicas]
        mine = (torch.arange(total) // self.block) % self.num_replicas == self.rank
        return order[mine]

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
            "block": self.block,
            "even": self.even,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore epoch, start and seed; refuse a state whose order cannot match this sampler.

        The saved seed wins (with a warning when it differs) so that the interrupted epoch is
        replayed exactly.
        """
        state = {**self._OPTIONAL_STATE, **state}
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
        if int(state["seed"]) != self.seed and not self.drawn_seed:
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
    if is_hf_map_dataset(dataset):
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
        **sharding: Any,
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
            len(lengths),
            shuffle=True,
            seed=seed,
            num_replicas=num_replicas,
            rank=rank,
            drop_last=drop_last,
            **sharding,  # block, even, drawn_seed
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
    ``args.accelerator_config``'s data settings choose the sharding and the seed (`distribute.py`).
    """
    if is_iterable_dataset(dataset):
        return None
    n = len(dataset)
    dealing = DataDealing.of(dataset, args, runtime)
    field = "per_device_train_batch_size" if train else "per_device_eval_batch_size"
    per_device = batch_size if batch_size else int(getattr(args, field, 1))
    shard = dealing.sharding(per_device)
    if not train:
        return ResumableSampler(n, shuffle=False, drop_last=False, **shard)
    seed = args.data_seed if args.data_seed is not None else args.seed
    drawn = not dealing.seedable
    if drawn:  # use_seedable_sampler=False: the order comes from torch's global RNG
        seed = dealing.draw_seed(runtime)
    strategy = getattr(args, "train_sampling_strategy", "random") or "random"
    if getattr(args, "group_by_length", False):
        strategy = "group_by_length"
    if strategy not in _STRATEGIES:
        raise ValueError(f"train_sampling_strategy must be one of {list(_STRATEGIES)}, got {strategy!r}.")
    drop_last = bool(args.dataloader_drop_last)
    if strategy == "group_by_length":
        return LengthGroupedSampler(
            dealing.process_batch(per_device) if not dealing.dispatch else dealing.loader_batch(per_device),
            dataset=dataset,
            length_column_name=args.length_column_name,
            seed=seed,
            drop_last=drop_last,
            drawn_seed=drawn,
            **shard,
        )
    return ResumableSampler(
        n, shuffle=strategy == "random", seed=seed, drop_last=drop_last, drawn_seed=drawn, **shard
    )
