"""Model weights in a checkpoint: safetensors files, tied weights stored once, shards as save_pretrained
writes them, key and shape mismatches named, and safe loading (pickles are never run)."""

from __future__ import annotations

import json
import os
import pickle

import pytest
import torch
from checkpoint_kit import Touch, mlp, same_weights
from safetensors import safe_open
from safetensors.torch import load_file

import trainwright.checkpoint as ckpt
from trainwright.checkpoint import weights as checkpoint_weights


class _Tied(torch.nn.Module):
    def __init__(self, tie: bool = True) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 6)
        self.decoder = torch.nn.Linear(6, 10, bias=False)
        self.norm = torch.nn.LayerNorm(6)
        if tie:
            self.decoder.weight = self.embed.weight


def _gpt2(seed: int = 0):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(config)


def test_plain_model_round_trip_single_file(tmp_path):
    model = mlp(0)
    ckpt.save_model_weights(model, tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors"]
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
    fresh = mlp(1)
    assert not same_weights(model, fresh)
    result = ckpt.load_model_weights(fresh, tmp_path)
    assert same_weights(model, fresh)
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
    assert same_weights(model, fresh)

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
    lm = _gpt2()

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
    ckpt.save_model_weights(mlp(0), tmp_path)
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
    assert torch.equal(other[0].weight, mlp(0)[0].weight)

    smaller = torch.nn.Sequential(torch.nn.Linear(8, 16))
    with pytest.raises(ckpt.CheckpointError, match=r"unexpected keys \[2\.bias, 2\.weight\]"):
        ckpt.load_model_weights(smaller, tmp_path)


def test_shape_mismatch_names_the_tensor(tmp_path):
    ckpt.save_model_weights(mlp(0), tmp_path)
    wrong = torch.nn.Sequential(torch.nn.Linear(8, 15), torch.nn.ReLU(), torch.nn.Linear(15, 4))
    with pytest.raises(ckpt.CheckpointError, match=r"0\.weight: file \(16, 8\) vs model \(15, 8\)"):
        ckpt.load_model_weights(wrong, tmp_path, strict=False)


def test_missing_weights_and_missing_shard_are_named(tmp_path):
    with pytest.raises(
        ckpt.CheckpointFileNotFoundError, match=f"no model weights in checkpoint folder {tmp_path}"
    ):
        ckpt.load_model_weights(mlp(), tmp_path)
    ckpt.save_model_weights(mlp(), tmp_path, max_shard_size=300)
    os.unlink(tmp_path / "model-00002-of-00003.safetensors")
    with pytest.raises(
        FileNotFoundError,
        match=f"model-00002-of-00003.safetensors is missing from checkpoint folder {tmp_path}",
    ):
        ckpt.load_model_weights(mlp(), tmp_path)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # raised by torch.compile's imports
def test_wrapped_models_save_their_own_keys(tmp_path):
    model = mlp(0)
    ckpt.save_model_weights(torch.compile(model), tmp_path / "compiled")
    ckpt.save_model_weights(torch.nn.DataParallel(model), tmp_path / "dp")
    for sub in ("compiled", "dp"):
        assert set(load_file(str(tmp_path / sub / "model.safetensors"))) == set(model.state_dict())
    fresh = mlp(1)
    ckpt.load_model_weights(torch.nn.DataParallel(fresh), tmp_path / "compiled")
    assert same_weights(model, fresh)


def test_pytorch_model_bin_loads_weights_only(tmp_path):
    model = mlp(0)
    torch.save(model.state_dict(), tmp_path / ckpt.PT_WEIGHTS_NAME)
    fresh = mlp(1)
    ckpt.load_model_weights(fresh, tmp_path)
    assert same_weights(model, fresh)

    marker = tmp_path / "pwned"
    torch.save({"0.weight": Touch(marker)}, tmp_path / ckpt.PT_WEIGHTS_NAME)
    with pytest.raises(ckpt.CheckpointError, match="refusing to unpickle .*pytorch_model.bin"):
        ckpt.load_model_weights(fresh, tmp_path)
    assert not marker.exists()


def test_transformers_model_round_trip(tmp_path):
    model = _gpt2()
    ckpt.save_model_weights(model, tmp_path / "single")
    assert {"config.json", "model.safetensors"} <= set(os.listdir(tmp_path / "single"))
    assert "lm_head.weight" not in load_file(str(tmp_path / "single" / "model.safetensors"))  # tied, dropped
    reloaded = type(model).from_pretrained(tmp_path / "single")
    assert same_weights(model, reloaded)

    fresh = _gpt2(seed=1)
    ckpt.load_model_weights(fresh, tmp_path / "single")  # strict: lm_head comes from the tie
    assert same_weights(model, fresh) and fresh.lm_head.weight is fresh.transformer.wte.weight

    ckpt.save_model_weights(model, tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / ckpt.WEIGHTS_INDEX_NAME).exists()
    fresh = _gpt2(seed=2)
    ckpt.load_model_weights(fresh, tmp_path / "sharded")
    assert same_weights(model, fresh)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("writer", ["torch.save", "pickle"])
def test_malicious_payload_is_refused_and_never_runs(tmp_path, writer):
    # Control: the payload really would create its marker if anything unpickled it.
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(Touch(control)))
    assert control.exists()

    marker = tmp_path / "pwned"
    path = tmp_path / "optimizer.pt"
    if writer == "torch.save":
        torch.save({"state": Touch(marker)}, path)
    else:
        path.write_bytes(pickle.dumps({"state": Touch(marker)}))
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
