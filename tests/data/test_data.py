"""Samplers, dataloaders and collators of trainwright.data: exact resume and HF-compatible collation."""

from __future__ import annotations

import json
import logging
import pickle
import random
import types
import warnings
import weakref
from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from trainwright.core.runtime import Runtime
from trainwright.data import (
    EpochSeededDataLoader,
    LengthGroupedSampler,
    PaddingCollator,
    RemoveColumnsCollator,
    ResumableSampler,
    build_sampler,
    default_data_collator,
    forward_arg_names,
    has_length,
    iterable_resume_state,
    load_iterable_resume_state,
    make_dataloader,
    num_examples,
    pad_sequence_collator,
    remove_unused_columns,
    skip_iterable,
)
from trainwright.modeling.loss import count_items, is_causal_lm

CPU = torch.device("cpu")


def make_args(**overrides):
    values = dict(
        seed=42,
        data_seed=None,
        group_by_length=False,
        train_sampling_strategy="random",
        length_column_name="length",
        per_device_train_batch_size=4,
        dataloader_drop_last=False,
        dataloader_num_workers=0,
        dataloader_pin_memory=True,
        dataloader_persistent_workers=False,
        dataloader_prefetch_factor=None,
    )
    values.update(overrides)
    return types.SimpleNamespace(**values)


class CountingDataset(Dataset):
    """Appends every index it loads to a file, so loads in worker processes are counted too."""

    def __init__(self, n: int, log_path: str) -> None:
        self.n, self.log_path = n, log_path

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> dict:
        with open(self.log_path, "a") as f:
            f.write(f"{idx}\n")
        return {"idx": idx}

    def loaded(self) -> list[int]:
        try:
            with open(self.log_path) as f:
                return [int(line) for line in f]
        except FileNotFoundError:
            return []


class RandomDataset(Dataset):
    """Every item draws from the torch, numpy and random global RNGs."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> dict:
        return {"idx": idx, "t": torch.rand(()).item(), "np": float(np.random.rand()), "py": random.random()}


class PlainDataset(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> dict:
        return {"idx": idx}


class RandomStream(IterableDataset):
    """Each worker yields draws from its own RNG, seeded from the loader's base seed."""

    def __iter__(self):
        return iter([torch.rand(()).item() for _ in range(4)])


