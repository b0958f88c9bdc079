"""Checkpoint files and folders: weights, safe loading, RNG, torch state, JSON, atomic writes, rotation."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import pickle
import random
import socket
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import trainwright.checkpoint as ckpt
from trainwright.checkpoint import folder
from trainwright.checkpoint import weights as checkpoint_weights


# -- helpers -------------------------------------------------------------------------------------------
def _mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


class _Tied(torch.nn.Module):
    def __init__(self, tie: bool = True) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 6)
        self.decoder = torch.nn.Linear(6, 10, bias=False)
        self.norm = torch.nn.LayerNorm(6)
        if tie:
            self.decoder.weight = self.embed.weight


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


class _Touch:
    """Unpickling this creates `path`: the stand-in for a malicious payload."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (self.path,))


def _hidden(folder) -> list[str]:
    return sorted(e for e in os.listdir(folder) if e.startswith("."))


def _write_files(files: dict[str, bytes]):
    def write(tmp: str) -> None:
        for name, data in files.items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)

    return write


def _fake_checkpoint(folder, step: int, content: bytes = b"x") -> str:
    return ckpt.write_checkpoint(
        folder,
        f"checkpoint-{step}",
        _write_files({"model.safetensors": content, "trainer_state.json": b'{"global_step": 0}'}),
    )


