"""accelerator_config's data settings (split_batches, dispatch_batches, even_batches,
use_seedable_sampler) as accelerate defines them: the dealing checked against accelerate's own
classes in one process, then the Trainer with real torchrun processes (2 ranks, gloo), iterable
datasets included. Upstream: tests/trainer/test_trainer_distributed.py's dispatch_batches script
(`scripts/dispatch_batches.py`) and test_trainer_accelerator.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from kit.indexed import Indexed, Recorder
from torch.utils.data import BatchSampler

from trainwright import Trainer, TrainingArguments
from trainwright.args.accelerator_config import AcceleratorConfig
from trainwright.data.distribute import DataDealing, IterableShard
from trainwright.data.samplers import ResumableSampler

accelerate_data = pytest.importorskip("accelerate.data_loader")


def _ours(n: int, batch: int, world: int, even: bool, drop_last: bool) -> list[list[int]]:
    """Each rank's order from our block-dealing sampler (split_batches)."""
    return [
        list(
            ResumableSampler(
                n, seed=3, num_replicas=world, rank=r, block=batch // world, even=even, drop_last=drop_last
            )
        )
        for r in range(world)
    ]


def _accelerate(n: int, batch: int, world: int, even: bool, drop_last: bool) -> list[list[int]]:
    order = list(ResumableSampler(n, seed=3))  # the same global order
    base = BatchSampler(order, batch, drop_last)
    return [
        [
            i
            for b in accelerate_data.BatchSamplerShard(base, world, r, split_batches=True, even_batches=even)
            for i in b
        ]
        for r in range(world)
    ]


@pytest.mark.parametrize("n", [1, 5, 12, 13, 19])
@pytest.mark.parametrize("even, drop_last", [(True, False), (False, False), (True, True)])
def test_split_batches_deals_as_accelerates_batch_sampler_shard(n, even, drop_last):
    for world, batch in ((2, 4), (3, 6), (2, 2)):
        assert _ours(n, batch, world, even, drop_last) == _accelerate(n, batch, world, even, drop_last), (
            world,
            batch,
        )
        sampler = ResumableSampler(
            n, num_replicas=world, rank=0, block=batch // world, even=even, drop_last=drop_last
        )
        assert sampler.rank_lengths() == [len(x) for x in _ours(n, batch, world, even, drop_last)]


