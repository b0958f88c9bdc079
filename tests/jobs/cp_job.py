"""Context parallelism's CPU-side pieces on 4 real processes (gloo), run by torchrun:

    python -m torch.distributed.run --nproc_per_node=4 cp_job.py '{"out": DIR}'

Each rank writes DIR/rank_<r>.json with what it saw:

* "meshes": for dp_shard=2 x cp=2 and dp_replicate=2 x cp=2, the shard mesh FSDP2 would use
  (`parallelism._shard_mesh`, built by `layout_of`): its dimension names, the ranks it holds, the
  ranks of this process's group on its last dimension, and the data-parallel rank;
* "counts_here" / "clip_norm": whether this process's shard of a gradient counts in the norm, and
  the norm `clip_grad_norm_` takes of a gradient sharded over that mesh (against the full tensor's);
* "split": this process's shard of a prepared batch (torch's `context_parallel` sharding it on the
  "cp" dimension of the dp_shard=2 x cp=2 mesh), the inputs the loop's micro-batch context yields
  (`context_parallel.micro_batch`), and whether the loop's own batch stayed as it was;
* "refused": the error a Trainer with cp_size=2 gives on these CPU processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn
from transformers import BatchEncoding

from trainwright.args.parallelism import ParallelismSizes
from trainwright.distributed import context_parallel, parallelism

LAYOUTS = {
    "shard2_cp2": {"dp_shard_size": 2, "cp_size": 2},
    "rep2_cp2": {"dp_replicate_size": 2, "cp_size": 2},
}


def _mesh_facts(layout) -> dict:
    shard = layout.shard_mesh
    return {
        "names": list(shard.mesh_dim_names),
        "ranks": shard.mesh.tolist(),
        "group": sorted(dist.get_process_group_ranks(shard.get_group(shard.ndim - 1))),
        "data_rank": layout.data_rank,
    }


def _clip(layout, full: torch.Tensor) -> dict:
    """A gradient sharded over the shard mesh as FSDP2 holds it: counted once, its norm the full one's."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    shard = layout.shard_mesh
    placements = [Shard(0)] if shard.ndim == 1 else [Replicate(), Shard(0)]
    param = nn.Parameter(distribute_tensor(full.clone(), shard, placements))
    param.grad = distribute_tensor(full.clone(), shard, placements)
    counts = parallelism._counts_here(param.grad, layout)
    norm = parallelism.clip_grad_norm_([param], max_norm=1e9, layout=layout)
    return {"counts_here": counts, "clip_norm": float(norm), "full_norm": float(full.norm())}


def _split(layout) -> dict:
    cp_mesh = layout.mesh["cp"]
    ids = torch.arange(1, 13).reshape(2, 6)  # length 6: padded to 8 (2 x cp_size=2 x 2 chunks)
    batch = {"input_ids": ids.clone(), "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}
    with context_parallel.split(batch, cp_mesh, "alltoall", torch.device("cpu")) as local:
        shard = {k: v.tolist() for k, v in local.items()}
    inside, restored = {}, {}
    # the loop's micro-batch as a plain dict and as the BatchEncoding a tokenizer-padding collator gives
    for kind, make in (("dict", dict), ("BatchEncoding", BatchEncoding)):
        loop_batch = make({k: v.clone() for k, v in batch.items()})
        with context_parallel.micro_batch(
            loop_batch, cp_mesh, "allgather", torch.device("cpu"), contextlib.nullcontext()
        ) as inputs:
            inside[kind] = {k: v.tolist() for k, v in inputs.items()}
            untouched = {k: v.tolist() for k, v in loop_batch.items()}
        after = {k: v.tolist() for k, v in loop_batch.items()}
        after = after if after == untouched else {"changed inside the context": untouched}
        restored[kind] = type(loop_batch) is make and after == {k: v.tolist() for k, v in batch.items()}
    return {"cp_rank": cp_mesh.get_local_rank(), "shard": shard, "inside": inside, "restored": restored}


def _refusal() -> str:
    from trainwright.args.training_args import TrainingArguments
    from trainwright.loop.trainer import Trainer

    args = TrainingArguments(
        "unused", parallelism_config={"dp_shard_size": 2, "cp_size": 2}, report_to="none"
    )
    try:
        Trainer(model=nn.Linear(2, 2), args=args)
    except ValueError as err:
        return str(err)
    return "not refused"


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    runtime = SimpleNamespace(device=torch.device("cpu"), world_size=dist.get_world_size())
    full = torch.arange(1.0, 9.0)
    seen: dict = {"meshes": {}, "clip": {}}
    for name, fields in LAYOUTS.items():
        layout = parallelism.layout_of(ParallelismSizes(**fields), runtime)
        seen["meshes"][name] = _mesh_facts(layout)
        seen["clip"][name] = _clip(layout, full)
        if name == "shard2_cp2":
            seen["split"] = _split(layout)
    seen["refused"] = _refusal()
    with open(os.path.join(cfg["out"], f"rank_{rank}.json"), "w") as f:
        json.dump(seen, f)
    dist.barrier()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
