"""Tensor parallel against FSDP on this machine: the per-step cost of tp=2 and of dp_shard=2 on the
same model and global batch (2 processes, torchrun, gloo), and the share of each step during which a
collective is in flight.

    python bench/parallelism.py [--steps 10] [--warmup 3] [--hidden 256] [--layers 4] [--seq 128]

Each layout trains the same Llama (built from a config, nothing downloaded) with the Trainer and
`parallelism_config`; the optimizer steps after a warm-up are timed, and a few more steps are run
under torch.profiler: the union of the time spans of the communication events (c10d, functional
collectives, gloo/nccl work) over all threads, divided by the wall time, is the communication
share. Printed as ratios (tp=2 / dp_shard=2). `bench/parallelism_gpu.py` runs the same worker on GPUs.
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
COMM_MARKS = ("c10d::", "_c10d_functional::", "c10d_functional::", "gloo:", "nccl", "record_param_comms")


# ---------------------------------------------------------------------------------- worker side
def worker(cfg: dict) -> None:
    """One layout in this torchrun job: train, time the steps, profile a few, write rank 0's report."""
    import torch
    import transformers

    from trainwright.args.training_args import TrainingArguments
    from trainwright.core.events import TrainerCallback
    from trainwright.loop.trainer import Trainer

    if cfg["device"] == "cpu":
        torch.set_num_threads(cfg["threads"])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    layout = cfg["layout"]
    data_ranks = layout.get("dp_replicate_size", 1) * layout.get("dp_shard_size", 1)
    if cfg["global_batch"] % data_ranks:
        raise SystemExit(f"global batch {cfg['global_batch']} does not split over {data_ranks} data ranks")
    per_device = cfg["global_batch"] // data_ranks

    class Clock(TrainerCallback):
        """Wall time of each optimizer step; the last `profiled` steps run under torch.profiler."""

        def __init__(self) -> None:
            self.times: list[float] = []
            self.comm: list[float] = []
            self._t = 0.0
            self._prof = None

        def on_step_begin(self, args, state, control, **kw):
            if state.global_step >= cfg["warmup"] + cfg["steps"]:
                self._prof = torch.profiler.profile(activities=_activities(cfg["device"]))
                self._prof.__enter__()
            _sync(cfg["device"])
            self._t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            _sync(cfg["device"])
            elapsed = time.perf_counter() - self._t
            if self._prof is None:
                self.times.append(elapsed)
                return
            self._prof.__exit__(None, None, None)
            self.comm.append(communication_seconds(self._prof) / elapsed)
            self._prof = None

    config = transformers.LlamaConfig(
        vocab_size=cfg["vocab"],
        hidden_size=cfg["hidden"],
        intermediate_size=cfg["hidden"] * 4,
        num_hidden_layers=cfg["layers"],
        num_attention_heads=cfg["heads"],
        num_key_value_heads=cfg["heads"],
        max_position_embeddings=cfg["seq"],
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    steps = cfg["warmup"] + cfg["steps"] + cfg["profiled"]
    clock = Clock()
    args = TrainingArguments(
        output_dir=cfg["out"],
        per_device_train_batch_size=per_device,
        max_steps=steps,
        logging_steps=steps,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=cfg["device"] == "cpu",
        bf16=cfg["bf16"],
        parallelism_config=layout or None,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=TokenRows(cfg["global_batch"] * steps, cfg["seq"], cfg["vocab"]),
        callbacks=[clock],
    )
    trainer.train()
    timed = clock.times[cfg["warmup"] :]
    step = statistics.median(timed)
    report = {
        "layout": layout,
        "world": world,
        "step_s": step,
        "tokens_per_s": cfg["global_batch"] * cfg["seq"] / step,
        "comm_share": statistics.median(clock.comm) if clock.comm else None,
        "parameters": sum(p.numel() for p in trainer.model.parameters()),
        "flops_per_step": trainer.state.total_flos
        / trainer.state.global_step,  # 6N per token, every process's
    }
    if cfg["device"] == "cuda":
        peak = torch.tensor([torch.cuda.max_memory_allocated()], device="cuda")
        report["peak_memory_gb"] = float(trainer.runtime.all_reduce(peak, "max").item()) / 2**30
    if trainer.runtime.is_main_process:
        with open(os.path.join(cfg["out"], f"result_{cfg['name']}.json"), "w") as f:
            json.dump(report, f)


def _activities(device: str) -> list:
    import torch

    acts = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def communication_seconds(prof) -> float:
    """Seconds during which some communication event (on any thread, or a GPU kernel) was in flight:
    the union of their spans, so nested and overlapping events count once."""
    spans = []
    for event in prof.events():
        if any(mark in event.name for mark in COMM_MARKS):
            spans.append((event.time_range.start, event.time_range.end))
    spans.sort()
    total, end = 0.0, None
    for lo, hi in spans:
        if end is None or lo > end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total / 1e6  # microseconds


# ---------------------------------------------------------------------------------- driver side
def run_layout(cfg: dict, nproc: int, backend_env: dict | None = None) -> dict:
    """Launch `nproc` processes on this node for one layout; rank 0's report."""
    launch_job(HERE, cfg, nproc, env=backend_env, timeout=3600)
    with open(os.path.join(cfg["out"], f"result_{cfg['name']}.json")) as f:
        return json.load(f)


def describe(layout: dict) -> str:
    used = [f"{k.removesuffix('_size')}={v}" for k, v in layout.items() if v > 1]
    return " x ".join(used) or "one process"


def base_config(opts: argparse.Namespace, out: str, device: str) -> dict:
    return {
        "out": out,
        "device": device,
        "threads": opts.threads,
        "steps": opts.steps,
        "warmup": opts.warmup,
        "profiled": opts.profiled,
        "global_batch": opts.global_batch,
        "seq": opts.seq,
        "hidden": opts.hidden,
        "layers": opts.layers,
        "heads": opts.heads,
        "vocab": opts.vocab,
        "bf16": getattr(opts, "bf16", False),
    }


def add_model_arguments(
    parser: argparse.ArgumentParser, hidden: int, layers: int, seq: int, batch: int
) -> None:
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps (median)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profiled", type=int, default=3, help="steps run under torch.profiler afterwards")
    parser.add_argument("--global-batch", type=int, default=batch)
    parser.add_argument("--seq", type=int, default=seq)
    parser.add_argument("--hidden", type=int, default=hidden)
    parser.add_argument("--layers", type=int, default=layers)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (CPU)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_model_arguments(parser, hidden=256, layers=4, seq=128, batch=8)
    opts = parser.parse_args()
    if opts.worker:
        worker(json.loads(opts.worker))
        return
    layouts = {"tp=2": {"tp_size": 2}, "dp_shard=2": {"dp_shard_size": 2}}
    results = {}
    with tempfile.TemporaryDirectory() as out:
        for name, layout in layouts.items():
            cfg = {**base_config(opts, out, "cpu"), "name": name.replace("=", ""), "layout": layout}
            results[name] = run_layout(cfg, 2)
    tp, fsdp = results["tp=2"], results["dp_shard=2"]
    print(
        f"trainwright N-D parallel benchmark on {os.cpu_count()} CPU cores (gloo, 2 processes x {opts.threads} "
        f"thread): Llama hidden={opts.hidden} layers={opts.layers} ({tp['parameters'] / 1e6:.1f}M parameters), "
        f"global batch {opts.global_batch} x {opts.seq} tokens, median of {opts.steps} steps after {opts.warmup}"
    )
    for name, r in results.items():
        print(
            f"  {name:<11} step {r['step_s'] * 1000:8.1f} ms   {r['tokens_per_s']:8.0f} tokens/s   "
            f"communication in flight {r['comm_share']:.0%} of the step"
        )
    print(
        f"  tp=2 / dp_shard=2: step time {tp['step_s'] / fsdp['step_s']:.2f}x, "
        f"communication share {tp['comm_share'] / max(fsdp['comm_share'], 1e-9):.2f}x"
    )


if __name__ == "__main__":
    main()
