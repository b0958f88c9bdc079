"""Observability cost and FLOP counting: SpeedMonitor + JSONL reporter overhead, counted FLOPs vs 6N.

1. Overhead. The loop's steps/s with `SpeedMonitor()` and the JSONL file reporter
   (`report_to=["jsonl"]`) on, against both off, logging every 10 steps in both, in this process,
   alternating runs. Two workloads show the range: a tiny MLP (~0.6 ms a step), where the loop's
   own work dominates, the worst case for any per-step cost, and a 2-layer 128-wide GPT-2 at
   seq 64 (~40 ms a step on one core), small but not overhead-bound. Rates are taken over
   10-step windows between step ends (each window holds exactly one log row, and the first step,
   with the monitor's one-time FLOP count, is in none); the goal figure is the fastest window of
   all runs (best of N: other processes only ever slow a window down). The median window, the
   same in CPU time (`time.process_time`, which other processes' load lengthens far less), and
   the whole `train()` call (set-up and the one-time FLOP count included) are printed beside it.
   Then one more monitored run times the monitor's and the reporter's hooks (median per call, so
   a preemption by another process does not count) to show where the on/off gap comes from.

2. FLOPs. `trainwright.observe.flops.count_flops` (one forward + backward counted on a fake-tensor copy)
   on transformers GPT2LMHeadModel configs, against `estimate_6n_flops` (6 x non-embedding
   parameters x tokens) and against the analytic count derived here. Per token, with L layers,
   width d, sequence length S, vocabulary V, and 2 FLOPs per multiply-add:
     - each weight matrix costs 2 FLOPs per parameter forward and 4 backward (input gradient +
       weight gradient): 6 per parameter. The matrices are 12·L·d² (QKV 3d², output d²,
       MLP 8d²) plus the output projection V·d (tied to the input embedding, so the 6N rule,
       which leaves out embedding parameters, leaves it out too);
     - attention scores QKᵀ (S·d multiply-adds per token per layer) and the weighted sum of V
       (S·d more): 4·S·d FLOPs forward, twice that backward: 12·L·S·d, counted over the full
       S x S (no causal halving, as the counter and the usual MFU convention do);
   so FLOPs per token = 6·(12·L·d² + V·d) + 12·L·S·d, and 6N + 12·L·S·d with N the
   non-embedding parameters (biases and norms add ~13·L·d to N). A fused attention kernel's
   backward recomputes QKᵀ: the counter then reports 14·L·S·d for attention.

    .venv/bin/python bench/monitor.py [--repeats 6] [--mlp-steps 1000] [--gpt-steps 100]
                                      [--skip overhead|flops] [--threads 1]

Goal: steps/s with SpeedMonitor + JSONL >= 0.98x without them. Torch runs on one thread by
default (small steps on several threads mostly time thread wake-ups and the machine's other load).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time

import torch
from _common import MethodTimer, StepClock, add_threads_argument, apply_threads, load_average, quiet
from overhead import MLP, TokenData, VecData

from trainwright import Trainer, TrainingArguments
from trainwright.callbacks import SpeedMonitor
from trainwright.observe.flops import FlopsEstimator, count_flops, estimate_6n_flops, non_embedding_parameters

quiet()

LOGGING_STEPS = 10
DEFAULT_WINDOW = SpeedMonitor().window_size
GPT_SEQ = 64


def small_gpt() -> torch.nn.Module:
    """A 2-layer, 128-wide GPT-2 (transformers if installed, else trainwright's TinyGPT)."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        from trainwright.app.tinygpt import TinyGPT, TinyGPTConfig

        return TinyGPT(TinyGPTConfig(block_size=128, n_layer=2, n_embd=128, n_head=4))
    cfg = GPT2Config(
        n_layer=2, n_embd=128, n_head=4, vocab_size=256, n_positions=128, bos_token_id=0, eos_token_id=0
    )
    return GPT2LMHeadModel(cfg)


def run_once(model, data, steps: int, batch_size: int, monitored: bool) -> dict:
    """One training run: step-end timestamps, whole-call seconds, and the JSONL file's rows."""
    with tempfile.TemporaryDirectory() as out:
        clock = StepClock(keep_all=True)
        callbacks = [clock, SpeedMonitor()] if monitored else [clock]
        args = TrainingArguments(
            output_dir=out,
            max_steps=steps,
            per_device_train_batch_size=batch_size,
            learning_rate=1e-4,
            save_strategy="no",
            report_to=["jsonl"] if monitored else "none",
            disable_tqdm=True,
            logging_steps=LOGGING_STEPS,
            seed=42,
            use_cpu=True,
        )
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
        with contextlib.redirect_stdout(io.StringIO()):
            start = time.perf_counter()
            trainer.train()
            end = time.perf_counter()
        rows = []
        path = os.path.join(out, "logs.jsonl")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                rows = [json.loads(line) for line in f if line.strip()]
    # Windows between the ends of steps 10k and 10(k+1): each holds exactly one log row (a step's
    # log is written right after its end is stamped), and none holds the first step.
    starts = range(LOGGING_STEPS - 1, clock.steps - LOGGING_STEPS, LOGGING_STEPS)
    t, c = clock.times, clock.cpu_times
    return {
        "wall": [t[i + LOGGING_STEPS] - t[i] for i in starts],
        "cpu": [c[i + LOGGING_STEPS] - c[i] for i in starts],
        "train": steps / (end - start),
        "rows": rows,
    }


def bench_overhead(name: str, model_fn, data, steps: int, batch_size: int, repeats: int) -> float:
    variants = {"off": False, "SpeedMonitor + jsonl": True}
    runs: dict[str, list[dict]] = {k: [] for k in variants}
    for r in range(repeats):
        for key in list(variants) if r % 2 == 0 else list(reversed(variants)):
            torch.manual_seed(0)
            runs[key].append(run_once(model_fn(), data, steps, batch_size, variants[key]))
    stats = {}
    for key, v in runs.items():
        wall = [w for r in v for w in r["wall"]]
        cpu = [w for r in v for w in r["cpu"]]
        stats[key] = {
            "wall_best": LOGGING_STEPS / min(wall),
            "wall_median": LOGGING_STEPS / statistics.median(wall),
            "cpu_best": LOGGING_STEPS / min(cpu),
            "cpu_median": LOGGING_STEPS / statistics.median(cpu),
            "train_best": max(r["train"] for r in v),
            "n": len(wall),
        }
    print(
        f"\n{name}: {steps} steps, batch {batch_size}, logging every {LOGGING_STEPS}; {repeats} alternating "
        f"runs each; rates over 10-step windows (n={stats['off']['n']} per variant)"
    )
    for key, s in stats.items():
        print(
            f"  {key:22s} wall: fastest {s['wall_best']:8.1f} steps/s, median {s['wall_median']:8.1f}   "
            f"CPU: fastest {s['cpu_best']:8.1f} steps/CPU-s, median {s['cpu_median']:8.1f}   "
            f"best train() {s['train_best']:8.1f} steps/s"
        )
    rows = runs["SpeedMonitor + jsonl"][-1]["rows"]
    monitored = [r for r in rows if "throughput/batches_per_sec" in r]
    if not monitored:
        raise RuntimeError(f"{name}: the monitored run wrote no throughput rows to logs.jsonl")
    last = monitored[-1]
    flops = last.get("throughput/flops_per_sec")
    flops_text = f"{flops:.3g} FLOP/s" if flops else "no FLOP/s"
    print(
        f"  (check: logs.jsonl has {len(rows)} rows, {len(monitored)} with throughput; the last says "
        f"{last['throughput/batches_per_sec']:.1f} batches/s, {flops_text})"
    )
    on, off = stats["SpeedMonitor + jsonl"], stats["off"]
    ratios = {k: on[k] / off[k] for k in ("wall_best", "wall_median", "cpu_best", "cpu_median", "train_best")}
    print(
        f"  ratio on / off: wall fastest {ratios['wall_best']:.3f} (goal >= 0.98), wall median "
        f"{ratios['wall_median']:.3f}; CPU fastest {ratios['cpu_best']:.3f}, CPU median {ratios['cpu_median']:.3f}; "
        f"whole train() {ratios['train_best']:.3f}"
    )
    ratio = ratios["wall_best"]
    breakdown(name, model_fn, data, steps, batch_size, step_seconds=1 / off["cpu_median"])
    return ratio


def breakdown(name: str, model_fn, data, steps: int, batch_size: int, step_seconds: float) -> None:
    """Time the monitor's and reporter's hooks in one monitored run: where the on/off gap comes from."""
    from trainwright.callbacks import PrinterCallback
    from trainwright.reporters.files import JsonlCallback

    targets = [
        (Trainer, "floating_point_ops"),
        (SpeedMonitor, "on_step_end"),
        (SpeedMonitor, "on_pre_log"),
        (JsonlCallback, "on_log"),
        (PrinterCallback, "on_log"),
    ]
    torch.manual_seed(0)
    with MethodTimer(targets) as timer:
        run_once(model_fn(), data, steps, batch_size, True)
    print(
        f"  where the time goes in a monitored run ({name}; a step takes {step_seconds * 1e6:.0f} us when off):"
    )
    per_step_total = 0.0
    for label, calls in timer.calls.items():
        per_step = statistics.median(calls[1:]) * (len(calls) - 1) / steps  # median: robust to preemptions
        shared = label.startswith("PrinterCallback")
        if not shared:
            per_step_total += per_step
        note = "  (runs when off too; more keys to print when on)" if shared else ""
        print(
            f"    {label:34s} {len(calls):5d} calls, first {calls[0] * 1e3:8.2f} ms, then median "
            f"{statistics.median(calls[1:]) * 1e6:7.1f} us = {per_step * 1e6:6.1f} us/step{note}"
        )
    print(
        f"    monitor + reporter per step, first calls excluded: {per_step_total * 1e6:.1f} us "
        f"= {per_step_total / step_seconds:.1%} of an unmonitored step (timing wrappers add ~0.3 us a call)"
    )


# ---------------------------------------------------------------------------------------- flops

SEQ, BATCH = 128, 8


def _gpt2(n_layer: int, n_embd: int, n_head: int, vocab: int) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        vocab_size=vocab,
        n_positions=max(SEQ, 128),
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(cfg)


def _set_dropout(model: torch.nn.Module, p: float) -> None:
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = p


def _gflop(x: float) -> str:
    return f"{x / 1e9:12.3f} GFLOP"


def bench_flops(name: str, n_layer: int, n_embd: int, n_head: int, vocab: int) -> float:
    model = _gpt2(n_layer, n_embd, n_head, vocab)
    model.train()
    ids = torch.randint(0, vocab, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids}
    L, d, S, V, T = n_layer, n_embd, SEQ, vocab, BATCH * SEQ  # noqa: N806 (the formula's letters)
    n = non_embedding_parameters(model)
    six_n = estimate_6n_flops(model, batch)
    attention = 12 * L * S * d * T
    analytic = 6 * (12 * L * d * d + V * d) * T + attention
    print(
        f"\n{name} (L={L}, d={d}, V={V}), seq {S}, batch {BATCH} = {T} tokens; N (non-embedding) = {n / 1e6:.2f}M"
    )
    print(f"  6N·T  (estimate_6n_flops)                        {_gflop(six_n)}")
    print(f"  (6N + 12·L·S·d)·T                                {_gflop(6 * n * T + attention)}")
    print(f"  analytic (6·(12·L·d² + V·d) + 12·L·S·d)·T        {_gflop(analytic)}")
    main_ratio = None
    for label, impl, dropout in (
        ("sdpa, dropout 0.1 (CPU: unfused math path)", "sdpa", 0.1),
        ("sdpa, dropout 0 (fused kernel, recomputes QKᵀ)", "sdpa", 0.0),
        ("eager attention", "eager", 0.1),
    ):
        model.set_attn_implementation(impl)
        _set_dropout(model, dropout)
        start = time.perf_counter()
        counted = count_flops(model, batch)
        seconds = time.perf_counter() - start
        if counted is None:
            print(f"  counted, {label:46s} counting failed (see the warning above)")
            continue
        main_ratio = main_ratio or counted / six_n
        print(
            f"  counted, {label:46s} {_gflop(counted)}  = {counted / six_n:.3f} x 6N, "
            f"{counted / analytic:.3f} x analytic  (counted in {seconds:.2f} s)"
        )
    estimator = FlopsEstimator(model)
    estimator(batch)
    print(f"  the Trainer's FLOPs source for this model: {estimator.source}")
    return main_ratio


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=6, help="alternating runs per variant")
    p.add_argument("--mlp-steps", type=int, default=1000)
    p.add_argument("--gpt-steps", type=int, default=100)
    p.add_argument("--skip", choices=["overhead", "flops"], help="leave one of the two parts out")
    add_threads_argument(p)
    ns = p.parse_args()
    if ns.repeats < 1:
        p.error(f"--repeats must be >= 1, got {ns.repeats}")
    # SpeedMonitor's rates appear once its window (default 100 steps) is full: a log after that
    least = max(2 * LOGGING_STEPS, DEFAULT_WINDOW + LOGGING_STEPS)
    for flag, value in (("--mlp-steps", ns.mlp_steps), ("--gpt-steps", ns.gpt_steps)):
        if value < least:
            p.error(
                f"{flag} must be >= {least} (SpeedMonitor's {DEFAULT_WINDOW}-step window full, then a "
                f"{LOGGING_STEPS}-step logging window), got {value}"
            )
    apply_threads(ns.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {load_average()}")
    summary_lines = []
    if ns.skip != "overhead":
        mlp = bench_overhead("tiny MLP (overhead-bound)", MLP, VecData(), ns.mlp_steps, 8, ns.repeats)
        gpt = bench_overhead(
            f"2-layer GPT-2 128-d, seq {GPT_SEQ} ({type(small_gpt()).__name__})",
            small_gpt,
            TokenData(n=512, seq=GPT_SEQ),
            ns.gpt_steps,
            8,
            ns.repeats,
        )
        summary_lines.append(
            f"monitor on/off steps/s: tiny MLP {mlp:.3f}, small GPT-2 {gpt:.3f} (goal >= 0.98)"
        )
    if ns.skip != "flops":
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("\nFLOPs part skipped: transformers is not installed")
        else:
            tiny = bench_flops("tiny GPT-2", 2, 64, 2, 256)
            small = bench_flops("GPT-2 small", 12, 768, 12, 50257)
            summary_lines.append(f"counted / 6N FLOPs: tiny GPT-2 {tiny:.3f}, GPT-2 small {small:.3f}")
    print(f"\nSUMMARY ({load_average()} at the end)\n  " + "\n  ".join(summary_lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
