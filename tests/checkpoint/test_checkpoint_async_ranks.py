"""Asynchronous checkpoints across 2 real processes (torchrun, gloo): the commit waits for every rank
and fails on all of them with one rank's error, FSDP2's DCP files written in the background equal a
synchronous save's, and the Trainer's async checkpoints under DDP and FSDP equal its sync ones."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import textwrap

import pytest
import torch
from checkpoint_kit import checkpoints, folder_files
from kit.torchrun import launch_env, torchrun, torchrun_command

import trainwright.checkpoint as ckpt

_DIST_JOB = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    import trainwright.checkpoint as ckpt
    from trainwright.checkpoint.async_writer import AsyncCheckpointError, AsyncCheckpointWriter, GroupCollectives
    from trainwright.checkpoint.snapshot import SnapshotBuffers

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = sys.argv[1]
    comms = GroupCollectives(timeout_s=120)
    writer = AsyncCheckpointWriter()
    model = torch.nn.Linear(32, 32)
    result = {"errors": [], "collectives": 0}

    def save(step):
        with torch.no_grad():
            model.weight.fill_(step)
        state = {"model": model.state_dict(), "rng": ckpt.capture_rng_state()}

        def write_files(copy):
            def write(tmp):
                if rank == 0:
                    ckpt.save_model_weights(model, tmp, state_dict=copy["model"])
                if rank == 1:
                    time.sleep(1.0)  # the slow rank: rank 0 must not commit before its files are in
                    if step == 3:  # a real write error on rank 1 only
                        ckpt.write_json(os.path.join(tmp, "missing", "rank1.json"), {})
                ckpt.save_torch_state(copy["rng"], ckpt.rng_state_file(tmp, rank, world))

            return ckpt.write_checkpoint(out, f"checkpoint-{step}", write, runtime=comms)

        writer.save(os.path.join(out, f"checkpoint-{step}"), state, write_files)

    for step in (1, 2, 3):
        try:
            save(step)
        except AsyncCheckpointError as exc:
            result["errors"].append(str(exc))
        # training collectives on the default group while the writer thread uses its own group
        for _ in range(20):
            t = torch.ones(256) * (rank + 1)
            dist.all_reduce(t)
            assert float(t[0]) == 3.0
            result["collectives"] += 1
    try:
        writer.wait()
    except AsyncCheckpointError as exc:
        result["errors"].append(str(exc))
    with open(os.path.join(out, f"result_{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    """
)


