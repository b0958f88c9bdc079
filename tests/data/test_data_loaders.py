"""Dataloaders of trainwright.data: resume that loads only the remaining samples, worker seeding
that depends only on seed, epoch and position, loader settings, and iterable-dataset resume."""

from __future__ import annotations

import json
import random
import warnings
import weakref

import numpy as np
import pytest
import torch
from data_kit import CPU, PlainDataset, RangeStream, make_args
from torch.utils.data import DataLoader, IterableDataset

from trainwright.data import (
    EpochSeededDataLoader,
    ResumableSampler,
    default_data_collator,
    has_length,
    iterable_resume_state,
    load_iterable_resume_state,
    make_dataloader,
    num_examples,
    skip_iterable,
)


class CountingDataset(PlainDataset):
    """Appends every index it loads to a file, so loads in worker processes are counted too."""

    def __init__(self, n: int, log_path: str) -> None:
        super().__init__(n)
        self.log_path = log_path

    def __getitem__(self, idx: int) -> dict:
        with open(self.log_path, "a") as f:
            f.write(f"{idx}\n")
        return super().__getitem__(idx)

    def loaded(self) -> list[int]:
        try:
            with open(self.log_path) as f:
                return [int(line) for line in f]
        except FileNotFoundError:
            return []


class RandomDataset(PlainDataset):
    """Every item draws from the torch, numpy and random global RNGs."""

    def __getitem__(self, idx: int) -> dict:
        return {"idx": idx, "t": torch.rand(()).item(), "np": float(np.random.rand()), "py": random.random()}


class RandomStream(IterableDataset):
    """Each worker yields draws from its own RNG, seeded from the loader's base seed."""

    def __iter__(self):
        return iter([torch.rand(()).item() for _ in range(4)])


def build_loader(
    data, batch_size=2, sampler=None, collate_fn=default_data_collator, args=None, seed=0, **kwargs
) -> EpochSeededDataLoader:
    """make_dataloader with the settings most tests here share: no drop_last, stand-in arguments."""
    args = make_args() if args is None else args
    return make_dataloader(
        data,
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=collate_fn,
        args=args,
        drop_last=False,
        seed=seed,
        **kwargs,
    )


def as_rows(batches: list[dict]) -> list[tuple]:
    """Batches as comparable tuples of exact values."""
    return [tuple((k, tuple(v.tolist())) for k, v in sorted(b.items())) for b in batches]


# ---------------------------------------------------------------------------------- dataloaders
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_loads_only_remaining_samples(tmp_path, workers):
    n, bs = 20, 2
    args = make_args(dataloader_num_workers=workers)

    def loader(log):
        data = CountingDataset(n, str(tmp_path / log))
        sampler = ResumableSampler(n, seed=1)
        dl = build_loader(data, batch_size=bs, sampler=sampler, args=args, seed=1)
        return data, sampler, dl

    data, _, dl = loader("full.txt")
    full = [b["idx"].tolist() for b in dl]
    assert len(data.loaded()) == n

    data, sampler, dl = loader("resumed.txt")
    sampler.set_start(8)  # 40% of the epoch
    tail = [b["idx"].tolist() for b in dl]
    assert tail == full[4:]
    assert sorted(data.loaded()) == sorted(i for b in full[4:] for i in b)  # nothing skipped was loaded
    assert len(data.loaded()) == 12
    assert len(dl) == 10  # the dataloader still describes a whole epoch


def _random_loader(workers: int, persistent: bool = False, n: int = 16, bs: int = 4) -> EpochSeededDataLoader:
    args = make_args(dataloader_num_workers=workers, dataloader_persistent_workers=persistent)
    return build_loader(
        RandomDataset(n), batch_size=bs, sampler=ResumableSampler(n, seed=3), args=args, seed=11
    )


def _epoch(dl: EpochSeededDataLoader, epoch: int, start: int = 0) -> list[tuple]:
    dl.set_epoch(epoch)
    dl.sampler.set_start(start)
    return as_rows(list(dl))


@pytest.mark.parametrize("persistent", [False, True])
def test_worker_random_values_depend_only_on_seed_epoch_and_position(persistent):
    continued = _random_loader(2, persistent)
    epoch0 = _epoch(continued, 0)
    epoch1 = _epoch(continued, 1)
    assert epoch0 != epoch1
    values = [v for row in epoch1 for k, vs in row if k == "t" for v in vs]
    assert len(set(values)) == len(values)  # every sample drew its own numbers

    assert _epoch(_random_loader(2, persistent), 1) == epoch1  # fresh loader, epoch 1 directly
    assert _epoch(_random_loader(2, persistent), 1, start=8) == epoch1[2:]  # resumed mid-epoch
    assert _epoch(_random_loader(1, persistent), 1) == epoch1  # even with another worker count

    # no reference cycle: dropping the loader shuts its (persistent) workers down at once
    ref = weakref.ref(continued)
    del continued
    assert ref() is None


def test_worker_base_seeds_depend_only_on_seed_and_epoch():
    def loader():
        args = make_args(dataloader_num_workers=2)
        return build_loader(RandomStream(), collate_fn=None, args=args, seed=5)

    def epoch(dl, e):
        dl.set_epoch(e)
        return [b.tolist() for b in dl]

    continued = loader()
    first, second = epoch(continued, 0), epoch(continued, 1)
    assert first != second
    assert epoch(loader(), 1) == second  # a resumed run's workers draw the same numbers
    assert epoch(loader(), 0) == first


