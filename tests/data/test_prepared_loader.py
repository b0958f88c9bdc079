"""`trainer.accelerator.prepare(loader)` of a library's own DataLoader (sentence-transformers builds
its loaders so): each process's batches, epoch by epoch, checked against accelerate's own
`prepare_data_loader` and `BatchSamplerShard` in one process (the processes' ranks given to both);
the settings trainwright refuses; the accelerator's `even_batches`. The same loaders under real
torchrun processes beside transformers: tests/distributed/test_library_processes.py."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from trainwright import Trainer, TrainingArguments
from trainwright.args.accelerator_config import AcceleratorConfig
from trainwright.data.distribute import BatchShard
from trainwright.data.prepared import prepare_loader
from trainwright.distributed.accelerator import RuntimeAccelerator
from trainwright.loop.trainer_setup import _check_same_batches

accelerate_data = pytest.importorskip("accelerate.data_loader")


class Batches:
    """A batch sampler of batches of varying sizes (no batch_size), as a custom one may be."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        start, size = 0, 1
        while start < self.n:
            yield list(range(start, min(start + size, self.n)))
            start, size = start + size, size % 3 + 1

    def __len__(self) -> int:
        return sum(1 for _ in self)


CASES = [
    (n, b, w, split, even, drop)
    for n, b, w, split, even, drop in itertools.product(
        [0, 1, 2, 5, 7, 8, 12, 13, 19],
        [1, 2, 3, 4, 6],
        [1, 2, 3],
        [False, True],
        [True, False],
        [False, True],
    )
    if not (split and b % w)
]


def test_batch_shard_deals_as_accelerates_batch_sampler_shard():
    for n, b, world, split, even, drop in CASES:
        base = BatchSampler(range(n), b, drop)
        for rank in range(world):
            theirs = accelerate_data.BatchSamplerShard(
                base, world, rank, split_batches=split, even_batches=even
            )
            ours = BatchShard(base, world, rank, split, even)
            assert list(ours) == list(theirs), (n, b, world, split, even, drop, rank)
            assert len(ours) == len(theirs), (n, b, world, split, even, drop, rank)
    for n, world, even in itertools.product(range(14), [2, 3], [True, False]):  # batches of any size
        for rank in range(world):
            theirs = accelerate_data.BatchSamplerShard(Batches(n), world, rank, even_batches=even)
            assert list(BatchShard(Batches(n), world, rank, False, even)) == list(theirs), (n, world, rank)


def test_the_real_rows_of_the_dealt_batches_are_every_sample_once_in_order():
    """What the evaluation keeps of each batch (the rows before the repeats that even out the last
    ones), taken global step by global step, is the dataset once, in its order."""
    for n, b, world, split, even, drop in CASES:
        if drop:
            continue
        kept = []
        for rank in range(world):
            shard = BatchShard(BatchSampler(range(n), b, False), world, rank, split, even)
            batches = list(shard)
            kept.append([x if real is None else x[:real] for x, real in zip(batches, shard.real_rows)])
        order = [i for k in range(max(map(len, kept))) for part in kept if k < len(part) for i in part[k]]
        assert order == list(range(n)), (n, b, world, split, even)


def _args(**config) -> SimpleNamespace:
    return SimpleNamespace(accelerator_config=AcceleratorConfig(**config), data_seed=None)


def _runtime(world: int, rank: int) -> SimpleNamespace:
    return SimpleNamespace(data_world_size=world, data_rank=rank, broadcast_object=lambda obj: obj)


def _library_loader(n: int = 13, batch: int = 2, drop_last: bool = False) -> DataLoader:
    """sentence-transformers' loader: a batch sampler over a RandomSampler with a seeded generator."""
    generator = torch.Generator().manual_seed(7)
    sampler = BatchSampler(RandomSampler(range(n), generator=generator), batch, drop_last)
    return DataLoader(list(range(n)), batch_sampler=sampler, collate_fn=list)