# -- weights ---------------------------------------------------------------------------------------------
def test_plain_model_round_trip_single_file(tmp_path):
    model = _mlp(0)
    ckpt.save_model_weights(model, tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors"]
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
    fresh = _mlp(1)
    assert not _same(model, fresh)
    result = ckpt.load_model_weights(fresh, tmp_path)
    assert _same(model, fresh)
    assert result == ckpt.WeightsLoadResult([], [])


def test_tied_weights_are_stored_once_and_retied(tmp_path):
    model = _Tied()
    ckpt.save_model_weights(model, tmp_path)
    stored = load_file(str(tmp_path / "model.safetensors"))
    assert sorted(stored) == ["embed.weight", "norm.bias", "norm.weight"]
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        assert json.loads(f.metadata()[checkpoint_weights.ALIASES_KEY]) == {"decoder.weight": "embed.weight"}

    tied = _Tied()
    ckpt.load_model_weights(tied, tmp_path)
    assert torch.equal(tied.embed.weight, model.embed.weight)
    assert tied.decoder.weight is tied.embed.weight
    untied = _Tied(tie=False)
    ckpt.load_model_weights(untied, tmp_path)  # strict: the alias provides decoder.weight
    assert torch.equal(untied.decoder.weight, model.embed.weight)


def test_different_views_of_one_storage_are_saved_as_copies(tmp_path):
    class Views(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            base = torch.arange(10.0)
            self.register_buffer("a", base[:4])
            self.register_buffer("b", base[4:])

    model = Views()
    ckpt.save_model_weights(model, tmp_path)
    fresh = Views()
    fresh.a.zero_()
    fresh.b.zero_()
    ckpt.load_model_weights(fresh, tmp_path)
    assert torch.equal(fresh.a, torch.arange(4.0)) and torch.equal(fresh.b, torch.arange(4.0, 10.0))


def test_sharding_writes_index_and_loads_back(tmp_path):
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(4)])  # 4 x 4224 bytes per layer
    ckpt.save_model_weights(model, tmp_path, max_shard_size="5KB")
    shards = sorted(f for f in os.listdir(tmp_path) if f.startswith("model-"))
    assert shards == [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
    assert all(os.path.getsize(tmp_path / s) < 5000 for s in shards)
    index = json.loads((tmp_path / ckpt.WEIGHTS_INDEX_NAME).read_text())
    assert set(index["weight_map"]) == set(model.state_dict())
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in model.state_dict().values())
    assert not (tmp_path / ckpt.WEIGHTS_NAME).exists()
    fresh = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(4)])
    ckpt.load_model_weights(fresh, tmp_path)
    assert _same(model, fresh)

    # Saving again unsharded removes the stale shards and index.
    ckpt.save_model_weights(model, tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors"]


def test_sharded_tied_model_keeps_aliases_in_index(tmp_path):
    model = _Tied()
    ckpt.save_model_weights(model, tmp_path, max_shard_size=100)
    index = json.loads((tmp_path / ckpt.WEIGHTS_INDEX_NAME).read_text())
    assert index["metadata"][checkpoint_weights.ALIASES_KEY] == {"decoder.weight": "embed.weight"}
    untied = _Tied(tie=False)
    ckpt.load_model_weights(untied, tmp_path)
    assert torch.equal(untied.decoder.weight, model.embed.weight)


def test_a_tensor_above_the_limit_gets_a_shard_of_its_own_and_the_open_one_goes_on(tmp_path):
    # save_pretrained's rule (huggingface_hub's plan): shards are filled in key order; a tensor larger
    # than max_shard_size is put alone in a shard without closing the one being filled.
    class Three(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("a", torch.zeros(10))  # 40 bytes
            self.register_buffer("big", torch.zeros(100))  # 400 bytes
            self.register_buffer("c", torch.zeros(10))

    ckpt.save_model_weights(Three(), tmp_path, max_shard_size=100)
    index = json.loads((tmp_path / ckpt.WEIGHTS_INDEX_NAME).read_text())
    assert index["weight_map"] == {
        "big": "model-00001-of-00002.safetensors",
        "a": "model-00002-of-00002.safetensors",
        "c": "model-00002-of-00002.safetensors",
    }
    assert index["metadata"] == {"total_parameters": 0, "total_size": 480}


def test_shards_are_save_pretrained_shards_byte_for_byte(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    lm = transformers.GPT2LMHeadModel(config)

    class Plain(torch.nn.Module):  # not a PreTrainedModel: written by trainwright's own writer
        def __init__(self) -> None:
            super().__init__()
            self.transformer = lm.transformer  # lm's keys without the tied lm_head

    for size in ("5GB", "20KB", 9000):  # 9000: the attention's 12 KB weights are above the limit
        lm.save_pretrained(tmp_path / f"hf-{size}", max_shard_size=size)
        ckpt.save_model_weights(Plain(), tmp_path / f"ours-{size}", max_shard_size=size)
        theirs = {n: (tmp_path / f"hf-{size}" / n).read_bytes() for n in os.listdir(tmp_path / f"hf-{size}")}
        ours = {
            n: (tmp_path / f"ours-{size}" / n).read_bytes() for n in os.listdir(tmp_path / f"ours-{size}")
        }
        assert len(ours) > 2 or size == "5GB"
        assert ours == {n: b for n, b in theirs.items() if n.startswith("model")}, size


def test_saves_are_identical_bytes_from_call_to_call(tmp_path):
    # safetensors writes `__metadata__` in hash-map order; with aliases there are two keys, so
    # without sorting about half of the saves would differ (and their checksums with them).
    model = _Tied()
    saved = set()
    for i in range(12):
        ckpt.save_model_weights(model, tmp_path / str(i))
        saved.add((tmp_path / str(i) / "model.safetensors").read_bytes())
    assert len(saved) == 1
    data = saved.pop()
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    assert list(header["__metadata__"]) == ["format", checkpoint_weights.ALIASES_KEY]


def test_part_of_a_larger_storage_is_stored_and_counted_alone(tmp_path):
    class Part(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("head", torch.arange(1000.0)[:4])  # 16 bytes of a 4000-byte storage
            self.register_buffer("tail", torch.arange(6.0))

    ckpt.save_model_weights(Part(), tmp_path, max_shard_size=30)
    index = json.loads((tmp_path / ckpt.WEIGHTS_INDEX_NAME).read_text())
    assert index["metadata"]["total_size"] == 16 + 24  # not the 4000 bytes head is a view into
    assert sorted(set(index["weight_map"].values())) == [
        f"model-0000{i}-of-00002.safetensors" for i in (1, 2)
    ]
    fresh = Part()
    fresh.head.zero_()
    ckpt.load_model_weights(fresh, tmp_path)
    assert torch.equal(fresh.head, torch.arange(4.0))


@pytest.mark.parametrize(
    ("text", "expected"),
    [("5GB", 5 * 10**9), ("500MB", 500 * 10**6), ("2GiB", 2 * 2**30), ("1.5KB", 1500), (123, 123), ("7", 7)],
)
def test_parse_size(text, expected):
    assert ckpt.parse_size(text) == expected


@pytest.mark.parametrize("bad", ["5 parsecs", "", 0, -3, True, 1.5])
def test_parse_size_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="max_shard_size"):
        ckpt.parse_size(bad)


def test_key_mismatch_is_reported_before_loading(tmp_path):
    ckpt.save_model_weights(_mlp(0), tmp_path)
    other = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4), torch.nn.Linear(4, 2)
    )
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(
        ckpt.CheckpointError,
        match=r"model\.safetensors does not match the model: missing keys \[3\.bias, 3\.weight\]",
    ):
        ckpt.load_model_weights(other, tmp_path)
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())  # nothing was copied

    with pytest.warns(UserWarning, match="missing keys"):
        result = ckpt.load_model_weights(other, tmp_path, strict=False)
    assert result.missing_keys == ["3.weight", "3.bias"] and result.unexpected_keys == []
    assert torch.equal(other[0].weight, _mlp(0)[0].weight)

    smaller = torch.nn.Sequential(torch.nn.Linear(8, 16))
    with pytest.raises(ckpt.CheckpointError, match=r"unexpected keys \[2\.bias, 2\.weight\]"):
        ckpt.load_model_weights(smaller, tmp_path)


