"""`trainwright demo`: a real training, offline, in a few minutes on a laptop CPU.

A small GPT-2-architecture model (tinygpt.py) learns to write like the Python documentation that
ships with every CPython (`pydoc_data.topics`), with evaluation (loss, perplexity), checkpoints,
throughput (and MFU on a known GPU) from the SpeedMonitor on every log row, the final model saved,
plots, and a summary of where everything is.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any, cast

import torch


def demo_text() -> str:
    """The Python reference topics that ship with CPython (about 460 KB of English and code)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def run_demo(output_dir: str = "trainwright_demo", max_steps: int = 600, **overrides: Any) -> dict[str, Any]:
    """Train the demo model; returns a summary dict (also printed)."""
    from trainwright.app.tinygpt import ByteTextDataset, TinyGPT, TinyGPTConfig, decode_bytes, perplexity
    from trainwright.args.training_args import TrainingArguments
    from trainwright.callbacks import SpeedMonitor
    from trainwright.loop.trainer import Trainer

    say_threads(pick_threads())
    torch.manual_seed(0)
    text = demo_text()
    split = int(len(text) * 0.95)
    cfg = TinyGPTConfig(block_size=64, n_layer=2, n_head=4, n_embd=128, dropout=0.0)
    train_ds = ByteTextDataset(text[:split], cfg.block_size)
    eval_ds = ByteTextDataset(text[split:], cfg.block_size)
    settings: dict[str, Any] = dict(
        output_dir=output_dir,
        max_steps=max_steps,
        per_device_train_batch_size=32,
        per_device_eval_batch_size=64,
        learning_rate=2e-3,
        warmup_steps=0.05,
        lr_scheduler_type="cosine",
        weight_decay=0.1,
        logging_steps=50,
        eval_strategy="steps",
        eval_steps=200,
        save_strategy="steps",
        save_steps=200,
        save_total_limit=2,
        report_to=["jsonl"],
        dataloader_num_workers=0,
        seed=0,
    )
    settings.update(overrides)
    args = TrainingArguments(**settings)
    trainer = Trainer(
        model=TinyGPT(cfg),
        args=args,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        callbacks=[SpeedMonitor(window_size=speed_window(args), time_unit="seconds")],
    )

    start = time.time()
    before = trainer.evaluate()
    result = trainer.train()
    after = _final_evaluation(trainer.state, trainer.evaluate)
    trainer.save_model()
    trainer.save_state()
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.log_metrics("eval", after)
    trainer.save_metrics("eval", after)

    prompt = torch.tensor([list(b"The ")], device=trainer.runtime.device)
    torch.manual_seed(0)
    sample = decode_bytes(cast(TinyGPT, trainer.model).generate(prompt, max_new_tokens=160)[0])
    plots = _plots(output_dir)
    summary = {
        "eval_loss_before": before["eval_loss"],
        "eval_loss_after": after["eval_loss"],
        "perplexity_before": perplexity(before["eval_loss"]),
        "perplexity_after": perplexity(after["eval_loss"]),
        "train_loss": result.training_loss,
        "steps": result.global_step,
        "seconds": round(time.time() - start, 1),
        "output_dir": os.path.abspath(output_dir),
        "sample": sample,
        "plots": plots,
        "throughput": _throughput(trainer.state.log_history),
    }
    if trainer.is_world_process_zero():
        _print_summary(summary)
    return summary


def pick_threads() -> tuple[int, str]:
    """The demo's torch threads: the user's OMP_NUM_THREADS where set, else the CPUs other processes
    leave free (on a busy machine, one thread per busy CPU only waits; the library itself keeps
    torch's setting). Returns (threads, why)."""
    from trainwright.observe import host

    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads(), "OMP_NUM_THREADS"
    cpus, load, free = host.usable_cpus(), host.load_average(), host.free_cpus()
    torch.set_num_threads(free)
    shown = "?" if load is None else f"{load:.2f}"
    return free, f"{cpus} CPUs, load {shown}: the CPUs that are free"


def say_threads(picked: tuple[int, str]) -> None:
    threads, why = picked
    print(f"trainwright demo: {threads} torch thread{'s' if threads != 1 else ''} ({why})", flush=True)


def _final_evaluation(state: Any, evaluate: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The evaluation of the trained model: the one training ran at its last step (eval_steps divides
    max_steps, found in the trainer's `state`), else a new one (`evaluate`); not the same twice."""
    step = state.global_step
    last = [r for r in state.log_history if "eval_loss" in r and r.get("step") == step]
    if last:
        return {k: v for k, v in last[-1].items() if k.startswith("eval_") or k == "epoch"}
    return evaluate()


def speed_window(args: Any) -> int:
    """A SpeedMonitor window that is full at the first log row (it needs window_size + 1 step
    ends), so every row carries throughput and the plot is a curve: logging_steps - 1 steps."""
    steps = args.logging_steps
    if steps < 1:  # a ratio of the run
        steps = math.ceil(args.max_steps * steps)
    return max(1, int(steps) - 1)


def _throughput(history: list[dict[str, Any]]) -> dict[str, float]:
    rows = [r for r in history if "throughput/tokens_per_sec" in r]
    return {k: v for k, v in rows[-1].items() if k.startswith("throughput/")} if rows else {}


def _plots(output_dir: str) -> list[str]:
    try:
        from trainwright.app.plot import plot_run
    except ImportError:
        return []
    try:
        return plot_run(output_dir)
    except ImportError:  # matplotlib is an extra
        return []


def _print_summary(s: dict[str, Any]) -> None:
    out = s["output_dir"]
    lines = [
        "",
        "=" * 72,
        "trainwright demo finished",
        f"  steps: {s['steps']} in {s['seconds']} s",
        f"  eval loss: {s['eval_loss_before']:.3f} -> {s['eval_loss_after']:.3f}   "
        f"perplexity: {s['perplexity_before']:.1f} -> {s['perplexity_after']:.1f}",
    ]
    rates = s.get("throughput") or {}
    if rates:
        mfu = rates.get("throughput/device/mfu")
        lines.append(
            f"  throughput (last window): {rates['throughput/tokens_per_sec']:,.0f} tokens/s"
            + (f", MFU {100 * mfu:.1f}%" if mfu is not None else "")
        )
    lines += [
        f"  model:        {os.path.join(out, 'model.safetensors')}",
        f"  checkpoints:  {out}/checkpoint-*",
        f"  state & logs: {os.path.join(out, 'trainer_state.json')}, {os.path.join(out, 'logs.jsonl')}",
        f"  metrics:      {os.path.join(out, 'all_results.json')}",
    ]
    if s["plots"]:
        lines.append("  plots:        " + ", ".join(s["plots"]))
    else:
        lines.append(f"  plots:        pip install 'trainwright[plot]', then: trainwright plot {out}")
    lines += ["  sample from the model:", "    " + s["sample"].replace("\n", "\n    "), "=" * 72]
    print("\n".join(lines))