def _epochs(loader, epochs: int = 3) -> list[list[list[int]]]:
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        out.append(list(loader))
    return out


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize(
    "split, even, drop_last",
    [
        (False, True, False),
        (False, False, False),
        (True, True, False),
        (True, False, False),
        (False, True, True),
    ],
)
def test_a_prepared_library_loader_gives_each_process_accelerates_batches_every_epoch(
    world, split, even, drop_last
):
    """use_seedable_sampler: each epoch's order is (seed + epoch)'s, on one process as on several."""
    torch.manual_seed(11)  # the initial seed the order starts from (no data_seed)
    batch = 2 * world if split else 2
    for rank in range(world):
        ours = prepare_loader(
            _library_loader(batch=batch, drop_last=drop_last),
            _args(split_batches=split),
            _runtime(world, rank),
            None,
            even_batches=even,
            data_seed=None,
        )
        theirs = accelerate_data.prepare_data_loader(
            _library_loader(batch=batch, drop_last=drop_last),
            num_processes=world,
            process_index=rank,
            split_batches=split,
            even_batches=even,
            use_seedable_sampler=True,
        )
        assert _epochs(ours) == _epochs(theirs), rank
        assert len(ours) == len(theirs)


def test_the_data_seed_orders_a_prepared_loader():
    def order(seed):
        loader = prepare_loader(_library_loader(), _args(), _runtime(1, 0), None, True, data_seed=seed)
        return _epochs(loader, 2)

    assert order(3) == order(3) != order(4)


def test_without_the_seedable_sampler_the_samplers_generator_carries_on_as_accelerates():
    torch.manual_seed(11)
    ours = prepare_loader(
        _library_loader(), _args(use_seedable_sampler=False), _runtime(2, 1), None, True, None
    )
    theirs = accelerate_data.prepare_data_loader(
        _library_loader(), num_processes=2, process_index=1, use_seedable_sampler=False
    )
    assert _epochs(ours) == _epochs(theirs)


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(10))


def test_what_trainwright_does_not_deal_is_refused_naming_dispatch_batches():
    with pytest.raises(
        NotImplementedError, match=r"map-style dataset with accelerator_config dispatch_batches=True"
    ):
        prepare_loader(_library_loader(), _args(dispatch_batches=True), _runtime(2, 0), None, True, None)
    stream = DataLoader(Stream(), batch_size=2)
    with pytest.raises(
        NotImplementedError, match=r"iterable dataset with accelerator_config dispatch_batches=False"
    ):
        prepare_loader(stream, _args(dispatch_batches=False), _runtime(2, 0), None, True, None)


def test_processes_with_different_numbers_of_training_batches_are_refused():
    _check_same_batches(SimpleNamespace(all_gather_object=lambda n: [n, n]), 3)
    with pytest.raises(ValueError, match=r"gives the 2 processes \[3, 2\] batches.*even_batches=False"):
        _check_same_batches(SimpleNamespace(all_gather_object=lambda n: [3, 2]), 3)


def test_a_library_sets_the_accelerators_even_batches_for_its_own_loaders(tmp_path):
    """sentence-transformers sets `trainer.accelerator.even_batches` before each prepare: it holds for
    the loaders prepared afterwards, and the arguments' accelerator_config stays as it was."""
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    trainer = Trainer(torch.nn.Linear(1, 1), args)
    accelerator = trainer.accelerator
    assert accelerator.even_batches is True and accelerator.use_seedable_sampler is True
    accelerator.even_batches = False
    assert accelerator.even_batches is False and args.accelerator_config.even_batches is True
    prepared = accelerator.prepare(_library_loader())
    assert [len(b) for b in prepared] == [2] * 6 + [1]  # one process: every batch, on its device


def _process_0_of_2() -> SimpleNamespace:
    """What `trainer.accelerator` reads of the processes: a stand-in for process 0 of 2."""
    return SimpleNamespace(
        data_world_size=2,
        data_rank=0,
        distributed=True,
        device=torch.device("cpu"),
        broadcast_object=lambda obj: obj,
        all_gather=lambda t: [t, t + 100],  # process 1's rows: process 0's plus 100
        all_gather_object=lambda obj: [obj, [x + 100 for x in obj]],
    )


def test_gather_for_metrics_drops_the_repeats_that_even_out_a_prepared_loaders_last_step():
    """5 samples in batches of 2 over 2 processes: the last global step is sample 4 and repeats of
    the first samples; gathered, only sample 4 is kept (accelerate: the dataset's remainder)."""
    accelerator = RuntimeAccelerator(_process_0_of_2(), _args())
    loader = accelerator.prepare(DataLoader(list(range(5)), batch_size=2, collate_fn=torch.tensor))
    gathered = [accelerator.gather_for_metrics(batch).tolist() for batch in loader]
    assert gathered == [[0, 1, 100, 101], [4]]
    objects = [accelerator.gather_for_metrics(batch.tolist()) for batch in loader]
    assert objects == [[0, 1, 100, 101], [4]]
    assert accelerator.gather_for_metrics(torch.tensor([7])).tolist() == [7, 107]  # after the loop: all
