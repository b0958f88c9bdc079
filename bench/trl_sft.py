"""TRL's SFTTrainer on trainwright against the same script on transformers: steady steps/s.

One script, run alternately as `python bench/trl_sft.py --child transformers` (TRL on transformers)
and `python -m trainwright run bench/trl_sft.py --child trainwright` (the same script, TRL on
trainwright), each in a fresh process: a tiny Llama-style model built offline, prompt-completion
data, TRL's defaults for logging (every 10 steps) and no checkpoints. Each run's rate is its steps
after the warm-up over their time (wall clock, or `--clock thread`: this thread's CPU time, so other
work on a shared machine does not count against either). The best run of each is compared.

    .venv/bin/python bench/trl_sft.py [--repeats 3] [--steps 120] [--warmup 20] [--threads 1] [--clock wall|thread]

Goal: trainwright / transformers >= 0.98.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the offline tokenizer, models and data of the tests


def child(ns: argparse.Namespace) -> None:
    """One training run on whichever library `transformers.Trainer` is; prints its rate as JSON."""
    import torch
    import transformers
    import trl
    from kit import ecosystem as eco

    if ns.threads:
        torch.set_num_threads(ns.threads)
    clock = time.thread_time if ns.clock == "thread" else time.perf_counter
    marks: list[float] = []

    class Clock(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            marks.append(clock())

    with tempfile.TemporaryDirectory() as out:
        tok = eco.tokenizer(os.path.join(out, "tok"))
        args = trl.SFTConfig(
            output_dir=out,
            max_steps=ns.steps,
            per_device_train_batch_size=8,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            bf16=False,
            gradient_checkpointing=False,
            disable_tqdm=True,
            seed=0,
        )
        trainer = trl.SFTTrainer(
            model=eco.llama(tok),
            args=args,
            train_dataset=eco.completions(512),
            processing_class=tok,
            callbacks=[Clock()],
        )
        trainer.train()
    steady = len(marks) - ns.warmup
    library = next(
        c.__module__
        for c in type(trainer).__mro__
        if c.__module__.startswith(("transformers", "trainwright"))
    )
    print(json.dumps({"library": library, "steps_per_s": (steady - 1) / (marks[-1] - marks[ns.warmup])}))


def run_once(library: str, ns: argparse.Namespace) -> float:
    entry = (
        [sys.executable, __file__]
        if library == "transformers"
        else [sys.executable, "-m", "trainwright", "run", __file__]
    )
    flags = [
        "--child",
        library,
        "--steps",
        str(ns.steps),
        "--warmup",
        str(ns.warmup),
        "--threads",
        str(ns.threads),
        "--clock",
        ns.clock,
    ]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "CI": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "WANDB_MODE": "disabled",
    }
    done = subprocess.run([*entry, *flags], capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{library} run failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["library"].startswith(library), result  # the run really trained on that library
    return result["steps_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads in each run (0: torch's default)"
    )
    parser.add_argument("--clock", choices=("wall", "thread"), default="wall")
    parser.add_argument("--child", choices=("transformers", "trainwright"), help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.steps < ns.warmup + 10:
        parser.error(f"--steps must be >= --warmup + 10 ({ns.warmup + 10}) to measure steady steps")
    if ns.child:
        child(ns)
        return
    rates: dict[str, list[float]] = {"transformers": [], "trainwright": []}
    for _ in range(ns.repeats):
        for library in rates:  # alternating, so drifts of the machine's load fall on both
            rates[library].append(run_once(library, ns))
    load = os.getloadavg()[0]
    for library, values in rates.items():
        print(
            f"{library:12s} steps/s per run: {', '.join(f'{v:.1f}' for v in values)}  (best {max(values):.1f})"
        )
    print(
        f"load average {load:.2f}, {ns.threads or 'default'} torch thread(s), {ns.clock} clock, {ns.steps} steps"
    )
    print(
        f"TRL SFT steps/s, trainwright / transformers: {max(rates['trainwright']) / max(rates['transformers']):.3f}"
    )


if __name__ == "__main__":
    main()