def test_shape_mismatch_names_the_tensor(tmp_path):
    ckpt.save_model_weights(_mlp(0), tmp_path)
    wrong = torch.nn.Sequential(torch.nn.Linear(8, 15), torch.nn.ReLU(), torch.nn.Linear(15, 4))
    with pytest.raises(ckpt.CheckpointError, match=r"0\.weight: file \(16, 8\) vs model \(15, 8\)"):
        ckpt.load_model_weights(wrong, tmp_path, strict=False)


def test_missing_weights_and_missing_shard_are_named(tmp_path):
    with pytest.raises(
        ckpt.CheckpointFileNotFoundError, match=f"no model weights in checkpoint folder {tmp_path}"
    ):
        ckpt.load_model_weights(_mlp(), tmp_path)
    ckpt.save_model_weights(_mlp(), tmp_path, max_shard_size=300)
    os.unlink(tmp_path / "model-00002-of-00003.safetensors")
    with pytest.raises(
        FileNotFoundError,
        match=f"model-00002-of-00003.safetensors is missing from checkpoint folder {tmp_path}",
    ):
        ckpt.load_model_weights(_mlp(), tmp_path)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # raised by torch.compile's imports
def test_wrapped_models_save_their_own_keys(tmp_path):
    model = _mlp(0)
    ckpt.save_model_weights(torch.compile(model), tmp_path / "compiled")
    ckpt.save_model_weights(torch.nn.DataParallel(model), tmp_path / "dp")
    for sub in ("compiled", "dp"):
        assert set(load_file(str(tmp_path / sub / "model.safetensors"))) == set(model.state_dict())
    fresh = _mlp(1)
    ckpt.load_model_weights(torch.nn.DataParallel(fresh), tmp_path / "compiled")
    assert _same(model, fresh)


def test_pytorch_model_bin_loads_weights_only(tmp_path):
    model = _mlp(0)
    torch.save(model.state_dict(), tmp_path / ckpt.PT_WEIGHTS_NAME)
    fresh = _mlp(1)
    ckpt.load_model_weights(fresh, tmp_path)
    assert _same(model, fresh)

    marker = tmp_path / "pwned"
    torch.save({"0.weight": _Touch(marker)}, tmp_path / ckpt.PT_WEIGHTS_NAME)
    with pytest.raises(ckpt.CheckpointError, match="refusing to unpickle .*pytorch_model.bin"):
        ckpt.load_model_weights(fresh, tmp_path)
    assert not marker.exists()


def test_transformers_model_round_trip(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    ckpt.save_model_weights(model, tmp_path / "single")
    assert {"config.json", "model.safetensors"} <= set(os.listdir(tmp_path / "single"))
    assert "lm_head.weight" not in load_file(str(tmp_path / "single" / "model.safetensors"))  # tied, dropped
    reloaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "single")
    assert _same(model, reloaded)

    torch.manual_seed(1)
    fresh = transformers.GPT2LMHeadModel(config)
    ckpt.load_model_weights(fresh, tmp_path / "single")  # strict: lm_head comes from the tie
    assert _same(model, fresh) and fresh.lm_head.weight is fresh.transformer.wte.weight

    ckpt.save_model_weights(model, tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / ckpt.WEIGHTS_INDEX_NAME).exists()
    torch.manual_seed(2)
    fresh = transformers.GPT2LMHeadModel(config)
    ckpt.load_model_weights(fresh, tmp_path / "sharded")
    assert _same(model, fresh)