class RangeStream(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def as_rows(batches: list[dict]) -> list[tuple]:
    """Batches as comparable tuples of exact values."""
    return [tuple((k, tuple(v.tolist())) for k, v in sorted(b.items())) for b in batches]


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


# ---------------------------------------------------------------------------------- dataloaders
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_loads_only_remaining_samples(tmp_path, workers):
    n, bs = 20, 2
    args = make_args(dataloader_num_workers=workers)

    def loader(log):
        data = CountingDataset(n, str(tmp_path / log))
        sampler = ResumableSampler(n, seed=1)
        dl = make_dataloader(
            data,
            batch_size=bs,
            sampler=sampler,
            collate_fn=default_data_collator,
            args=args,
            drop_last=False,
            seed=1,
        )
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
    return make_dataloader(
        RandomDataset(n),
        batch_size=bs,
        sampler=ResumableSampler(n, seed=3),
        collate_fn=default_data_collator,
        args=args,
        drop_last=False,
        seed=11,
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
        return make_dataloader(
            RandomStream(), batch_size=2, sampler=None, collate_fn=None, args=args, drop_last=False, seed=5
        )

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
        return make_dataloader(
            PlainDataset(8),
            batch_size=2,
            sampler=ResumableSampler(8, seed=0),
            collate_fn=default_data_collator,
            args=make_args(),
            drop_last=False,
            seed=0,
        )

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
    dl2 = make_dataloader(
        PlainDataset(4),
        batch_size=2,
        sampler=None,
        collate_fn=None,
        args=make_args(),
        drop_last=False,
        seed=0,
        epoch_getter=lambda: next(epochs),
    )
    assert dl2.epoch == 7 and dl2.pin_memory is False and dl2.prefetch_factor is None
    with pytest.raises(ValueError, match="batch_size"):
        make_dataloader(
            PlainDataset(4),
            batch_size=0,
            sampler=None,
            collate_fn=None,
            args=make_args(),
            drop_last=False,
            seed=0,
        )


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


# ---------------------------------------------------------------------------------- collators
def test_default_data_collator_labels_and_dtypes():
    batch = default_data_collator(
        [
            {"input_ids": [1, 2], "label": 1, "text": "a", "extra": None},
            {"input_ids": [3, 4], "label": 0, "text": "b", "extra": None},
        ]
    )
    assert set(batch) == {"input_ids", "labels"}  # strings and None are dropped
    assert batch["labels"].dtype == torch.long and batch["labels"].tolist() == [1, 0]
    assert batch["input_ids"].tolist() == [[1, 2], [3, 4]]

    floats = default_data_collator([{"label": 0.5}, {"label": 1.5}])
    assert floats["labels"].dtype == torch.float32
    ids = default_data_collator([{"label_ids": [1, 2]}, {"label_ids": [3, 4]}])
    assert ids["labels"].dtype == torch.long and ids["labels"].shape == (2, 2)
    tensors = default_data_collator(
        [{"x": torch.ones(3), "label": torch.tensor(2)}, {"x": torch.zeros(3), "label": torch.tensor(1)}]
    )
    assert tensors["x"].shape == (2, 3) and tensors["labels"].dtype == torch.long
    arrays = default_data_collator([{"x": np.ones(2, dtype=np.float32)}] * 3)
    assert arrays["x"].shape == (3, 2) and arrays["x"].dtype == torch.float32

    class Feature:
        def __init__(self, input_ids, label):
            self.input_ids, self.label = input_ids, label

    objects = default_data_collator([Feature([1], 0), Feature([2], 1)])
    assert objects["labels"].tolist() == [0, 1] and objects["input_ids"].tolist() == [[1], [2]]
    as_np = default_data_collator([{"x": 1, "label": 0}], return_tensors="np")
    assert isinstance(as_np["x"], np.ndarray) and as_np["labels"].dtype == np.int64

    with pytest.raises(ValueError, match="'input_ids' cannot be stacked"):
        default_data_collator([{"input_ids": [1, 2]}, {"input_ids": [1]}])
    with pytest.raises(ValueError, match="return_tensors"):
        default_data_collator([{"x": 1}], return_tensors="tf")
    with pytest.raises(ValueError, match="empty"):
        default_data_collator([])


def _tiny_tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "hello": 2, "world": 3, "foo": 4}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


def test_padding_collator_with_a_real_tokenizer():
    tokenizer = _tiny_tokenizer()
    features = [{**tokenizer("hello world foo"), "label": 1}, {**tokenizer("hello"), "label": 0}]
    batch = PaddingCollator(tokenizer)(features)
    assert batch["input_ids"].tolist() == [[2, 3, 4], [2, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [1, 0] and "label" not in batch
    multiple = PaddingCollator(tokenizer, pad_to_multiple_of=4)(features)
    assert multiple["input_ids"].shape == (2, 4)

    processor = types.SimpleNamespace(tokenizer=tokenizer)  # a processor wrapping its tokenizer
    assert PaddingCollator(processor).tokenizer is tokenizer
    with pytest.raises(TypeError, match="pad\\(\\) method"):
        PaddingCollator(object())


def test_pad_sequence_collator_right_pads():
    collate = pad_sequence_collator(pad_token_id=9)
    batch = collate(
        [
            {"input_ids": [1, 2, 3], "labels": [1, 2, 3], "score": 0.5},
            {"input_ids": [4], "labels": [4], "score": 1.0},
        ]
    )
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 9, 9]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[1, 2, 3], [4, -100, -100]]
    assert batch["score"].tolist() == [0.5, 1.0]
    given_mask = collate(
        [
            {"input_ids": torch.tensor([1, 2]), "attention_mask": [1, 0]},
            {"input_ids": torch.tensor([3]), "attention_mask": [1]},
        ]
    )
    assert given_mask["attention_mask"].tolist() == [[1, 0], [1, 0]]
    classification = collate([{"input_ids": [1, 2], "labels": 1}, {"input_ids": [3], "labels": 0}])
    assert classification["labels"].tolist() == [1, 0] and classification["input_ids"].tolist() == [
        [1, 2],
        [3, 9],
    ]
    assert pickle.loads(pickle.dumps(collate))([{"input_ids": [1]}])["input_ids"].tolist() == [[1]]


# ---------------------------------------------------------------------------------- columns
class TinyModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        return self.linear(input_ids.float())


def test_forward_arg_names():
    model = TinyModel()
    names = forward_arg_names(model, label_names=["start_positions"])
    assert names == {"input_ids", "attention_mask", "labels", "label", "label_ids", "start_positions"}
    assert forward_arg_names(torch.compile(model)) == forward_arg_names(model)  # looks through the wrapper


def test_remove_columns_collator_drops_and_logs_once(caplog):
    keep = forward_arg_names(TinyModel())
    collate = RemoveColumnsCollator(default_data_collator, keep, description="training")
    features = [{"input_ids": [1, 2], "idx": 0, "label": 1}, {"input_ids": [3, 4], "idx": 1, "label": 0}]
    with caplog.at_level(logging.INFO, logger="trainwright.data.columns"):
        batch = collate(features)
        collate(features)
    assert set(batch) == {"input_ids", "labels"}
    messages = [r.getMessage() for r in caplog.records if "Ignoring columns" in r.getMessage()]
    assert messages == ["Ignoring columns of the training set that the model's forward does not take: idx."]


def test_remove_unused_columns_on_a_real_dataset():
    import datasets

    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, 4]], "label": [0, 1], "text": ["a", "b"]})
    keep = forward_arg_names(TinyModel())
    assert remove_unused_columns(ds, keep).column_names == ["input_ids", "label"]
    assert remove_unused_columns(ds, keep | {"text"}) is ds
    plain = [{"a": 1}]
    assert remove_unused_columns(plain, keep) is plain
    with pytest.raises(ValueError, match=r"\['input_ids', 'label', 'text'\].*\['foo'\]"):
        remove_unused_columns(ds, {"foo"})


