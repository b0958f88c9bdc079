"""Loop overhead: trainwright's steps/s against a hand-written PyTorch loop doing the same work.

Both run the same model, data, optimizer (AdamW as trainwright's default picks it), clipping,
linear schedule and seed, in this process, alternating runs (every other repeat in reverse order,
each after a full garbage collection: whatever a finished run left in cycles is not another run's
cost); the best of each is compared.
transformers.Trainer runs the same workloads too when installed (with accelerate).

"raw" schedules and zeroes as a user writes it (`LambdaLR.step()`, `optimizer.zero_grad()`);
"raw-lean" writes the rate into each group and sets each `.grad` to None itself, skipping torch's
generic code for both, as trainwright does (`optim/zeroing.py`, `_LambdaSchedule.step`: ~6 us and
~3 us of a 0.28 ms MLP step). trainwright against "raw" is what a user switching loops sees;
against "raw-lean", the loop's own cost alone. Both ratios are printed.

Two rates per variant: "steady" is steps/s between the end of step WARMUP and the last step (the
loop's own cost: every variant timestamps each step end the same way), "total" includes set-up
(building dataloaders and the optimizer, the first steps, end-of-training work).

    .venv/bin/python bench/overhead.py [--repeats 3] [--mlp-steps 3000] [--gpt-steps 40] [--threads 1]
                                       [--clock thread] [--malloc fixed|default] [--skip mlp|gpt|peers]
                                       [--fresh]
    .venv/bin/python bench/overhead.py --count-calls
    .venv/bin/python bench/overhead.py --count-instructions      # needs valgrind; ~5 minutes
    .venv/bin/python bench/overhead.py --count-bytecodes         # seconds

`--count-calls` prints, instead of rates, the Python function calls one optimizer step of the tiny MLP
makes in each loop (cProfile's count over 2000 steps): a measure of the loop's own work that does
not move with the machine's load, to compare two trees (`PYTHONPATH=<old>/src` runs an old one).

`--count-instructions` prints the machine instructions one optimizer step of the tiny MLP executes in
each loop (user space, counted by valgrind's callgrind: the difference between a run of
INSTRUCTION_BASE + INSTRUCTION_STEPS steps and one of INSTRUCTION_BASE, so imports and set-up cancel
out). It does not move with the load either (within about 1% between runs), and unlike the Python
call count it weighs each call by its work. Kernel time (page faults) is not in it: the rates'
page-fault column shows that.

`--count-bytecodes` prints the Python bytecodes one optimizer step executes in each loop (sys.settrace
opcode events, the difference between a run of 130 steps and one of 30) and, for trainwright, its own
functions' share: where a step's Python time goes. Fewer bytecodes is not the whole story: cachegrind's
cache and branch simulation puts as much of a small step's time in L1 instruction misses and branch
mispredicts of CPython's eval loop as in instructions, and those grow with the number of small
functions a step passes through (a C-level fast path with fewer bytecodes measured slower once).

`--fresh` takes each measurement in a new Python process (a warm-up run of the same variant there,
then the timed one), as a user's script runs: no variant inherits another's heap, garbage or
interpreter caches. Slower to run (imports each time), and not steadier: on the 2-core VM both
modes' ratios scatter by about +-2% between invocations, so compare several.

`--clock thread` times with this thread's CPU time instead of the wall clock: other processes on a
shared machine then do not count against whichever variant they happened to overlap (run it with
`--threads 1`, so all the work is on this thread; DataLoader workers are not used here).

`--malloc fixed` (the default on glibc) re-runs the script with glibc's mmap and trim thresholds
fixed (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`), the same for every variant. Left dynamic,
glibc moves its mmap threshold with whatever the process freed last, so GPT-2's activations are
served by fresh mmaps (thousands of page faults a step) in some runs and by the reused heap in
others: a +-5% lottery between runs that hides a 1% goal. The page faults per steady step are
printed for each variant (one number per run); `--malloc default` measures the allocator as users
meet it.

Goals: >= 0.97x the raw loop on the tiny MLP, >= 0.99x on the GPT-2 workload.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from functools import partial

import torch
from _common import add_malloc_argument, apply_malloc
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
os.environ.setdefault("WANDB_MODE", "disabled")


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x, labels=None):
        out = self.net(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


class VecData(Dataset):
    def __init__(self, n=4096):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 32, generator=g)
        self.y = self.x.sum(-1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class TokenData(Dataset):
    def __init__(self, n=512, seq=128, vocab=256):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def gpt_model():
    try:
        from transformers import GPT2Config, GPT2LMHeadModel

        # use_cache=False everywhere: the trainers turn the KV cache off for training, so the raw loop does too
        cfg = GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=256, n_positions=128, use_cache=False)
        return GPT2LMHeadModel(cfg), "transformers GPT2LMHeadModel"
    except ImportError:
        from trainwright.app.tinygpt import TinyGPT, TinyGPTConfig

        return TinyGPT(TinyGPTConfig(block_size=128, n_layer=2, n_embd=256, n_head=4)), "trainwright TinyGPT"


def make_optimizer(model):
    from trainwright.optim.optimizers import get_decay_parameter_names

    decay = set(get_decay_parameter_names(model))
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in params if n in decay], "weight_decay": 0.0},
        {"params": [p for n, p in params if n not in decay], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=1e-4, fused=True)


WARMUP = 20
_now = time.perf_counter  # --clock thread: time.thread_time


_RUSAGE = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)


class Clock:
    """Timestamps every optimizer step end (used identically by every variant)."""

    def __init__(self):
        self.times: list[float] = []
        self.faults = 0

    def on_step_end(self, *args, **kwargs):
        self.times.append(_now())
        if len(self.times) == WARMUP:
            self.faults = resource.getrusage(_RUSAGE).ru_minflt

    def rates(self, start: float) -> tuple[float, float, float]:
        """(steady steps/s, total steps/s, minor page faults per steady step)."""
        t = self.times
        steady = (len(t) - WARMUP) / (t[-1] - t[WARMUP - 1])
        faults = (resource.getrusage(_RUSAGE).ru_minflt - self.faults) / (len(t) - WARMUP)
        return steady, len(t) / (t[-1] - start), faults


def lean_chores(opt, steps):
    """(schedule, zero) of a hand-written loop that skips torch's generic code for both, as
    trainwright does: the linear rate written into each group, each `.grad` set to None."""
    params = [p for group in opt.param_groups for p in group["params"]]
    bases = [group["lr"] for group in opt.param_groups]
    done = [0]

    def schedule():
        done[0] += 1
        factor = max(0.0, 1 - done[0] / steps)
        for group, base in zip(opt.param_groups, bases):
            group["lr"] = base * factor

    def zero():
        for p in params:
            p.grad = None

    return schedule, zero


def raw_loop(model, data, steps, batch_size, lean=False):
    """The hand-written loop: shuffle, collate, forward, backward, clip, step, schedule, zero (with
    `lean`, the last two without torch's generic code: `lean_chores`)."""
    clock = Clock()
    start = _now()
    torch.manual_seed(42)
    opt = make_optimizer(model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / steps))
    schedule, zero = sched.step, partial(opt.zero_grad, set_to_none=True)
    if lean:
        schedule, zero = lean_chores(opt, steps)
    loader = DataLoader(
        data, batch_size=batch_size, sampler=RandomSampler(data, generator=torch.Generator().manual_seed(42))
    )
    model.train()
    done = 0
    while done < steps:
        for batch in loader:
            loss = model(**batch)["loss"]
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            schedule()
            zero()
            clock.on_step_end()
            done += 1
            if done == steps:
                break
    return clock.rates(start)


