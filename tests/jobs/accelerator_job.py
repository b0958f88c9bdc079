"""dist_job.py's tasks with every gradient all-reduce counted (a DDP comm hook), for the
accelerator_config tests: each rank writes DIR/<task>/syncs_<rank>.json with the number of
gradient buckets it all-reduced during training, and ddp_<rank>.json with the DDP wrapper's settings.

    python -m torch.distributed.run --nproc_per_node=2 accelerator_job.py '{"out": DIR, "tasks": [...]}'
"""

from __future__ import annotations

import json
import os
import sys

import dist_job
import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from trainwright.distributed import engine as engine_module

SYNCS: list[int] = []
DDP: dict = {}


def _counting_wrap(original):
    def wrap(self, model):
        wrapped = original(self, model)
        if isinstance(wrapped, torch.nn.parallel.DistributedDataParallel):

            def hook(state, bucket):
                SYNCS.append(1)
                return allreduce_hook(state, bucket)

            wrapped.register_comm_hook(None, hook)
            DDP["find_unused_parameters"] = wrapped.find_unused_parameters
        return wrapped

    return wrap


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    engine_module.Engine.wrap = _counting_wrap(engine_module.Engine.wrap)
    rank = int(os.environ.get("RANK", "0"))
    for task in cfg["tasks"]:
        SYNCS.clear()
        DDP.clear()
        dist_job.run_task(task, cfg["out"])
        with open(os.path.join(cfg["out"], task["name"], f"syncs_{rank}.json"), "w") as f:
            json.dump(len(SYNCS), f)
        with open(os.path.join(cfg["out"], task["name"], f"ddp_{rank}.json"), "w") as f:
            json.dump(DDP, f)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