# -- safe loading --------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("writer", ["torch.save", "pickle"])
def test_malicious_payload_is_refused_and_never_runs(tmp_path, writer):
    # Control: the payload really would create its marker if anything unpickled it.
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(_Touch(control)))
    assert control.exists()

    marker = tmp_path / "pwned"
    path = tmp_path / "optimizer.pt"
    if writer == "torch.save":
        torch.save({"state": _Touch(marker)}, path)
    else:
        path.write_bytes(pickle.dumps({"state": _Touch(marker)}))
    with pytest.raises(ckpt.CheckpointError, match=f"refusing to unpickle {path}") as info:
        ckpt.safe_torch_load(path)
    assert "pathlib" in str(info.value) or "Unsupported" in str(info.value)
    assert not marker.exists()


def test_safe_torch_load_missing_and_damaged_files(tmp_path):
    with pytest.raises(
        ckpt.CheckpointFileNotFoundError, match=f"scheduler.pt is missing from checkpoint folder {tmp_path}"
    ):
        ckpt.safe_torch_load(tmp_path / "scheduler.pt")
    path = tmp_path / "optimizer.pt"
    torch.save({"a": torch.ones(100)}, path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ckpt.CheckpointError, match=f"could not read {path}"):
        ckpt.safe_torch_load(path)


# -- RNG -------------------------------------------------------------------------------------------------
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
    torch.save({"python": _Touch(marker), "cpu": torch.get_rng_state()}, tmp_path / "rng_state.pth")
    with pytest.raises(ckpt.CheckpointError, match="refusing to unpickle.*Delete that file"):
        ckpt.load_rng_state(tmp_path)
    assert not marker.exists()


# -- optimizer / scheduler / scaler ------------------------------------------------------------------------
def _train(model, opt, sched, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(4, 8, generator=gen)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()


def _adamw(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.1, total_iters=10)
    return opt, sched


def test_optimizer_and_scheduler_resume_bit_identically(tmp_path):
    model = _mlp(0)
    opt, sched = _adamw(model)
    _train(model, opt, sched, 3, seed=1)
    ckpt.save_model_weights(model, tmp_path)
    ckpt.save_torch_state(opt.state_dict(), tmp_path / ckpt.OPTIMIZER_NAME)
    ckpt.save_torch_state(sched.state_dict(), tmp_path / ckpt.SCHEDULER_NAME)
    _train(model, opt, sched, 3, seed=2)

    resumed = _mlp(5)
    ropt, rsched = _adamw(resumed)
    ckpt.load_model_weights(resumed, tmp_path)
    ropt.load_state_dict(ckpt.safe_torch_load(tmp_path / ckpt.OPTIMIZER_NAME))
    rsched.load_state_dict(ckpt.safe_torch_load(tmp_path / ckpt.SCHEDULER_NAME))
    _train(resumed, ropt, rsched, 3, seed=2)
    assert _same(model, resumed)
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


# -- JSON ------------------------------------------------------------------------------------------------
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


# -- atomic write --------------------------------------------------------------------------------------
def test_write_checkpoint_commits_with_marker(tmp_path):
    out = tmp_path / "out"
    path = ckpt.write_checkpoint(
        out, "checkpoint-7", _write_files({"a.bin": b"12345", "trainer_state.json": b'{"global_step": 7}'})
    )
    assert path == os.path.join(out, "checkpoint-7")
    assert sorted(os.listdir(path)) == ["a.bin", "checkpoint_complete.json", "trainer_state.json"]
    marker = json.loads(pathlib.Path(path, "checkpoint_complete.json").read_text())
    assert marker["files"] == {"a.bin": 5, "trainer_state.json": 18}
    assert ckpt.verify_checkpoint(path) == [] and _hidden(out) == []
    assert ckpt.get_last_checkpoint(out) == path


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name fsynced descriptors")
def test_everything_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_rename = os.fsync, os.rename
    monkeypatch.setattr(
        os,
        "fsync",
        lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd))[1],
    )
    monkeypatch.setattr(
        os, "rename", lambda a, b: (events.append(("rename", os.fspath(a))), real_rename(a, b))[1]
    )

    def write(tmp):
        ckpt.save_model_weights(_mlp(), tmp)
        ckpt.save_torch_state({"step": torch.tensor(3)}, os.path.join(tmp, ckpt.OPTIMIZER_NAME))
        ckpt.write_json(os.path.join(tmp, ckpt.TRAINER_STATE_NAME), {})
        ckpt.save_rng_state(tmp)
        os.makedirs(os.path.join(tmp, "sub"))
        pathlib.Path(tmp, "sub", "user.txt").write_text("written without our helpers")

    path = ckpt.write_checkpoint(tmp_path, "checkpoint-1", write)
    (commit,) = [i for i, e in enumerate(events) if e[0] == "rename" and ".checkpoint-1.tmp-" in e[1]]
    tmp = events[commit][1]
    synced_before = [e[1] for e in events[:commit] if e[0] == "fsync"]
    files = [os.path.relpath(os.path.join(r, n), path) for r, _, ns in os.walk(path) for n in ns]
    assert len(files) == 6
    for rel in files:  # each file once: the helpers leave flushing to the commit
        assert synced_before.count(os.path.join(tmp, rel)) == 1, rel
    assert tmp in synced_before and os.path.join(tmp, "sub") in synced_before
    assert ("fsync", str(tmp_path)) in events[commit + 1 :]

    events.clear()
    ckpt.save_torch_state({"step": 1}, tmp_path / "alone.pt")  # outside a checkpoint: flushed at once
    assert events == [("fsync", str(tmp_path / "alone.pt"))]


