"""accelerator_config's data settings in real processes, for test_accelerator_data.py:

    python -m torch.distributed.run --nproc_per_node=2 accel_data_job.py '{"out": DIR}'

Each scenario trains a model that records the sample indices of its training batches, then
predicts 11 samples; every rank writes DIR/<scenario>/rank<r>.json with what it saw ("seen"), the
predictions (rank 0), how many samples this process loaded ("reads") and the epoch-0 order of the
training sampler's seed ("order").
"""

from __future__ import annotations

import json
import os
import sys

import torch
from kit.indexed import READS, Indexed, Recorder, item

from trainwright import Trainer, TrainingArguments
from trainwright.data.samplers import ResumableSampler


class Stream(torch.utils.data.IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            READS[0] += 1
            yield item(i)


SCENARIOS = {
    "iterable_dispatch": (Stream, 12, {"per_device_train_batch_size": 2, "max_steps": 3}),
    "iterable_shard": (
        Stream,
        12,
        {"per_device_train_batch_size": 2, "max_steps": 3, "accelerator_config": {"dispatch_batches": False}},
    ),
    "map_split": (
        Indexed,
        12,
        {"per_device_train_batch_size": 4, "accelerator_config": {"split_batches": True}},
    ),
    "map_dispatch": (
        Indexed,
        12,
        {"per_device_train_batch_size": 2, "accelerator_config": {"dispatch_batches": True}},
    ),
    "map_uneven": (
        Indexed,
        10,
        {"per_device_train_batch_size": 2, "accelerator_config": {"even_batches": False}},
    ),
    "map_uneven_refused": (
        Indexed,
        9,
        {"per_device_train_batch_size": 2, "accelerator_config": {"even_batches": False}},
    ),
    "drawn_seed": (
        Indexed,
        12,
        {"per_device_train_batch_size": 2, "accelerator_config": {"use_seedable_sampler": False}},
    ),
}


def run(name: str, out: str) -> None:
    data_cls, n, extra = SCENARIOS[name]
    rank = int(os.environ["RANK"])
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    READS[0] = 0
    model = Recorder()
    kwargs = {
        "output_dir": folder, "report_to": "none", "use_cpu": True, "learning_rate": 0.0, "seed": 7,
        "per_device_eval_batch_size": 2, "save_strategy": "no", "disable_tqdm": True, "num_train_epochs": 1,
        **extra,
    }  # fmt: skip
    if "split_batches" in json.dumps(extra):
        kwargs["per_device_eval_batch_size"] = 4  # the global evaluation batch, 2 per process
    args = TrainingArguments(**kwargs)
    result: dict = {}
    try:
        trainer = Trainer(model, args, train_dataset=data_cls(n))
        trainer.train()
        reads_in_training = READS[0]
        output = trainer.predict(data_cls(11))
        result.update(
            seen=model.seen,
            reads=reads_in_training,
            predictions=[round(float(p)) for p in output.predictions],
        )
    except ValueError as exc:
        result["error"] = str(exc)
    result["order"] = list(ResumableSampler(n, seed=7))
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    for name in SCENARIOS:
        run(name, cfg["out"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