def test_without_workers_the_loader_draws_as_torchs_loader_and_resume_is_exact():
    def loader():
        return build_loader(PlainDataset(8), sampler=ResumableSampler(8, seed=0))

    torch.manual_seed(123)
    states = (np.random.get_state()[1].copy(), random.getstate())
    list(loader())
    ours = torch.get_rng_state()
    assert np.array_equal(states[0], np.random.get_state()[1]) and states[1] == random.getstate()
    torch.manual_seed(123)
    list(DataLoader(PlainDataset(8), batch_size=2))  # draws its base seed from the global RNG
    assert torch.equal(ours, torch.get_rng_state())  # the model's random stream is a plain loader's
    # an epoch resumed mid-way draws nothing: its checkpoint's RNG state came after the start's draw
    resumed = loader()
    resumed.sampler.set_start(4)
    before = torch.get_rng_state()
    assert len(list(resumed)) == 2
    assert torch.equal(before, torch.get_rng_state())

    # the data draws from the process RNG; restoring it at the resume point replays the tail exactly
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    uninterrupted, saved = _random_loader(0), None
    uninterrupted.set_epoch(1)
    rows = []
    for i, batch in enumerate(uninterrupted):
        rows.append(batch)
        if i == 1:
            saved = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    resumed = _random_loader(0)
    resumed.set_epoch(1)
    resumed.sampler.set_start(8)
    torch.set_rng_state(saved[0])
    np.random.set_state(saved[1])
    random.setstate(saved[2])
    assert as_rows(list(resumed)) == as_rows(rows)[2:]


def test_make_dataloader_settings():
    sampler = ResumableSampler(10, seed=0)
    args = make_args(
        dataloader_num_workers=2, dataloader_persistent_workers=True, dataloader_prefetch_factor=3
    )
    dl = make_dataloader(
        PlainDataset(10),
        batch_size=4,
        sampler=sampler,
        collate_fn=None,
        args=args,
        drop_last=True,
        seed=0,
        device=CPU,
    )
    assert isinstance(dl, EpochSeededDataLoader)
    assert dl.num_workers == 2 and dl.persistent_workers and dl.prefetch_factor == 3
    assert dl.pin_memory is False  # pinned memory only helps copies to a CUDA device
    assert dl.batch_size == 4 and dl.drop_last and len(dl) == 2
    assert dl.worker_init_fn is not None
    dl.set_epoch(5)
    assert sampler.epoch == 5 and dl.epoch == 5
    sampler.set_start(4)
    assert len(dl) == 2

    epochs = iter([7])
    dl2 = build_loader(PlainDataset(4), collate_fn=None, epoch_getter=lambda: next(epochs))
    assert dl2.epoch == 7 and dl2.pin_memory is False and dl2.prefetch_factor is None
    with pytest.raises(ValueError, match="batch_size"):
        build_loader(PlainDataset(4), batch_size=0, collate_fn=None)


def test_num_examples_and_has_length():
    assert num_examples(DataLoader(PlainDataset(9), batch_size=4)) == 9
    assert has_length([1, 2]) and not has_length(RangeStream(3)) and not has_length(5)
    with pytest.raises(ValueError, match="length"):
        num_examples(DataLoader(RangeStream(3), batch_size=2))

    class Sized(IterableDataset):
        def __iter__(self):
            return iter(range(6))

        def __len__(self):
            return 6

    assert num_examples(DataLoader(Sized(), batch_size=4)) == 6


# ---------------------------------------------------------------------------------- iterable resume
def test_skip_iterable_warns_once_and_skips():
    dl = DataLoader(RangeStream(10), batch_size=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rest = [b.tolist() for b in skip_iterable(dl, 2)]
    assert rest == [[4, 5], [6, 7], [8, 9]]
    assert len(caught) == 1 and "Skipping 2 batches by iterating" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(skip_iterable(dl, 0))) == 5
    with pytest.raises(ValueError, match="num_batches"):
        skip_iterable(dl, -1)


def test_iterable_dataset_state_resumes_without_skipping():
    import datasets

    def stream():
        return datasets.Dataset.from_dict({"x": list(range(10))}).to_iterable_dataset()

    full = [b["x"].tolist() for b in DataLoader(stream(), batch_size=2)]
    first = stream()
    it = iter(DataLoader(first, batch_size=2))
    next(it), next(it)
    state = iterable_resume_state(first)
    assert state is not None and iterable_resume_state(RangeStream(3)) is None

    resumed = stream()
    load_iterable_resume_state(resumed, json.loads(json.dumps(state)))
    assert [b["x"].tolist() for b in DataLoader(resumed, batch_size=2)] == full[2:]
    with pytest.raises(ValueError, match="load_state_dict"):
        load_iterable_resume_state(RangeStream(3), state)


def test_a_resumed_iterable_that_ends_before_its_saved_position_is_refused():
    with pytest.raises(ValueError, match="data ended after 2 of the 5 batches.*ignore_data_skip=True"):
        skip_iterable(DataLoader(list(range(4)), batch_size=2), 5)


def test_the_batch_seeding_holds_the_loaders_values_not_the_loader():
    """The tagged batch sampler (held by a persistent-worker loader's iterator) is built from the
    loader's seed, rank and epoch source: no reference back to the loader, and it still seeds by the
    epoch the loader selects."""
    loader = EpochSeededDataLoader(list(range(8)), seed=3, batch_size=2, num_workers=1)
    loader.set_epoch(2)
    batches = loader._index_sampler
    seeds = [batch.seed for batch in batches]
    ref = weakref.ref(loader)
    del loader
    assert ref() is None  # freed at once: nothing points back at it
    assert [batch.seed for batch in batches] == seeds and len(set(seeds)) == 4