def test_write_checkpoint_replaces_same_name(tmp_path):
    ckpt.write_checkpoint(tmp_path, "checkpoint-1", _write_files({"a.bin": b"old", "stale.bin": b"1"}))
    path = ckpt.write_checkpoint(tmp_path, "checkpoint-1", _write_files({"a.bin": b"newer"}))
    assert pathlib.Path(path, "a.bin").read_bytes() == b"newer"
    assert not pathlib.Path(path, "stale.bin").exists()
    assert _hidden(tmp_path) == [] and ckpt.verify_checkpoint(path) == []


def test_leftovers_are_ignored_then_cleaned(tmp_path):
    good = _fake_checkpoint(tmp_path, 2)
    for name in (".checkpoint-3.tmp-1a-0b", ".checkpoint-1.trash-2-ff"):
        os.makedirs(tmp_path / name)
        (tmp_path / name / "model.safetensors").write_bytes(b"x")
        (tmp_path / name / "trainer_state.json").write_bytes(b'{"global_step": 0}')
    (tmp_path / ".git").mkdir()  # not ours: left alone
    assert ckpt.get_last_checkpoint(tmp_path) == good
    _fake_checkpoint(tmp_path, 4)
    assert _hidden(tmp_path) == [".git"]


def test_interrupted_replacement_is_found_and_restored(tmp_path):
    # A crash between "old copy steps aside" and "new copy moves in" leaves only the hidden old copy.
    path = _fake_checkpoint(tmp_path, 2, b"step2")
    _fake_checkpoint(tmp_path, 1)
    hidden = tmp_path / ".checkpoint-2.old-1f-abcd0123"
    os.rename(path, hidden)
    assert ckpt.get_last_checkpoint(tmp_path) == str(hidden)
    assert ckpt.clean_checkpoint_leftovers(tmp_path) == []
    assert ckpt.get_last_checkpoint(tmp_path) == path and _hidden(tmp_path) == []
    assert pathlib.Path(path, "model.safetensors").read_bytes() == b"step2"


def _enospc_save_file(tensors, filename, metadata=None):
    with open(filename, "wb") as f:
        f.write(b"partial")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)


