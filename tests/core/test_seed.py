"""set_seed / enable_full_determinism / seed_worker with real generators and a real DataLoader."""

import functools
import os
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from trainwright.core.seed import enable_full_determinism, seed_worker, set_seed


def draw() -> tuple:
    return (
        random.random(),
        float(np.random.rand()),
        torch.rand(3).tolist(),
        torch.randint(0, 10**6, (1,)).item(),
    )


def test_set_seed_makes_every_generator_reproducible():
    set_seed(123)
    first = draw()
    set_seed(123)
    assert draw() == first
    set_seed(124)
    assert draw() != first


def test_set_seed_seeds_each_generator():
    set_seed(7)
    values = draw()
    assert values[0] == random.Random(7).random()
    assert values[1] == np.random.RandomState(7).rand()
    assert values[2] == torch.rand(3, generator=torch.Generator().manual_seed(7)).tolist()


@pytest.mark.parametrize("bad", [-1, 2**32, 1.5, "42", True])
def test_set_seed_rejects_bad_seeds(bad):
    with pytest.raises(ValueError, match="seed must be an integer"):
        set_seed(bad)


@pytest.fixture
def restore_determinism(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2], saved[3]


def test_enable_full_determinism(restore_determinism):
    torch.backends.cudnn.benchmark = True
    enable_full_determinism(5)
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.deterministic is True and torch.backends.cudnn.benchmark is False
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert random.random() == random.Random(5).random()  # it also seeds


def test_enable_full_determinism_warn_only_and_existing_workspace(restore_determinism, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    enable_full_determinism(5, warn_only=True)
    assert torch.is_deterministic_algorithms_warn_only_enabled()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"  # a user's setting is kept


def test_set_seed_deterministic_flag(restore_determinism):
    torch.use_deterministic_algorithms(False)
    set_seed(3)
    assert not torch.are_deterministic_algorithms_enabled()
    set_seed(3, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()


def test_seed_worker_derives_seeds_from_torch_initial_seed():
    torch.manual_seed(2**40 + 17)  # a 64-bit torch seed; python/numpy get it modulo 2**32
    seed_worker(0)
    expected = (2**40 + 17) % 2**32
    assert random.random() == random.Random(expected).random()
    assert np.random.rand() == np.random.RandomState(expected).rand()
    torch.manual_seed(99)
    seed_worker(1, num_workers=4, rank=2)
    assert random.random() == random.Random(99 + 8).random()


class RandomDraws(Dataset):
    """Each item reports its worker, the worker's torch seed (mod 2**32) and a draw from every generator."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        info = torch.utils.data.get_worker_info()
        worker = -1 if info is None else info.id
        seed32 = torch.initial_seed() % 2**32  # exact in float64
        draws = [random.random(), float(np.random.rand()), torch.rand((), dtype=torch.float64).item()]
        return torch.tensor([worker, seed32, *draws], dtype=torch.float64)


def load(seed: int, worker_init_fn) -> dict[int, list[list[float]]]:
    """Worker id -> the (seed32, python, numpy, torch) rows that worker produced, in order."""
    loader = DataLoader(
        RandomDraws(),
        batch_size=1,
        num_workers=2,
        worker_init_fn=worker_init_fn,
        generator=torch.Generator().manual_seed(seed),
        multiprocessing_context="fork" if "fork" in torch.multiprocessing.get_all_start_methods() else None,
    )
    by_worker: dict[int, list[list[float]]] = {}
    for batch in loader:
        worker, *values = batch[0].tolist()
        by_worker.setdefault(int(worker), []).append(values)
    return by_worker


def test_seed_worker_with_a_real_dataloader():
    first = load(0, seed_worker)
    assert sorted(first) == [0, 1]  # both workers produced items
    for rows in first.values():
        seed32, py, npy, tch = rows[0]
        # The worker's generators were seeded from its torch seed (torch's own worker seeding differs).
        assert py == random.Random(int(seed32)).random()
        assert npy == np.random.RandomState(int(seed32)).rand()
        assert (
            tch
            == torch.rand(
                (), dtype=torch.float64, generator=torch.Generator().manual_seed(int(seed32))
            ).item()
        )
    assert load(0, seed_worker) == first  # reproducible
    assert first[0][0][0] != first[1][0][0]  # distinct seeds per worker...
    for column in (1, 2, 3):  # ...so every generator differs between the two workers
        assert [v[column] for v in first[0]] != [v[column] for v in first[1]]
    assert load(1, seed_worker) != first  # the loader's seed matters


def test_seed_worker_separates_ranks():
    # Two ranks seeded alike build identical loaders; the rank offset keeps their workers apart.
    rank0 = load(0, functools.partial(seed_worker, num_workers=2, rank=0))
    rank1 = load(0, functools.partial(seed_worker, num_workers=2, rank=1))
    assert rank0 == load(0, seed_worker)
    assert [r[1:] for r in rank1[0]] != [r[1:] for r in rank0[0]]
    assert rank1[0][0][1] == random.Random(int(rank0[0][0][0]) + 2).random()  # offset num_workers * rank
    assert load(0, functools.partial(seed_worker, num_workers=2, rank=1)) == rank1
