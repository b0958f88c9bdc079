"""Random number generator state, stored so that `torch.load(weights_only=True)` reads it back.

Public API (re-exported by `trainwright.checkpoint`):

* `capture_rng_state() -> dict`: python `random`, numpy's global generator, torch CPU and CUDA (when
  CUDA is in use), in the layout transformers' `Trainer._save_rng_state` writes, so transformers'
  `_load_rng_state` resumes from it: `{"python": random.getstate(), "numpy": (name, keys, pos,
  has_gauss, cached), "cpu": tensor, "cuda": current device's tensor (one process) or every device's
  (several)}`. numpy's key vector is a list of ints where upstream pickles an array
  (`np.random.set_state` takes either), so the file is read with `weights_only=True` and no numpy
  globals allowed.
* `restore_rng_state(state)`: the inverse; also accepts transformers' files and the dict layout of
  earlier trainwright releases.
* `rng_state_file(directory, rank, world_size)`: `rng_state.pth`, or `rng_state_<rank>.pth` when
  `world_size > 1` (one file per global rank).
* `save_rng_state(directory, rank=0, world_size=1) -> str` and
  `load_rng_state(directory, rank=0, world_size=1) -> bool` (False, with a warning, when the file is
  missing; a damaged or unsafe file is an error naming it).
* `RngState`: the same as a checkpoint part (`state_dict` / `load_state_dict`).
* `LOOK_AHEAD`: the key under which a checkpoint's RNG file also holds the state from before the
  training batch in hand was fetched (the loop fetches one ahead, as accelerate's loader), where
  that batch cannot be stored itself (`data/look_ahead.py`), in the same layout; transformers'
  `_load_rng_state` reads only its own keys.
* `saved_look_ahead(directory, rank, world_size)`: that entry, or None.
"""

from __future__ import annotations

import os
import random
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from trainwright.checkpoint.files import RNG_STATE_NAME, CheckpointError, safe_torch_load, save_torch_state

LOOK_AHEAD = "look_ahead"


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG state in transformers' layout, readable with `weights_only=True`."""
    numpy_state = np.random.get_state(legacy=True)
    assert isinstance(numpy_state, tuple)  # legacy=True and the global RandomState is an MT19937
    bit_generator, keys, pos, has_gauss, cached_gaussian = numpy_state
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (str(bit_generator), keys.tolist(), int(pos), int(has_gauss), float(cached_gaussian)),
        "cpu": torch.get_rng_state(),
    }
    # Only a CUDA that this process has used has state worth keeping; asking would initialise it.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # as upstream: every device's generator when distributed, else the current device's
        several = torch.distributed.is_available() and torch.distributed.is_initialized()
        several = several and torch.distributed.get_world_size() > 1
        state["cuda"] = torch.cuda.get_rng_state_all() if several else torch.cuda.get_rng_state()
    return state


def _set_cuda_state(cuda: Any) -> None:
    if not torch.cuda.is_available():
        warnings.warn("the RNG state holds CUDA generators but CUDA is not available here", stacklevel=3)
        return
    if isinstance(cuda, torch.Tensor):  # transformers' single-process layout: the current device only
        torch.cuda.set_rng_state(cuda)
    elif len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    else:
        warnings.warn(
            f"the RNG state holds {len(cuda)} CUDA generators but {torch.cuda.device_count()} devices are "
            "visible; CUDA generators not restored, reproducibility is not guaranteed",
            stacklevel=3,
        )


def restore_rng_state(state: dict[str, Any]) -> None:
    """Set every generator from `state` (ours, transformers', or an earlier trainwright release's)."""
    if not isinstance(state, dict) or "cpu" not in state:
        raise ValueError("restore_rng_state: expected a dict from capture_rng_state() with a 'cpu' entry")
    py = state.get("python")
    if isinstance(py, dict):
        random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss_next"]))
    elif py is not None:
        random.setstate(py)
    npst = state.get("numpy")
    if isinstance(npst, dict):
        keys = npst["keys"].numpy().astype(np.uint32)
        np.random.set_state(
            (npst["bit_generator"], keys, npst["pos"], npst["has_gauss"], npst["cached_gaussian"])
        )
    elif npst is not None:
        np.random.set_state(npst)
    torch.set_rng_state(state["cpu"])
    if state.get("cuda") is not None:
        _set_cuda_state(state["cuda"])


def rng_state_file(directory: str | os.PathLike, rank: int = 0, world_size: int = 1) -> str:
    """Path of this rank's RNG file in a checkpoint folder."""
    name = RNG_STATE_NAME if world_size <= 1 else f"rng_state_{rank}.pth"
    return os.path.join(os.fspath(directory), name)


def save_rng_state(directory: str | os.PathLike, rank: int = 0, world_size: int = 1) -> str:
    """Write this process's RNG state into `directory`; returns the file's path. Every rank calls it."""
    path = rng_state_file(directory, rank, world_size)
    save_torch_state(capture_rng_state(), path)
    return path


def _numpy_array_globals() -> list[Any]:
    """The globals numpy arrays pickle with: they rebuild plain arrays and run no other code."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]  # same function, numpy 1 path
    return [
        (_reconstruct, "numpy._core.multiarray._reconstruct"),
        (_reconstruct, "numpy.core.multiarray._reconstruct"),
        np.ndarray,
        np.dtype,
        type(np.dtype(np.uint32)),
    ]


def _load_foreign(path: str) -> dict[str, Any]:
    """A transformers RNG file: it pickles numpy's state as an array, which needs numpy's globals."""
    with torch.serialization.safe_globals(_numpy_array_globals()):
        return safe_torch_load(path)


def load_rng_state(
    directory: str | os.PathLike,
    rank: int = 0,
    world_size: int = 1,
    restore: Callable[[dict[str, Any]], None] = restore_rng_state,
) -> bool:
    """Restore this rank's RNG state from `directory` (through `restore`, e.g. a part's `load_state_dict`).

    A missing file gives False and a warning (deleting it is how a resume opts out of the RNG
    state); a damaged or unsafe one raises `CheckpointError` naming it, since going on would
    silently lose the run's exactness.
    """
    path = rng_state_file(directory, rank, world_size)
    if not os.path.isfile(path):
        warnings.warn(
            f"RNG state not restored: {path} does not exist; training continues but the resumed run is not "
            "bit-exact",
            stacklevel=2,
        )
        return False
    try:
        try:
            state = safe_torch_load(path)
        except CheckpointError as exc:
            if not str(exc).startswith("refusing to unpickle"):
                raise
            state = _load_foreign(path)
        restore(state)
    except (CheckpointError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"could not restore the RNG state from {path} ({exc}). Delete that file to resume without it "
            "(the resumed run is then not bit-exact), or resume from an earlier checkpoint."
        ) from exc
    return True


def saved_look_ahead(
    directory: str | os.PathLike, rank: int = 0, world_size: int = 1
) -> dict[str, Any] | None:
    """The `LOOK_AHEAD` entry of this rank's RNG file in `directory` (None without one, or without the
    file, whose absence `load_rng_state` reports)."""
    if not os.path.isfile(rng_state_file(directory, rank, world_size)):
        return None
    found: list[Any] = []
    load_rng_state(directory, rank, world_size, restore=lambda state: found.append(state.get(LOOK_AHEAD)))
    return found[0] if found else None


class RngState:
    """This process's random generators (Python, NumPy, torch CPU and accelerator) as a checkpoint part."""

    def state_dict(self) -> dict[str, Any]:
        return capture_rng_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        restore_rng_state(state)