def test_full_disk_raises_and_keeps_earlier_checkpoints(tmp_path, monkeypatch):
    earlier = _fake_checkpoint(tmp_path, 1, b"safe")
    monkeypatch.setattr(checkpoint_weights, "save_file", _enospc_save_file)
    with pytest.raises(
        ckpt.CheckpointError, match=f"checkpoint 'checkpoint-2' in {tmp_path}: No space left on device"
    ) as info:
        ckpt.write_checkpoint(tmp_path, "checkpoint-2", lambda tmp: ckpt.save_model_weights(_mlp(), tmp))
    assert isinstance(info.value.__cause__, OSError)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-1"]
    assert ckpt.verify_checkpoint(earlier) == [] and ckpt.get_last_checkpoint(tmp_path) == earlier


def test_unwritable_output_dir(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(
        ckpt.CheckpointError, match=f"could not write checkpoint 'checkpoint-1' in {blocker}/out"
    ):
        ckpt.write_checkpoint(blocker / "out", "checkpoint-1", _write_files({}))

    earlier = _fake_checkpoint(tmp_path / "run", 1)

    def refuse(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

    monkeypatch.setattr(os, "mkdir", refuse)
    with pytest.raises(ckpt.CheckpointError, match="Permission denied"):
        ckpt.write_checkpoint(tmp_path / "run", "checkpoint-2", _write_files({}))
    assert os.listdir(tmp_path / "run") == ["checkpoint-1"] and ckpt.verify_checkpoint(earlier) == []


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores folder permissions")
def test_read_only_output_dir(tmp_path):
    earlier = _fake_checkpoint(tmp_path, 1)
    os.chmod(tmp_path, 0o555)
    try:
        with pytest.raises(ckpt.CheckpointError, match=f"in {tmp_path}: Permission denied"):
            ckpt.write_checkpoint(tmp_path, "checkpoint-2", _write_files({}))
    finally:
        os.chmod(tmp_path, 0o755)
    assert os.listdir(tmp_path) == ["checkpoint-1"] and ckpt.verify_checkpoint(earlier) == []


def test_other_errors_propagate_and_clean_up(tmp_path):
    def broken(tmp):
        pathlib.Path(tmp, "half.bin").write_bytes(b"1")
        raise KeyError("no such optimizer state")

    with pytest.raises(KeyError, match="no such optimizer state"):
        ckpt.write_checkpoint(tmp_path, "checkpoint-1", broken)
    assert os.listdir(tmp_path) == []


def test_write_checkpoint_rejects_bad_names_and_missing_runtime(tmp_path, monkeypatch):
    for bad in ("", ".checkpoint-1", "a/b", ".."):
        with pytest.raises(ValueError, match="plain folder name"):
            ckpt.write_checkpoint(tmp_path, bad, _write_files({}))
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="pass runtime="):
        ckpt.write_checkpoint(tmp_path, "checkpoint-1", _write_files({}))
    assert os.listdir(tmp_path) == []


# -- verification and discovery -------------------------------------------------------------------------
def test_verify_reports_missing_and_resized_files(tmp_path):
    path = ckpt.write_checkpoint(tmp_path, "checkpoint-3", _write_files({"a.bin": b"123", "b.bin": b"4"}))
    pathlib.Path(path, "a.bin").write_bytes(b"12")
    os.unlink(os.path.join(path, "b.bin"))
    assert ckpt.verify_checkpoint(path) == ["a.bin has 2 bytes, expected 3", "b.bin is missing"]
    pathlib.Path(path, "checkpoint_complete.json").write_text("{")
    assert "checkpoint_complete.json is unreadable" in ckpt.verify_checkpoint(path)[0]


def test_get_last_checkpoint_skips_damaged_and_accepts_transformers_folders(tmp_path):
    assert ckpt.get_last_checkpoint(tmp_path / "absent") is None
    assert ckpt.get_last_checkpoint(tmp_path) is None
    hf = tmp_path / "checkpoint-5"  # written by transformers: no marker
    hf.mkdir()
    (hf / "trainer_state.json").write_text('{"global_step": 0}')
    (hf / "model.safetensors").write_bytes(b"x")
    partial = tmp_path / "checkpoint-20"  # a transformers save that crashed before trainer_state.json
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"x")
    damaged = _fake_checkpoint(tmp_path, 10)
    pathlib.Path(damaged, "model.safetensors").write_bytes(b"")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert ckpt.get_last_checkpoint(tmp_path) == str(hf)
    assert [str(w.message) for w in caught] == [
        f"skipping incomplete checkpoint {partial}: trainer_state.json is missing",
        f"skipping incomplete checkpoint {damaged}: model.safetensors has 0 bytes, expected 1",
    ]
    (tmp_path / "checkpoint-30.txt").write_text("not a folder")
    good = _fake_checkpoint(tmp_path, 11)
    with pytest.warns(UserWarning, match="checkpoint-20"):
        assert ckpt.get_last_checkpoint(tmp_path) == good


