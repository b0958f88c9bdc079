"""DDP throughput on this machine: 2 processes (torchrun, gloo) against 1 process, same global batch.

    python bench/ddp.py [--steps 20] [--warmup 5] [--global-batch 16] [--embd 128] [--seq 128]

Trains TinyGPT with the Trainer in each configuration (the 1-process run once with as many threads
as the 2-process run has in total, once with one thread) and times the optimizer steps after a
warmup. Then, inside the 2-process job, it measures how much of a DDP step is communication: the
same forward + backward + optimizer step timed with gradient all-reduce and inside `no_sync` (no
all-reduce); the difference is the communication the backward pass does not hide. It also times one
all-reduce of a gradient-sized buffer on its own. Everything runs on the CPU; on a GPU machine pass
--device-backend nccl (untested here).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from _common import TokenRows, launch_job

HERE = os.path.abspath(__file__)


# ---------------------------------------------------------------------------------- worker side
def _worker(cfg: dict) -> None:
    import torch

    from trainwright.app.tinygpt import TinyGPT, TinyGPTConfig
    from trainwright.args.training_args import TrainingArguments
    from trainwright.core.events import TrainerCallback
    from trainwright.loop.trainer import Trainer

    torch.set_num_threads(cfg["threads"])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_device = cfg["global_batch"] // world

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self._t = 0.0

        def on_step_begin(self, args, state, control, **kw):
            self._t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self._t)

    torch.manual_seed(0)
    model = TinyGPT(
        TinyGPTConfig(n_layer=cfg["layers"], n_embd=cfg["embd"], n_head=4, block_size=cfg["seq"], dropout=0.0)
    )
    steps = cfg["warmup"] + cfg["steps"]
    timer = StepTimer()
    args = TrainingArguments(
        output_dir=cfg["out"],
        per_device_train_batch_size=per_device,
        max_steps=steps,
        logging_steps=steps,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        ddp_backend=cfg.get("backend"),
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=TokenRows(cfg["global_batch"] * steps, cfg["seq"], 256),
        callbacks=[timer],
    )
    trainer.train()
    timed = timer.times[cfg["warmup"] :]
    report: dict = {"world": world, "threads": cfg["threads"], "step_s": statistics.median(timed)}
    report["samples_per_s"] = cfg["global_batch"] / report["step_s"]

    runtime = trainer.runtime
    if runtime.distributed:
        report.update(_communication_share(trainer, TokenRows(per_device, cfg["seq"], 256), cfg))
    if runtime.is_main_process:
        with open(os.path.join(cfg["out"], f"result_{world}_{cfg['threads']}.json"), "w") as f:
            json.dump(report, f)


def _communication_share(trainer, data, cfg: dict) -> dict:
    """Median step time with and without gradient all-reduce (no_sync), same model and batch."""
    import contextlib

    import torch
    import torch.distributed as dist

    runtime = trainer.runtime
    ddp = trainer.model_wrapped
    optimizer = trainer.optimizer
    batch = trainer._prepare_inputs(trainer.data_collator([data[i] for i in range(len(data))]))

    def step(sync: bool) -> float:
        start = time.perf_counter()
        with contextlib.nullcontext() if sync else ddp.no_sync():  # DDP's own switch
            ddp(**batch)["loss"].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        runtime.barrier()  # both variants end at the same point: every rank done
        return time.perf_counter() - start

    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(cfg["warmup"] + cfg["steps"]):
        for sync in (True, False):
            t = step(sync)
            if i >= cfg["warmup"]:
                times[sync].append(t)
    with_sync, without = statistics.median(times[True]), statistics.median(times[False])
    numel = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    flat = torch.zeros(numel, device=runtime.device)
    reduce_times = []
    for _ in range(cfg["steps"]):
        runtime.barrier()
        start = time.perf_counter()
        dist.all_reduce(flat)
        reduce_times.append(time.perf_counter() - start)
    return {
        "sync_step_s": with_sync,
        "no_sync_step_s": without,
        "exposed_comm_share": max(with_sync - without, 0.0) / with_sync,
        "grad_mb": numel * 4 / 2**20,
        "allreduce_s": statistics.median(reduce_times),
    }


# ---------------------------------------------------------------------------------- driver side
def _run(cfg: dict, nproc: int) -> None:
    launch_job(HERE, cfg, nproc)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--embd", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--device-backend", default=None, help="ddp_backend for the multi-process run")
    opts = parser.parse_args()
    if opts.worker:
        _worker(json.loads(opts.worker))
        return
    if opts.global_batch % opts.nproc:
        raise SystemExit(f"--global-batch {opts.global_batch} must be a multiple of --nproc {opts.nproc}")
    with tempfile.TemporaryDirectory() as out:
        base = {
            "out": out,
            "steps": opts.steps,
            "warmup": opts.warmup,
            "global_batch": opts.global_batch,
            "seq": opts.seq,
            "embd": opts.embd,
            "layers": opts.layers,
            "backend": opts.device_backend,
        }
        runs = [(1, opts.nproc), (1, 1), (opts.nproc, 1)]
        results = {}
        for nproc, threads in runs:
            _run({**base, "threads": threads}, nproc)
            with open(os.path.join(out, f"result_{nproc}_{threads}.json")) as f:
                results[(nproc, threads)] = json.load(f)
    cores = os.cpu_count()
    print(
        f"trainwright DDP benchmark on {cores} CPU cores (gloo): TinyGPT n_layer={opts.layers} n_embd={opts.embd}, "
        f"global batch {opts.global_batch} x {opts.seq} tokens, median of {opts.steps} steps after {opts.warmup}"
    )
    for (nproc, threads), r in results.items():
        label = f"{nproc} process{'es' if nproc > 1 else ''} x {threads} thread{'s' if threads > 1 else ''}"
        print(f"  {label:<24} {r['samples_per_s']:8.1f} samples/s   step {r['step_s'] * 1000:7.1f} ms")
    multi = results[(opts.nproc, 1)]
    for key in ((1, opts.nproc), (1, 1)):
        print(
            f"  {opts.nproc}-process DDP / 1 process x {key[1]} thread(s): "
            f"{multi['samples_per_s'] / results[key]['samples_per_s']:.2f}x"
        )
    print(
        f"  communication: DDP step {multi['sync_step_s'] * 1000:.1f} ms with gradient all-reduce, "
        f"{multi['no_sync_step_s'] * 1000:.1f} ms without (no_sync) -> {multi['exposed_comm_share']:.0%} of the "
        f"step is communication the backward pass does not hide; one all-reduce of the {multi['grad_mb']:.1f} MB "
        f"of gradients alone: {multi['allreduce_s'] * 1000:.1f} ms"
    )


if __name__ == "__main__":
    main()