class Stream(torch.utils.data.IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


@pytest.mark.parametrize("n", [3, 8, 11, 16])
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_iterable_shard_is_accelerates_iterable_dataset_shard(n, split, drop_last):
    for world, batch in ((2, 4), (3, 3)):
        if split and batch % world:
            continue
        for rank in range(world):
            theirs = accelerate_data.IterableDatasetShard(Stream(n), batch, drop_last, world, rank, split)
            ours = IterableShard(Stream(n), batch, drop_last, world, rank, split)
            assert list(ours) == list(theirs), (world, batch, rank)
    # an evaluation's shard does not complete the last chunk: every sample once over the processes
    shards = [IterableShard(Stream(11), 2, False, 2, r, False, complete=False) for r in range(2)]
    assert sorted(list(shards[0]) + list(shards[1])) == list(range(11))


def _dealing(world: int, **config) -> DataDealing:
    args = SimpleNamespace(accelerator_config=AcceleratorConfig(**config))
    return DataDealing.of(list(range(10)), args, SimpleNamespace(data_world_size=world, data_rank=0))


def test_dispatch_defaults_to_iterable_data_and_split_needs_a_multiple():
    args = SimpleNamespace(accelerator_config=AcceleratorConfig())
    two = SimpleNamespace(data_world_size=2, data_rank=0)
    assert DataDealing.of(Stream(4), args, two).dispatch is True  # accelerate: None means iterable
    assert DataDealing.of(list(range(4)), args, two).dispatch is False
    assert DataDealing.of(Stream(4), args, SimpleNamespace(data_world_size=1, data_rank=0)).dispatch is False
    assert _dealing(2, split_batches=True).loader_batch(8) == 4 and _dealing(2).loader_batch(8) == 8
    assert _dealing(2, dispatch_batches=True).loader_batch(8) == 16
    assert _dealing(2, dispatch_batches=True, split_batches=True).loader_batch(8) == 8
    with pytest.raises(ValueError, match=r"split_batches'\]=True: the batch size \(5\).*multiple of 2"):
        _dealing(2, split_batches=True).loader_batch(5)


def test_uneven_training_steps_are_refused_naming_even_batches():
    dealing = _dealing(2, even_batches=False)
    dealing.check_same_steps(ResumableSampler(10, num_replicas=2, rank=0, even=False), 2)  # 3 and 3 batches
    with pytest.raises(ValueError, match=r"even_batches'\]=False: 9 training samples.*\[3, 2\] batches"):
        dealing.check_same_steps(ResumableSampler(9, num_replicas=2, rank=0, even=False), 2)


def test_use_seedable_sampler_false_draws_the_seed_from_torch_and_resumes_exactly(tmp_path):
    def run(out, resume=None, rng=0, **kw):
        model = Recorder()
        args = TrainingArguments(
            output_dir=str(tmp_path / out),
            report_to="none",
            use_cpu=True,
            per_device_train_batch_size=4,
            num_train_epochs=3,
            save_strategy="epoch",
            learning_rate=0.0,
            seed=5,
            **kw,
        )
        trainer = Trainer(model, args, train_dataset=Indexed(12))  # set_seed(seed) here, as upstream
        torch.manual_seed(rng)  # the global RNG state the shuffling seed is then drawn from
        trainer.train(resume_from_checkpoint=resume)
        return model.seen

    free = {"accelerator_config": {"use_seedable_sampler": False}}
    drawn, seeded = run("a", **free), run("b")
    assert sorted(i for b in drawn[:3] for i in b) == list(range(12))  # still a permutation per epoch
    assert drawn != seeded and drawn == run("c", **free)  # not the data seed's order; reproducible
    assert run("d", rng=1, **free) != drawn  # another global RNG state, another order
    resumed = run("a", resume=str(tmp_path / "a" / "checkpoint-3"), rng=9, **free)
    assert resumed == drawn[3:]  # the checkpoint's seed continues the same orders


# ------------------------------------------------------------------------------- torchrun, 2 ranks


def test_data_settings_with_two_processes(tmp_path):
    from kit import job
    from kit.torchrun import torchrun

    code, out = torchrun({"out": str(tmp_path)}, timeout=300, check=False, script=job("accel_data_job.py"))
    assert code == 0, out[-6000:]

    def load(name, rank=0):
        with open(tmp_path / name / f"rank{rank}.json") as f:
            return json.load(f)

    # iterable data, dispatch_batches by default: process 0 reads each global batch of 2 x 2, process r
    # takes its slice; evaluation returns every sample once, in order (the repeats completing the
    # last global batch cut)
    for name in ("iterable_dispatch", "iterable_shard"):
        ranks = [load(name, r) for r in range(2)]
        assert ranks[0]["seen"] == [[0, 1], [4, 5], [8, 9]] and ranks[1]["seen"] == [
            [2, 3],
            [6, 7],
            [10, 11],
        ], name
        assert ranks[0]["predictions"] == list(range(11)), name
    assert load("iterable_dispatch", 0)["reads"] > 0 and load("iterable_dispatch", 1)["reads"] == 0
    assert load("iterable_shard", 1)["reads"] > 0  # dispatch_batches=False: each process reads the stream
    # split_batches: per_device_train_batch_size=4 is the global batch, 2 per process, blocks of the order
    order = load("map_split", 0)["order"]
    ranks = [load("map_split", r)["seen"] for r in range(2)]
    assert ranks[0] == [order[0:2], order[4:6], order[8:10]] and ranks[1] == [
        order[2:4],
        order[6:8],
        order[10:12],
    ]
    assert load("map_split", 0)["predictions"] == list(range(11))
    # map-style dispatch_batches=True: only process 0 loads samples; the same slices as split of 2 x 2
    ranks = [load("map_dispatch", r) for r in range(2)]
    order = ranks[0]["order"]
    assert ranks[0]["seen"] == [order[0:2], order[4:6], order[8:10]]
    assert ranks[1]["seen"] == [order[2:4], order[6:8], order[10:12]]
    assert ranks[0]["reads"] > 0 and ranks[1]["reads"] == 0 and ranks[0]["predictions"] == list(range(11))
    # even_batches=False: nothing repeated (10 samples, 5 per process); evaluation of 11 samples too
    ranks = [load("map_uneven", r) for r in range(2)]
    assert sorted(i for r in ranks for b in r["seen"] for i in b) == list(range(10))
    assert ranks[0]["predictions"] == list(range(11))
    refused = load("map_uneven_refused", 0)
    assert "even_batches'" in refused["error"] and "[3, 2] batches" in refused["error"]
    # use_seedable_sampler=False: one drawn seed for both processes (their shards partition the data)
    ranks = [load("drawn_seed", r)["seen"] for r in range(2)]
    assert sorted(i for r in ranks for b in r[:3] for i in b) == list(range(12))