def test_check_checkpoint_files(tmp_path):
    model = _mlp()
    opt, sched = _adamw(model)

    def write(tmp):
        ckpt.save_model_weights(model, tmp)
        ckpt.save_torch_state(opt.state_dict(), os.path.join(tmp, ckpt.OPTIMIZER_NAME))
        ckpt.save_torch_state(sched.state_dict(), os.path.join(tmp, ckpt.SCHEDULER_NAME))
        ckpt.write_json(os.path.join(tmp, ckpt.TRAINER_STATE_NAME), {"global_step": 1})
        ckpt.save_rng_state(tmp)

    path = ckpt.write_checkpoint(tmp_path, "checkpoint-1", write)
    assert ckpt.check_checkpoint_files(path) == []
    assert ckpt.check_checkpoint_files(path, need=("model", "rng")) == []
    assert ckpt.check_checkpoint_files(path, need=("rng",), rank=1, world_size=2) == [
        f"rng_state_1.pth is missing (in {path})"
    ]
    problems = ckpt.check_checkpoint_files(path, need=("scaler", "data_state"))
    assert problems == [f"scaler.pt is missing (in {path})", f"data_state.json is missing (in {path})"]

    weights = pathlib.Path(path, "model.safetensors")
    weights.write_bytes(weights.read_bytes()[:-10])
    pathlib.Path(path, ckpt.OPTIMIZER_NAME).write_bytes(b"garbage")
    pathlib.Path(path, ckpt.TRAINER_STATE_NAME).write_text("{]")
    problems = ckpt.check_checkpoint_files(path)
    assert any("model.safetensors has" in p and "bytes" in p and path in p for p in problems)
    assert any(p.startswith("optimizer.pt is corrupt") for p in problems)
    assert any("trainer_state.json is not valid JSON" in p for p in problems)
    with pytest.raises(ValueError, match="unknown need \\['weights'\\]"):
        ckpt.check_checkpoint_files(path, need=("weights",))
    assert ckpt.check_checkpoint_files(tmp_path / "nope") == [
        f"checkpoint folder {tmp_path / 'nope'} does not exist"
    ]


def test_truncated_safetensors_is_detected_without_marker(tmp_path):
    ckpt.save_model_weights(_mlp(), tmp_path)
    (tmp_path / "trainer_state.json").write_text('{"global_step": 0}')
    assert ckpt.check_checkpoint_files(tmp_path, need=("model",)) == []
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4])
    (problem,) = ckpt.check_checkpoint_files(tmp_path, need=("model",))
    assert "model.safetensors has" in problem and "its header describes" in problem


# -- rotation ----------------------------------------------------------------------------------------------
@pytest.fixture
def five_checkpoints(tmp_path):
    for step in (5, 10, 15, 20, 25):
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / "checkpoint-final").mkdir()  # not a step: never touched
    return tmp_path


def _steps(folder) -> set[int]:
    return {
        int(n.split("-")[1])
        for n in os.listdir(folder)
        if n.split("-")[-1].isdigit() and not n.startswith(".")
    }


def test_sort_checkpoints(five_checkpoints):
    out = five_checkpoints
    names = [os.path.basename(p) for p in ckpt.sort_checkpoints(out)]
    assert names == ["checkpoint-5", "checkpoint-10", "checkpoint-15", "checkpoint-20", "checkpoint-25"]
    best = str(out / "checkpoint-10")
    names = [os.path.basename(p) for p in ckpt.sort_checkpoints(out, best_model_checkpoint=best)]
    assert names == ["checkpoint-5", "checkpoint-15", "checkpoint-20", "checkpoint-10", "checkpoint-25"]

    for i, step in enumerate((5, 10, 15, 20, 25)):  # oldest mtime on the highest step
        os.utime(out / f"checkpoint-{step}", (1_000_000 - 10 * i, 1_000_000 - 10 * i))
    names = [os.path.basename(p) for p in ckpt.sort_checkpoints(out, use_mtime=True)]
    assert names == ["checkpoint-25", "checkpoint-20", "checkpoint-15", "checkpoint-10", "checkpoint-5"]
    for step in (5, 10, 15, 20, 25):
        os.utime(out / f"checkpoint-{step}", (1_000_000, 1_000_000 + step / 100))
    with pytest.warns(UserWarning, match="ordering checkpoints by step"):
        names = [os.path.basename(p) for p in ckpt.sort_checkpoints(out, use_mtime=True)]
    assert names[0] == "checkpoint-5" and names[-1] == "checkpoint-25"


