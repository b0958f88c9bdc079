"""The state files of a checkpoint: RNG states (every generator, per rank, transformers' pickles, unsafe
files refused), optimizer / scheduler / grad scaler state resumed bit-identically, and JSON files."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch
from checkpoint_kit import Touch, adamw, mlp, same_weights

import trainwright.checkpoint as ckpt


def _draw() -> tuple:
    return (
        [random.random() for _ in range(3)],
        random.gauss(0, 1),
        np.random.rand(3).tolist(),
        np.random.standard_normal(),
        torch.rand(3).tolist(),
        torch.randn(2).tolist(),
    )


def _leaves(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _leaves(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _leaves(v)
    else:
        yield obj


def test_capture_and_restore_rng_state():
    random.gauss(0, 1)  # leaves a cached gaussian in python's and numpy's generators
    np.random.standard_normal()
    state = ckpt.capture_rng_state()
    assert all(isinstance(x, (torch.Tensor, int, float, str, type(None))) for x in _leaves(state))
    first = _draw()
    assert _draw() != first
    ckpt.restore_rng_state(state)
    assert _draw() == first


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_rng_state_round_trip(tmp_path):
    torch.cuda.manual_seed_all(3)
    torch.rand(1, device="cuda")  # CUDA in use: its generators are part of the state
    ckpt.save_rng_state(tmp_path)
    state = torch.load(tmp_path / "rng_state.pth", weights_only=True)
    assert isinstance(state["cuda"], torch.Tensor)  # one process: the current device's, as upstream
    first = torch.rand(4, device="cuda").tolist()
    assert ckpt.load_rng_state(tmp_path)
    assert torch.rand(4, device="cuda").tolist() == first


def test_rng_file_round_trip_is_weights_only(tmp_path):
    np.random.standard_normal()
    path = ckpt.save_rng_state(tmp_path)
    assert os.path.basename(path) == "rng_state.pth"
    torch.load(path, weights_only=True)  # no allow-listing needed
    first = _draw()
    assert ckpt.load_rng_state(tmp_path) is True
    assert _draw() == first


def test_rng_file_per_rank(tmp_path):
    assert os.path.basename(ckpt.save_rng_state(tmp_path, rank=1, world_size=2)) == "rng_state_1.pth"
    first = _draw()
    assert ckpt.load_rng_state(tmp_path, rank=1, world_size=2)
    assert _draw() == first
    with pytest.warns(UserWarning, match="rng_state_0.pth does not exist.*not bit-exact"):
        assert ckpt.load_rng_state(tmp_path, rank=0, world_size=2) is False


def test_transformers_rng_file_is_restored(tmp_path):
    # transformers pickles random.getstate() and np.random.get_state() as they are.
    np.random.standard_normal()
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()}
    torch.save(state, tmp_path / "rng_state.pth")
    first = _draw()
    assert ckpt.load_rng_state(tmp_path) is True
    assert _draw() == first


def test_unsafe_rng_file_is_not_restored(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"python": Touch(marker), "cpu": torch.get_rng_state()}, tmp_path / "rng_state.pth")
    with pytest.raises(ckpt.CheckpointError, match="refusing to unpickle.*Delete that file"):
        ckpt.load_rng_state(tmp_path)
    assert not marker.exists()


def _train(model, opt, sched, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(4, 8, generator=gen)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()


def test_optimizer_and_scheduler_resume_bit_identically(tmp_path):
    model = mlp(0)
    opt, sched = adamw(model)
    _train(model, opt, sched, 3, seed=1)
    ckpt.save_model_weights(model, tmp_path)
    ckpt.save_torch_state(opt.state_dict(), tmp_path / ckpt.OPTIMIZER_NAME)
    ckpt.save_torch_state(sched.state_dict(), tmp_path / ckpt.SCHEDULER_NAME)
    _train(model, opt, sched, 3, seed=2)

    resumed = mlp(5)
    ropt, rsched = adamw(resumed)
    ckpt.load_model_weights(resumed, tmp_path)
    ropt.load_state_dict(ckpt.safe_torch_load(tmp_path / ckpt.OPTIMIZER_NAME))
    rsched.load_state_dict(ckpt.safe_torch_load(tmp_path / ckpt.SCHEDULER_NAME))
    _train(resumed, ropt, rsched, 3, seed=2)
    assert same_weights(model, resumed)
    assert rsched.get_last_lr() == sched.get_last_lr()


def test_grad_scaler_state_round_trip(tmp_path):
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=7)
    scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
    scaler.update(new_scale=torch.tensor(256.0))
    ckpt.save_torch_state(scaler.state_dict(), tmp_path / ckpt.SCALER_NAME)
    restored = torch.amp.GradScaler("cpu")
    restored.load_state_dict(ckpt.safe_torch_load(tmp_path / ckpt.SCALER_NAME))
    assert restored.state_dict() == scaler.state_dict()
    assert restored.get_scale() == 256.0 and restored.get_growth_interval() == 7


def test_save_torch_state_refuses_what_weights_only_cannot_read(tmp_path):
    path = tmp_path / "scheduler.pt"
    with pytest.raises(ckpt.CheckpointError, match=r"state\['extra'\]\[0\] is a numpy.ndarray"):
        ckpt.save_torch_state({"base_lrs": [0.1], "extra": [np.zeros(2)]}, path)
    assert not path.exists()


def test_json_helpers(tmp_path):
    path = tmp_path / "data_state.json"
    ckpt.write_json(path, {"epoch": 2, "seed": 42, "nested": [1.5, None]})
    assert ckpt.read_json(path) == {"epoch": 2, "seed": 42, "nested": [1.5, None]}
    assert os.listdir(tmp_path) == ["data_state.json"]
    path.write_text('{"epoch": 2,\n "seed": }')
    with pytest.raises(ckpt.CheckpointError, match=f"{path} is not valid JSON: .* line 2"):
        ckpt.read_json(path)
    with pytest.raises(ckpt.CheckpointFileNotFoundError, match="trainer_state.json is missing"):
        ckpt.read_json(tmp_path / "trainer_state.json")
    with pytest.raises(ckpt.CheckpointError, match="cannot write .*bad.json.*not JSON serializable"):
        ckpt.write_json(tmp_path / "bad.json", {"x": object()})
    assert sorted(os.listdir(tmp_path)) == ["data_state.json"]