def hf_api_loop(lib, model, data, steps, batch_size):
    """The same run through a library with the transformers.Trainer API (trainwright or transformers)."""

    class StepClock(Clock, lib.TrainerCallback):
        pass

    with tempfile.TemporaryDirectory() as out:
        args = lib.TrainingArguments(
            output_dir=out,
            max_steps=steps,
            per_device_train_batch_size=batch_size,
            learning_rate=1e-4,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            logging_steps=500,
            seed=42,
            use_cpu=True,
        )
        clock = StepClock()
        start = _now()
        trainer = lib.Trainer(model=model, args=args, train_dataset=data, callbacks=[clock])
        trainer.train()
        return clock.rates(start)


def trainwright_loop(model, data, steps, batch_size):
    import trainwright

    return hf_api_loop(trainwright, model, data, steps, batch_size)


def transformers_loop(model, data, steps, batch_size):
    import transformers

    return hf_api_loop(transformers, model, data, steps, batch_size)


RUNNERS = {
    "raw": raw_loop,
    "raw-lean": partial(raw_loop, lean=True),
    "trainwright": trainwright_loop,
    "transformers.Trainer": transformers_loop,
}


def workload(name):
    """(model factory, dataset) of a workload: "mlp" or "gpt"."""
    if name == "mlp":
        return MLP, VecData()
    return (lambda: gpt_model()[0]), TokenData()