@pytest.mark.parametrize(
    ("limit", "best", "kept"),
    [
        (2, None, {20, 25}),
        (2, 5, {5, 25}),
        (1, 25, {25}),
        (1, 5, {5, 25}),
        (None, None, {5, 10, 15, 20, 25}),
        (0, None, {5, 10, 15, 20, 25}),
        (10, None, {5, 10, 15, 20, 25}),
    ],
)
def test_rotate_checkpoints_outcomes(five_checkpoints, limit, best, kept):
    out = five_checkpoints
    best_path = None if best is None else str(out / f"checkpoint-{best}")
    deleted = ckpt.rotate_checkpoints(out, save_total_limit=limit, best_model_checkpoint=best_path)
    assert _steps(out) == kept
    assert {int(p.rsplit("-", 1)[1]) for p in deleted} == {5, 10, 15, 20, 25} - kept
    assert _hidden(out) == [] and (out / "checkpoint-final").is_dir()


def test_deletion_hides_the_folder_before_removing_it(tmp_path, monkeypatch):
    _fake_checkpoint(tmp_path, 1)
    newest = _fake_checkpoint(tmp_path, 2)
    # Simulate a crash after the rename, before the removal finished.
    monkeypatch.setattr(folder.shutil, "rmtree", lambda *a, **k: None)
    assert ckpt.rotate_checkpoints(tmp_path, save_total_limit=1) == [str(tmp_path / "checkpoint-1")]
    (hidden,) = _hidden(tmp_path)
    assert hidden.startswith(".checkpoint-1.trash-")
    assert ckpt.sort_checkpoints(tmp_path) == [newest]
    monkeypatch.undo()
    ckpt.clean_checkpoint_leftovers(tmp_path)
    assert _hidden(tmp_path) == []


# -- several processes ---------------------------------------------------------------------------------
_TWO_RANKS = textwrap.dedent(
    """
    import errno, os, sys
    import trainwright.checkpoint as ckpt
    from trainwright.core.runtime import get_runtime

    out = sys.argv[1]
    rt = get_runtime(use_cpu=True)

    def write(tmp):
        if rt.is_main_process:
            ckpt.write_json(os.path.join(tmp, ckpt.TRAINER_STATE_NAME), {"global_step": 1})
        ckpt.save_rng_state(tmp, rt.rank, rt.world_size)

    print("saved", ckpt.write_checkpoint(out, "checkpoint-1", write, runtime=rt), flush=True)

    def fail_on_rank1(tmp):
        ckpt.save_rng_state(tmp, rt.rank, rt.world_size)
        if rt.rank == 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    try:
        ckpt.write_checkpoint(out, "checkpoint-2", fail_on_rank1, runtime=rt)
    except ckpt.CheckpointError as exc:
        print("error", exc, flush=True)
    rt.shutdown()
    """
)


def test_write_checkpoint_with_two_processes(tmp_path):
    script = tmp_path / "two_ranks.py"
    script.write_text(_TWO_RANKS)
    out = tmp_path / "out"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), str(out)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    final = out / "checkpoint-1"
    for text in outputs:
        assert f"saved {final}" in text
        assert (
            "error rank 1: could not write checkpoint 'checkpoint-2'" in text
            and "No space left on device" in text
        )
    marker = json.loads((final / "checkpoint_complete.json").read_text())
    assert set(marker["files"]) == {"trainer_state.json", "rng_state_0.pth", "rng_state_1.pth"}
    assert ckpt.verify_checkpoint(final) == []
    assert os.listdir(out) == ["checkpoint-1"]
