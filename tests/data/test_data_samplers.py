"""Samplers of trainwright.data: ResumableSampler's exact, seed-only order and resume position,
length grouping, and build_sampler's choice by training arguments."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
from data_kit import CPU, PlainDataset, RangeStream, make_args

from trainwright.core.runtime import Runtime
from trainwright.data import LengthGroupedSampler, ResumableSampler, build_sampler


# ---------------------------------------------------------------------------------- ResumableSampler
def test_order_depends_only_on_seed_and_epoch():
    fresh = ResumableSampler(50, seed=3)
    fresh.set_epoch(2)
    target = list(fresh)

    walked = ResumableSampler(50, seed=3)
    for epoch in range(3):
        walked.set_epoch(epoch)
        torch.manual_seed(epoch + 1000)  # the global RNG must not matter
        order = list(walked)
    assert order == target
    assert sorted(target) == list(range(50))

    other = ResumableSampler(50, seed=3)
    other.set_epoch(1)
    assert list(other) != target
    reseeded = ResumableSampler(50, seed=4)
    reseeded.set_epoch(2)
    assert list(reseeded) != target
    assert list(ResumableSampler(5, shuffle=False)) == [0, 1, 2, 3, 4]


def test_iterating_does_not_touch_global_rng():
    before = torch.get_rng_state()
    list(ResumableSampler(100, seed=1))
    assert torch.equal(before, torch.get_rng_state())


def test_set_start_gives_exactly_the_tail():
    sampler = ResumableSampler(30, seed=7)
    sampler.set_epoch(1)
    full = list(sampler)
    for k in (0, 1, 12, 29, 30):
        sampler.set_start(k)
        assert list(sampler) == full[k:]
        assert len(sampler) == 30  # a whole epoch whatever the start
    sampler.set_start(5)
    sampler.set_epoch(1)  # same epoch (e.g. after load_state_dict): the position stays
    assert sampler.start == 5
    sampler.set_epoch(2)  # a new epoch starts at its beginning
    assert sampler.start == 0
    for bad in (-1, 31, 2.5):
        with pytest.raises(ValueError, match="set_start"):
            sampler.set_start(bad)


def test_sharding_two_ranks_covers_dataset_and_records_padding():
    n = 11
    ranks = [ResumableSampler(n, seed=5, num_replicas=2, rank=r) for r in range(2)]
    orders = [list(s) for s in ranks]
    assert [len(s) for s in ranks] == [6, 6] and [len(o) for o in orders] == [6, 6]
    assert set(orders[0]) | set(orders[1]) == set(range(n))
    assert ranks[0].num_padding == 1
    counts = Counter(orders[0] + orders[1])
    assert sum(c - 1 for c in counts.values()) == 1  # exactly one duplicate
    # rank r takes positions r::2 of the whole padded epoch
    single = ResumableSampler(n, seed=5)
    padded = list(single) + list(single)[:1]
    assert orders[0] == padded[0::2] and orders[1] == padded[1::2]

    dropped = [ResumableSampler(n, seed=5, num_replicas=2, rank=r, drop_last=True) for r in range(2)]
    assert [len(s) for s in dropped] == [5, 5] and dropped[0].num_padding == 0
    assert len(set(list(dropped[0]) + list(dropped[1]))) == 10

    with pytest.raises(ValueError, match="rank"):
        ResumableSampler(10, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="num_replicas"):
        ResumableSampler(10, num_replicas=0)


def test_state_dict_round_trip_and_mismatch_errors():
    sampler = ResumableSampler(40, seed=9, num_replicas=2, rank=1)
    sampler.set_epoch(3)
    sampler.set_start(7)
    state = json.loads(json.dumps(sampler.state_dict()))  # plain JSON values
    assert state == {
        "epoch": 3,
        "seed": 9,
        "start": 7,
        "num_samples": 40,
        "num_replicas": 2,
        "shuffle": True,
        "drop_last": False,
        "block": 1,
        "even": True,
    }
    restored = ResumableSampler(40, seed=9, num_replicas=2, rank=1)
    restored.load_state_dict(state)
    assert list(restored) == list(sampler) and restored.epoch == 3 and restored.start == 7
    # a state written before block/even existed is read as the default dealing it was saved with
    older = ResumableSampler(40, seed=9, num_replicas=2, rank=1)
    older.load_state_dict({k: v for k, v in state.items() if k not in ("block", "even")})
    assert list(older) == list(sampler)
    with pytest.raises(ValueError, match="block differs"):
        ResumableSampler(40, seed=9, num_replicas=2, rank=1, block=4).load_state_dict(state)

    for field, value in (("num_samples", 41), ("num_replicas", 1), ("shuffle", False)):
        kwargs = {"num_samples": 40, "num_replicas": 2, "shuffle": True, "rank": 0, field: value}
        other = ResumableSampler(kwargs.pop("num_samples"), **kwargs)
        with pytest.raises(ValueError, match=rf"{field} differs \(saved .*, now .*\)"):
            other.load_state_dict(state)
    with pytest.raises(ValueError, match="lacks"):
        restored.load_state_dict({"epoch": 1})

    reseeded = ResumableSampler(40, seed=1, num_replicas=2, rank=1)
    with pytest.warns(UserWarning, match="seed 9 replaces 1"):
        reseeded.load_state_dict(state)
    assert list(reseeded) == list(sampler)


# ---------------------------------------------------------------------------------- length grouping
def _batches(order: list[int], size: int) -> list[list[int]]:
    return [order[i : i + size] for i in range(0, len(order), size)]


def test_length_grouped_sampler_groups_similar_lengths_longest_first():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 500, (400,), generator=gen).tolist()
    sampler = LengthGroupedSampler(4, lengths=lengths, seed=1)
    order = list(sampler)
    assert sorted(order) == list(range(400))
    assert lengths[order[0]] == max(lengths)  # the longest batch comes first

    # each mega-batch (4 * 25 = 100 samples for 400 items) is sorted longest first
    assert sampler.mega_batch_mult == 25
    for mega in _batches(order, 100):
        mega_lengths = [lengths[i] for i in mega]
        assert mega_lengths == sorted(mega_lengths, reverse=True)

    # similar lengths within a batch: far less spread than a random order
    def spread(o):
        return np.mean([max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in _batches(o, 4)])

    assert spread(order) < spread(list(ResumableSampler(400, seed=1))) / 5

    again = LengthGroupedSampler(4, lengths=lengths, seed=1)
    assert list(again) == order  # deterministic from (seed, epoch)
    again.set_epoch(1)
    assert list(again) != order
    again.set_start(10)
    epoch1 = LengthGroupedSampler(4, lengths=lengths, seed=1)
    epoch1.set_epoch(1)
    assert list(again) == list(epoch1)[10:]


def test_length_grouped_sampler_shards_by_global_batch_and_checks_state():
    lengths = list(range(1, 81))
    ranks = [LengthGroupedSampler(2, lengths=lengths, seed=0, num_replicas=2, rank=r) for r in range(2)]
    orders = [list(s) for s in ranks]
    assert set(orders[0]) | set(orders[1]) == set(range(80))
    # grouping uses the global batch (2 ranks x 2): batch i of both ranks is one window of 4
    # neighbours in the single-process order for batch size 4, which is sorted within mega-batches
    single = list(LengthGroupedSampler(4, lengths=lengths, seed=0))
    for i, (b0, b1) in enumerate(zip(_batches(orders[0], 2), _batches(orders[1], 2))):
        window = single[4 * i : 4 * i + 4]
        assert b0 == window[0::2] and b1 == window[1::2]

    state = ranks[0].state_dict()
    assert state["batch_size"] == 2
    other = LengthGroupedSampler(3, lengths=lengths, num_replicas=2, rank=0)
    with pytest.raises(ValueError, match="batch_size differs"):
        other.load_state_dict(state)


def test_length_grouped_sampler_reads_lengths_from_data():
    import datasets

    ds = datasets.Dataset.from_dict({"input_ids": [[1] * n for n in (3, 9, 1, 5)], "length": [3, 9, 1, 5]})
    assert LengthGroupedSampler(1, dataset=ds).lengths.tolist() == [3, 9, 1, 5]
    no_length_col = ds.remove_columns(["length"])
    assert LengthGroupedSampler(1, dataset=no_length_col).lengths.tolist() == [3, 9, 1, 5]
    items = [{"input_ids": [0] * n} for n in (2, 4)]
    assert LengthGroupedSampler(1, dataset=items).lengths.tolist() == [2, 4]
    with pytest.raises(ValueError, match="item 0 is a int"):
        LengthGroupedSampler(1, dataset=[1, 2])
    with pytest.raises(ValueError, match="lengths has 3 entries"):
        LengthGroupedSampler(1, dataset=items, lengths=[1, 2, 3])


# ---------------------------------------------------------------------------------- build_sampler
def test_build_sampler_chooses_by_strategy():
    data = PlainDataset(10)
    one = Runtime(device=CPU)
    s = build_sampler(data, make_args(), one, train=True)
    assert type(s) is ResumableSampler and s.shuffle and s.seed == 42
    assert build_sampler(data, make_args(data_seed=7), one, train=True).seed == 7
    seq = build_sampler(data, make_args(train_sampling_strategy="sequential"), one, train=True)
    assert list(seq) == list(range(10))
    items = [{"input_ids": [0] * n} for n in range(1, 11)]
    for args in (make_args(group_by_length=True), make_args(train_sampling_strategy="group_by_length")):
        grouped = build_sampler(items, args, one, train=True, batch_size=2)
        assert isinstance(grouped, LengthGroupedSampler) and grouped.batch_size == 2
    with pytest.raises(ValueError, match="train_sampling_strategy must be one of"):
        build_sampler(data, make_args(train_sampling_strategy="bogus"), one, train=True)
    assert build_sampler(RangeStream(4), make_args(), one, train=True) is None

    evals = [
        build_sampler(data, make_args(), Runtime(device=CPU, rank=r, world_size=3), train=False)
        for r in range(3)
    ]
    assert all(not s.shuffle and not s.drop_last for s in evals)
    assert [list(s) for s in evals] == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
    assert evals[0].num_padding == 2
    train_ranks = [
        build_sampler(data, make_args(), Runtime(device=CPU, rank=r, world_size=2), train=True)
        for r in range(2)
    ]
    assert set(train_ranks[0]) | set(train_ranks[1]) == set(range(10))