def rate_of(name, variant, steps, batch_size=8):
    """One variant's rates in this process, after a warm-up run of its own (the unit `--fresh` times)."""
    model_fn, data = workload(name)
    RUNNERS[variant](model_fn(), data, WARMUP + 10, batch_size)  # imports and first calls
    gc.collect()
    torch.manual_seed(0)
    return RUNNERS[variant](model_fn(), data, steps, batch_size)


def rate_in_fresh_process(name, variant, steps, passed):
    """`rate_of` in a new Python process (given `passed`: this run's --threads, --clock, --malloc)."""
    cmd = [sys.executable, __file__, *passed, "--rate-of", name, variant, str(steps)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RATE ")), None)
    if done.returncode or line is None:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    steady, total, faults = (float(x) for x in line.split()[1:])
    return steady, total, faults


def bench(title, name, steps, batch_size, repeats, peers, fresh=None):
    """Alternating runs of each variant on workload `name`; in fresh processes when `fresh` (the
    arguments to pass them) is given."""
    keys = ["raw", "raw-lean", "trainwright"] + (["transformers.Trainer"] if "transformers" in peers else [])
    model_fn, data = workload(name)
    results: dict[str, list[tuple[float, float, float]]] = {k: [] for k in keys}
    for repeat in range(repeats):
        # every other repeat in reverse: no variant always runs first (or right after another)
        for key in keys if repeat % 2 == 0 else keys[::-1]:
            if fresh is not None:
                results[key].append(rate_in_fresh_process(name, key, steps, fresh))
                continue
            # whatever a finished run left in cycles is collected here, not by chance inside the next run
            gc.collect()
            torch.manual_seed(0)
            results[key].append(RUNNERS[key](model_fn(), data, steps, batch_size))
    steady = {k: max(r[0] for r in v) for k, v in results.items()}
    total = {k: max(r[1] for r in v) for k, v in results.items()}
    faults = {k: "/".join(f"{r[2]:.0f}" for r in v) for k, v in results.items()}
    where = "a fresh process each" if fresh is not None else "in this process"
    print(f"\n{title}: {steps} steps, batch {batch_size}, best of {repeats}, {where}")
    for key in keys:
        print(
            f"  {key:22s} steady {steady[key]:9.1f} steps/s  ratio {steady[key] / steady['raw']:.3f}   "
            f"| total {total[key]:9.1f} steps/s  ratio {total[key] / total['raw']:.3f}   "
            f"| page faults/step {faults[key]}"
        )
    return steady["trainwright"] / steady["raw"], steady["trainwright"] / steady["raw-lean"]


def count_bytecodes(steps: int = 100, top: int = 20) -> None:
    """Python bytecodes per optimizer step of the tiny MLP, raw loop and trainwright (see the docstring)."""
    from collections import Counter

    data = VecData()
    trainwright_loop(MLP(), data, WARMUP + 10, 8)  # imports and first-call work out of the count
    per_step: dict[str, Counter] = {}
    for name, fn in (("raw", raw_loop), ("trainwright", trainwright_loop)):
        runs = []
        for n in (WARMUP + 10, WARMUP + 10 + steps):
            counts: Counter = Counter()

            def tracer(frame, event, arg, counts=counts):
                frame.f_trace_opcodes, frame.f_trace_lines = True, False
                key = f"{frame.f_code.co_filename.rpartition('/src/')[2]}:{frame.f_code.co_name}"

                def local(frame, event, arg):
                    if event == "opcode":
                        counts[key] += 1
                    return local

                return local

            sys.settrace(tracer)
            try:
                fn(MLP(), data, n, 8)
            finally:
                sys.settrace(None)
            runs.append(counts)
        per_step[name] = Counter({k: (runs[1][k] - runs[0][k]) / steps for k in runs[1]})
    raw, ours = (sum(per_step[k].values()) for k in ("raw", "trainwright"))
    print(
        f"Python bytecodes per step, tiny MLP: raw {raw:.0f}, trainwright {ours:.0f}, ratio {ours / raw:.3f}"
    )
    own = [(v, k) for k, v in per_step["trainwright"].items() if k.startswith("trainwright/") and v >= 1]
    for v, k in sorted(own, reverse=True)[:top]:
        print(f"  {v:6.0f}  {k}")


def count_calls(steps: int = 2000) -> None:
    """Python calls per optimizer step of the tiny MLP, raw loop and trainwright (see the docstring)."""
    import cProfile
    import pstats

    import trainwright

    data = VecData()
    trainwright_loop(MLP(), data, 100, 8)  # imports and first-call work out of the count
    counts = {}
    for name, fn in (("raw", raw_loop), ("trainwright", trainwright_loop)):
        profile = cProfile.Profile()
        profile.enable()
        fn(MLP(), data, steps, 8)
        profile.disable()
        counts[name] = sum(v[1] for v in pstats.Stats(profile).stats.values()) / steps  # type: ignore[attr-defined]  # stats is undocumented
    print(f"trainwright from {os.path.dirname(trainwright.__file__)}")
    print(
        f"Python calls per step, tiny MLP: raw {counts['raw']:.1f}, trainwright {counts['trainwright']:.1f}"
    )


INSTRUCTION_STEPS = 400  # with the base, under the 500 steps between logs: plain steps only
INSTRUCTION_BASE = WARMUP + 10  # the shorter run: long enough that the loops' rates can be computed


def run_steps(variant: str, steps: int) -> None:
    """Train the tiny MLP `steps` (> WARMUP + 1) steps in one loop, on one thread (the unit
    --count-instructions counts)."""
    torch.set_num_threads(1)
    RUNNERS[variant](MLP(), VecData(), steps, 8)


def count_instructions() -> None:
    """Instructions per optimizer step of the tiny MLP, raw loop and trainwright (see the docstring)."""
    import re
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    if shutil.which("valgrind") is None:
        raise SystemExit("--count-instructions needs valgrind on PATH (apt install valgrind)")

    def total(variant: str, steps: int) -> int:
        cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable]
        env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict layouts in every run
        done = subprocess.run(
            [*cmd, __file__, "--run-steps", variant, str(steps)], capture_output=True, text=True, env=env
        )
        found = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode != 0 or not found:
            raise SystemExit(f"valgrind run of {variant} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return int(found.group(1))

    runs = [
        (v, n)
        for v in ("raw", "trainwright")
        for n in (INSTRUCTION_BASE, INSTRUCTION_BASE + INSTRUCTION_STEPS)
    ]
    with ThreadPoolExecutor(max(1, min(4, (os.cpu_count() or 1)))) as pool:
        totals = dict(zip(runs, pool.map(lambda run: total(*run), runs)))
    per_step = {
        v: (totals[(v, INSTRUCTION_BASE + INSTRUCTION_STEPS)] - totals[(v, INSTRUCTION_BASE)])
        / INSTRUCTION_STEPS
        for v in ("raw", "trainwright")
    }
    print(
        f"instructions per step, tiny MLP ({INSTRUCTION_STEPS} steps, callgrind): raw {per_step['raw']:,.0f}, "
        f"trainwright {per_step['trainwright']:,.0f}, ratio {per_step['trainwright'] / per_step['raw']:.3f}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mlp-steps", type=int, default=3000)
    p.add_argument("--gpt-steps", type=int, default=40)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    p.add_argument(
        "--clock", choices=("wall", "thread"), default="wall", help="wall clock or thread CPU time"
    )
    p.add_argument(
        "--skip",
        choices=("mlp", "gpt", "peers"),
        action="append",
        default=[],
        help="leave a workload (or the peer libraries) out",
    )
    p.add_argument("--count-calls", action="store_true", help="Python calls per step instead of rates")
    p.add_argument(
        "--count-instructions", action="store_true", help="instructions per step (valgrind) instead of rates"
    )
    p.add_argument(
        "--count-bytecodes", action="store_true", help="Python bytecodes per step instead of rates"
    )
    p.add_argument(
        "--fresh", action="store_true", help="each measurement in a new process (after a warm-up run there)"
    )
    p.add_argument("--run-steps", nargs=2, metavar=("VARIANT", "STEPS"), help=argparse.SUPPRESS)
    p.add_argument("--rate-of", nargs=3, metavar=("WORKLOAD", "VARIANT", "STEPS"), help=argparse.SUPPRESS)
    add_malloc_argument(p)
    ns = p.parse_args()
    if ns.run_steps:
        run_steps(ns.run_steps[0], int(ns.run_steps[1]))
        return 0
    if ns.count_calls:
        count_calls()
        return 0
    if ns.count_instructions:
        count_instructions()
        return 0
    if ns.count_bytecodes:
        count_bytecodes()
        return 0
    for name in ("mlp_steps", "gpt_steps"):
        if getattr(ns, name) <= WARMUP + 1:  # the steady rate is timed after the warm-up steps
            p.error(f"--{name.replace('_', '-')} must be > {WARMUP + 1} (the first {WARMUP} are warm-up)")
    malloc = apply_malloc(ns.malloc)
    if ns.clock == "thread":
        global _now
        _now = time.thread_time
    if ns.threads:
        torch.set_num_threads(ns.threads)
    if ns.rate_of:
        print("RATE", *rate_of(ns.rate_of[0], ns.rate_of[1], int(ns.rate_of[2])))
        return 0
    peers = []
    try:
        import transformers  # noqa: F401

        peers.append("transformers")
    except ImportError:
        pass
    if "peers" in ns.skip:
        peers = []
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, clock {ns.clock}, {malloc}, "
        f"load {load}, peers: {peers or 'none'}"
    )
    results = []
    fresh = ["--threads", str(ns.threads), "--clock", ns.clock, "--malloc", ns.malloc] if ns.fresh else None
    if "mlp" not in ns.skip:
        mlp, mlp_lean = bench("tiny MLP (overhead-bound)", "mlp", ns.mlp_steps, 8, ns.repeats, peers, fresh)
        results.append(f"tiny MLP {mlp:.3f} (goal >= 0.97; {mlp_lean:.3f} of raw-lean)")
    if "gpt" not in ns.skip:
        title = f"2-layer GPT-2, seq 128 ({gpt_model()[1]}, compute-bound)"
        gpt, gpt_lean = bench(title, "gpt", ns.gpt_steps, 8, ns.repeats, peers, fresh)
        results.append(f"GPT-2 {gpt:.3f} (goal >= 0.99; {gpt_lean:.3f} of raw-lean)")
    print(f"load at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"\nSUMMARY trainwright/raw: {', '.join(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