_FSDP_JOB = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    import trainwright.checkpoint as ckpt
    from trainwright.checkpoint.async_writer import AsyncCheckpointWriter, GroupCollectives

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = sys.argv[1]
    comms = GroupCollectives(timeout_s=120)
    writer = AsyncCheckpointWriter()

    def build():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
        return model, torch.optim.AdamW(model.parameters(), lr=0.1)

    model, opt = build()
    g = torch.Generator().manual_seed(rank)

    def train_step():
        model(torch.randn(8, 16, generator=g)).square().mean().backward()
        opt.step()
        opt.zero_grad()

    def write_dcp(tmp, state, group=None):
        dcp.save({"model": state["model"]}, checkpoint_id=os.path.join(tmp, "pytorch_model_fsdp_0"), process_group=group)
        dcp.save({"optimizer": state["optimizer"]}, checkpoint_id=os.path.join(tmp, "optimizer_0"), process_group=group)

    train_step()
    state = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, opt)}
    ckpt.write_checkpoint(os.path.join(out, "sync"), "checkpoint-1", lambda tmp: write_dcp(tmp, state), runtime=comms)
    expected = [p.full_tensor().clone() for p in model.parameters()]
    write = lambda copy: ckpt.write_checkpoint(  # noqa: E731
        os.path.join(out, "async"), "checkpoint-1", lambda tmp: write_dcp(tmp, copy, comms.group), runtime=comms
    )
    writer.save(os.path.join(out, "async", "checkpoint-1"), state, write)
    snapshot_bytes = writer.snapshot_bytes
    for _ in range(3):  # training goes on (FSDP's all-gathers on the default group) while it is written
        train_step()
    writer.wait()
    moved = [p.full_tensor() for p in model.parameters()]

    fresh, fresh_opt = build()
    loaded = {"model": get_model_state_dict(fresh)}
    dcp.load(loaded, checkpoint_id=os.path.join(out, "async", "checkpoint-1", "pytorch_model_fsdp_0"))
    from torch.distributed.checkpoint.state_dict import set_model_state_dict
    set_model_state_dict(fresh, loaded["model"])
    got = [p.full_tensor() for p in fresh.parameters()]
    result = {
        "equal": all(torch.equal(a, b) for a, b in zip(got, expected)),
        "moved": any(not torch.equal(a, b) for a, b in zip(moved, expected)),
        "snapshot_bytes": snapshot_bytes,
    }
    with open(os.path.join(out, f"fsdp_{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    """
)


def _run_job(tmp_path, script_text: str, name: str):
    """Run a job script in 2 processes under torchrun; returns the (empty before) folder it writes in."""
    script = tmp_path / name
    script.write_text(script_text)
    out = tmp_path / "out"
    out.mkdir()
    cmd = [*torchrun_command(), str(script), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=launch_env(), timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return out


def test_two_process_async_commit_waits_for_every_rank(tmp_path):
    out = _run_job(tmp_path, _DIST_JOB, "job.py")
    results = [json.loads((out / f"result_{r}.json").read_text()) for r in range(2)]
    for step in (1, 2):
        folder = out / f"checkpoint-{step}"
        assert ckpt.verify_checkpoint(folder) == []
        manifest = json.loads((folder / ckpt.CHECKPOINT_COMPLETE_NAME).read_text())
        assert {"model.safetensors", "rng_state_0.pth", "rng_state_1.pth"} <= set(manifest["files"])
        weights = torch.nn.Linear(32, 32)
        ckpt.load_model_weights(weights, folder)
        assert bool((weights.weight == step).all())
    # rank 1's error fails the commit on both ranks, named with the rank and the file
    assert not (out / "checkpoint-3").exists()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []
    for r in results:
        assert r["collectives"] == 60
        assert len(r["errors"]) == 1, r
        assert (
            "rank 1" in r["errors"][0] and "rank1.json" in r["errors"][0] and "checkpoint-3" in r["errors"][0]
        )


def test_fsdp2_async_dcp_checkpoint_matches_the_sync_one(tmp_path):
    out = _run_job(tmp_path, _FSDP_JOB, "fsdp_job.py")
    for r in range(2):
        result = json.loads((out / f"fsdp_{r}.json").read_text())
        assert result["equal"] and result["moved"] and result["snapshot_bytes"] > 0, result
    sync, done = out / "sync" / "checkpoint-1", out / "async" / "checkpoint-1"
    assert ckpt.verify_checkpoint(done) == []
    sync_files, async_files = folder_files(sync), folder_files(done)
    assert sorted(sync_files) == sorted(async_files)
    # the shards' bytes are the same; DCP's .metadata carries a random save id, and the manifest its checksum
    differ = {k for k in sync_files if sync_files[k] != async_files[k]}
    assert {os.path.basename(k) for k in differ} <= {".metadata", ckpt.CHECKPOINT_COMPLETE_NAME}, differ
    assert any(k.endswith(".distcp") for k in sync_files)


@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_two_process_trainer_async_checkpoints_equal_sync_ones(tmp_path, engine):
    """2 real processes (torchrun, gloo): every rank's files in the checkpoint, committed when both
    are done, the same bytes as a synchronous run's (FSDP: DCP's .metadata records a random save id
    and the hidden folder's name, which differ between any two saves; the rest of it is equal)."""
    from kit.torchrun import FSDP_WRAP, LM_GA

    task = {"name": "job", "args": {"save_strategy": "steps", "save_steps": 1, "save_total_limit": 3}}
    if engine == "fsdp":
        task.update(model="lm", args={**task["args"], **LM_GA, **FSDP_WRAP})
    runs, results = {}, {}
    out = tmp_path / "run"
    for mode in ("sync", "async"):
        job = {**task, "args": {**task["args"], "async_save": mode == "async"}}
        torchrun({"out": str(out), "tasks": [job]})
        folder = out / "job"
        runs[mode] = checkpoints(folder)
        results[mode] = json.loads((folder / "result.json").read_text())
        assert [e for e in os.listdir(folder) if ".tmp-" in e] == []
        os.rename(out, tmp_path / mode)
    assert results["async"]["rows"] == results["sync"]["rows"]
    assert list(runs["async"]) == list(runs["sync"]) == ["checkpoint-2", "checkpoint-3", "checkpoint-4"]
    for name, files in runs["sync"].items():
        assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(files)
        assert ckpt.verify_checkpoint(tmp_path / "async" / "job" / name) == []
        assert sorted(files) == sorted(runs["async"][name])
        differ = {f for f in files if files[f] != runs["async"][name][f]}
        allowed = {".metadata", ckpt.CHECKPOINT_COMPLETE_NAME} if engine == "fsdp" else set()
        assert {os.path.basename(f) for f in differ} <= allowed, (name, differ)
        for f in (f for f in differ if f.endswith(".metadata")):  # DCP's own pickle, read as DCP reads it
            sync_meta, async_meta = (pickle.loads(run[name][f]) for run in (runs["sync"], runs["async"]))
            # what differs is storage_meta: a random save_id and the hidden folder's random name
            assert sync_meta.state_dict_metadata == async_meta.state_dict_metadata, f
            assert (
                sync_meta.storage_data == async_meta.storage_data
                and sync_meta.planner_data == async_meta.planner_data
            )
