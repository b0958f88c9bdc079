"""Seeding of every random number generator a training run touches, and full determinism."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

__all__ = ["enable_full_determinism", "seed_worker", "set_seed"]

# cuBLAS needs a fixed workspace configuration for deterministic results (see the PyTorch notes on
# reproducibility); ":4096:8" is the setting PyTorch documents, at the cost of a little memory.
_CUBLAS_WORKSPACE = ":4096:8"


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        # numpy only takes seeds in [0, 2**32); checking here gives one clear message for all generators.
        raise ValueError(f"seed must be an integer in [0, 2**32), got {seed!r}")
    return seed


def set_seed(seed: int, deterministic: bool = False) -> None:
    """Seed Python's `random`, numpy and torch (CPU and every CUDA device).

    With `deterministic=True` also make torch use deterministic algorithms (`enable_full_determinism`).
    """
    _check_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    # manual_seed already covers CUDA; the explicit call is lazy (queued until CUDA is initialised).
    torch.cuda.manual_seed_all(seed)
    if deterministic:
        enable_full_determinism(seed)


def enable_full_determinism(seed: int, warn_only: bool = False) -> None:
    """Seed everything and make torch deterministic (slower).

    Sets `CUBLAS_WORKSPACE_CONFIG` (unless already set; it must be in place before cuBLAS is first
    used), `torch.use_deterministic_algorithms(True, warn_only=warn_only)`, and cuDNN to deterministic
    kernels without autotuning. With `warn_only`, operations that have no deterministic
    implementation warn instead of raising.
    """
    set_seed(seed)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", _CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def seed_worker(worker_id: int, num_workers: int = 0, rank: int = 0) -> None:
    """DataLoader `worker_init_fn`: seed `random`, numpy and torch in a worker from its torch seed.

    Inside a worker, `torch.initial_seed()` is the loader's base seed (drawn from the loader's
    generator for each epoch) plus `worker_id`, so every worker of every epoch gets its own
    reproducible seed. In a distributed run, pass `num_workers` and `rank` (with
    `functools.partial`) so that the same worker on different ranks does not repeat the same
    random augmentations: the seed is offset by `num_workers * rank`.
    """
    seed = (torch.initial_seed() + num_workers * rank) % 2**32
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