# ---------------------------------------------------------------------------------- label targets
def test_count_items_shift_vs_no_shift():
    inputs = {"labels": torch.tensor([[5, 6, -100], [7, -100, -100]])}
    unshifted = count_items(inputs, shift=False)
    assert isinstance(unshifted, torch.Tensor) and unshifted.dim() == 0 and int(unshifted) == 3
    assert int(count_items(inputs, shift=True)) == 1  # only 6 is predicted from a previous position
    assert int(count_items({"labels": torch.tensor([[1, 2, 3, 4]])}, shift=True)) == 3
    with pytest.raises(ValueError, match="'labels'"):
        count_items({"input_ids": torch.zeros(2)}, shift=False)


def test_label_counting_moved_next_to_the_loss_stays_importable_from_data():
    import trainwright.data

    assert trainwright.data.count_items is count_items and trainwright.data.is_causal_lm is is_causal_lm


def test_is_causal_lm():
    from transformers import (
        BertConfig,
        BertLMHeadModel,
        GPT2Config,
        GPT2ForSequenceClassification,
        GPT2LMHeadModel,
    )

    gpt = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, bos_token_id=0, eos_token_id=0)
    assert is_causal_lm(GPT2LMHeadModel(gpt))
    assert not is_causal_lm(GPT2ForSequenceClassification(gpt))
    model = TinyModel()
    assert not is_causal_lm(model)
    model.label_shift = True  # trainwright's contract for custom models
    assert is_causal_lm(model)

    decoder = types.SimpleNamespace(config=types.SimpleNamespace(is_decoder=True, is_encoder_decoder=False))
    assert is_causal_lm(decoder)
    encdec = types.SimpleNamespace(config=types.SimpleNamespace(is_decoder=True, is_encoder_decoder=True))
    assert not is_causal_lm(encdec)
    bert = BertConfig(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        vocab_size=64,
        is_decoder=True,
    )
    assert is_causal_lm(BertLMHeadModel(bert))


def test_a_resumed_iterable_that_ends_before_its_saved_position_is_refused():
    with pytest.raises(ValueError, match="data ended after 2 of the 5 batches.*ignore_data_skip=True"):
        skip_iterable(DataLoader(list(range(4)), batch_size=2), 5)
