"""Snapshots for asynchronous checkpoints: isolated from later in-place updates, buffers reused and
bounded, tied and shared tensors kept shared, and what cannot be copied named."""

from __future__ import annotations

import io

import pytest
import torch
from checkpoint_kit import trained

from trainwright.checkpoint.snapshot import SnapshotBuffers, SnapshotError


def _torch_bytes(obj) -> bytes:
    f = io.BytesIO()
    torch.save(obj, f)
    return f.getvalue()


def test_snapshot_is_isolated_from_later_in_place_updates():
    model, opt = trained()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "meta": {"step": 1, "tags": ["a"]}}
    expected = _torch_bytes(state)
    snap = SnapshotBuffers().take(state)
    # training goes on: another optimizer step, in-place updates, mutated plain data
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-3)
    state["meta"]["tags"].append("b")
    state["meta"]["step"] = 2
    snap.wait()
    assert _torch_bytes(snap.state) == expected
    assert snap.state["meta"] == {"step": 1, "tags": ["a"]}
    assert _torch_bytes(state) != expected


def test_snapshot_buffers_are_reused_and_bounded():
    model, opt = trained()
    buffers = SnapshotBuffers()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    first = buffers.take(state)
    ptrs = sorted(t.untyped_storage().data_ptr() for t in first.state["model"].values())
    allocated = buffers.allocations
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in model.state_dict().values()
    }
    for s in opt.state_dict()["state"].values():
        storages.update({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in s.values()})
    assert first.nbytes == buffers.nbytes == sum(storages.values())
    with pytest.raises(RuntimeError, match="not been released"):
        buffers.take(state)  # its write still reads the buffers
    first.release()
    with torch.no_grad():
        model[0].weight.add_(1)
    second = buffers.take({"model": model.state_dict(), "optimizer": opt.state_dict()})
    assert buffers.allocations == allocated  # nothing allocated in the steady state
    assert sorted(t.untyped_storage().data_ptr() for t in second.state["model"].values()) == ptrs
    assert torch.equal(second.state["model"]["0.weight"], model[0].weight)
    second.release()
    # a changed shape reallocates that buffer only; entries that are gone free theirs
    third = buffers.take({"model": {"0.weight": torch.zeros(3, 3), "0.bias": model[0].bias.detach()}})
    assert buffers.allocations == allocated + 1
    assert buffers.nbytes == third.nbytes == 9 * 4 + 16 * 4
    third.release()


def test_snapshot_keeps_tied_and_shared_tensors_shared():
    model, opt = trained(tied=True)
    fused = torch.randn(6, 4)
    same = torch.randn(3)
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "slices": {"q": fused[:2], "k": fused[2:4], "whole": fused},
        "twice": [same, same],
    }
    snap = SnapshotBuffers().take(state)
    m = snap.state["model"]
    assert m["0.weight"].untyped_storage().data_ptr() == m["1.weight"].untyped_storage().data_ptr()
    s = snap.state["slices"]
    assert s["q"].untyped_storage().data_ptr() == s["whole"].untyped_storage().data_ptr()
    assert s["k"].storage_offset() == 8 and torch.equal(s["k"], fused[2:4])
    assert snap.state["twice"][0] is snap.state["twice"][1]
    assert snap.nbytes == sum(
        t.untyped_storage().nbytes() for t in (model[0].weight, model[1].bias, fused, same)
    ) + sum(t.untyped_storage().nbytes() for st in opt.state_dict()["state"].values() for t in st.values())
    assert _torch_bytes(snap.state) == _torch_bytes(state)


def test_snapshot_names_what_it_cannot_copy():
    sparse = torch.eye(3).to_sparse()
    with pytest.raises(SnapshotError, match=r"state\['opt'\]\['m'\]"):
        SnapshotBuffers().take({"opt": {"m": sparse}})
