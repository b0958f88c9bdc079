"""Wall time of a hyperparameter search: 4 optuna trials one after another in this process against
4 Ray Tune trials, 2 at a time (1 CPU each), on the same objective (a small MLP regression).

    .venv/bin/python bench/hpo_backends.py [--trials 4] [--steps 300] [--reuse-actors] [--optuna-threads 1]

Ray's time includes starting and stopping the local instance and the worker processes (each
imports torch and trainwright); `ray start-up` shows the instance alone. Prints the machine's load
before and after, since a shared machine skews both numbers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import Dataset

from trainwright.args.training_args import TrainingArguments
from trainwright.loop.trainer import Trainer


class Waves(Dataset):
    """y = sum(sin(x)) + noise over 16 features."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 16, generator=g)
        self.y = torch.sin(self.x).sum(-1) + 0.05 * torch.randn(n, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "labels": self.y[i]}


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)
        )

    def forward(self, x, labels=None):
        out = self.net(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


def make_trainer(output_dir: str, steps: int) -> Trainer:
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=64,
        eval_strategy="steps",
        eval_steps=max(steps // 4, 1),
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        logging_steps=steps,
    )
    return Trainer(model_init=MLP, args=args, train_dataset=Waves(4096, 0), eval_dataset=Waves(512, 1))


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument(
        "--reuse-actors", action="store_true", help="Ray: reuse worker processes between trials"
    )
    parser.add_argument(
        "--optuna-threads",
        type=int,
        default=0,
        help="torch threads for the optuna trials (0: torch's default; Ray's 1-CPU workers use 1)",
    )
    opts = parser.parse_args()
    if opts.optuna_threads:
        torch.set_num_threads(opts.optuna_threads)

    import optuna
    import ray
    from ray import tune

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    root = tempfile.mkdtemp(prefix="hpo-bench-")
    print(f"CPUs: {len(os.sched_getaffinity(0))}, torch threads in this process: {torch.get_num_threads()}")
    print(f"load before: {load()}")
    try:
        sampler = optuna.samplers.RandomSampler(seed=0)
        trainer = make_trainer(os.path.join(root, "optuna"), opts.steps)
        start = time.perf_counter()
        best = trainer.hyperparameter_search(
            backend="optuna",
            hp_space=lambda t: {"learning_rate": t.suggest_float("learning_rate", 1e-4, 1e-2, log=True)},
            n_trials=opts.trials,
            sampler=sampler,
        )
        optuna_s = time.perf_counter() - start
        print(
            f"optuna: {opts.trials} trials sequential, {torch.get_num_threads()} torch threads: {optuna_s:.1f} s "
            f"(best eval_loss {best.objective:.4f})"
        )
        print(f"load between: {load()}")

        start = time.perf_counter()
        ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False)
        startup = time.perf_counter() - start
        ray.shutdown()
        trainer = make_trainer(os.path.join(root, "ray"), opts.steps)
        start = time.perf_counter()
        best = trainer.hyperparameter_search(
            backend="ray",
            hp_space=lambda _: {"learning_rate": tune.loguniform(1e-4, 1e-2)},
            n_trials=opts.trials,
            resources_per_trial={"cpu": 1},
            reuse_actors=opts.reuse_actors,
            verbose=0,
        )
        ray_s = time.perf_counter() - start
        trial_s = [t.last_result.get("time_total_s", float("nan")) for t in best.run_summary.trials]
        print(
            f"ray: {opts.trials} trials, 2 at a time (reuse_actors={opts.reuse_actors}): {ray_s:.1f} s, "
            f"of which ray start-up ~{startup:.1f} s; trials' own time {', '.join(f'{s:.1f}' for s in trial_s)} s "
            f"(best eval_loss {best.objective:.4f})"
        )
        print(f"ray / optuna: {ray_s / optuna_s:.2f}x")
        print(f"load after: {load()}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
