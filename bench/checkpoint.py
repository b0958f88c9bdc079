"""Checkpoint cost: save time against raw safetensors + torch.save, and time-to-first-step on resume.

1. Save. `Trainer._save_checkpoint()` (weights, AdamW state, scheduler, RNG, JSON files; written
   into a temporary folder, fsynced, renamed into place) against the raw baseline of the issue:
   `safetensors.torch.save_file` of the same model tensors + `torch.save` of the same optimizer
   state dict, with no fsync. A second baseline adds the fsync of those two files and their folder,
   which is the fair one: trainwright guarantees the checkpoint is on disk when the call returns,
   the raw baseline does not. Models of ~110 MB fp32 weights (+ ~220 MB AdamW state): a
   transformers GPT2LMHeadModel built from a config (saved through `save_pretrained`) and
   trainwright's TinyGPT (the plain nn.Module path). Runs alternate; every write is flushed with
   `os.sync()` and deleted outside the timed region, so no run pays for another's writeback.

2. Resume. Time from `Trainer.train(resume_from_checkpoint=path)` to the end of its first
   optimizer step, for a checkpoint at 40% of a 5,000-batch epoch, against `Trainer.train()` from
   scratch. The dataset's `__getitem__` does real work and counts its calls: with the skip done in
   the sampler, a resumed run loads one batch before its first step, like a fresh one. Also
   printed: what skipping the 2,000 seen batches by iterating the dataloader would have cost.

    .venv/bin/python bench/checkpoint.py [--repeats 5] [--resume-repeats 9] [--skip save|resume]
                                        [--profile]

Goals: save <= 1.15x the raw baseline (the issue's comparison: raw save_file + torch.save; the
fsync baseline is printed beside it); time-to-first-step after resume <= 1.1x a fresh start.
Times vary with the disk; read the medians and the spread together.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time

import torch
from _common import StepClock, quiet, summary
from overhead import MLP, TokenData
from torch.utils.data import DataLoader, Dataset

from trainwright import Trainer, TrainingArguments

quiet()

# --------------------------------------------------------------------------------------- models


def gpt2_100mb() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_layer=6, n_embd=512, n_head=8, vocab_size=16384, n_positions=256, bos_token_id=0, eos_token_id=0
    )
    return GPT2LMHeadModel(cfg)


def tinygpt_100mb() -> torch.nn.Module:
    from trainwright.tinygpt import TinyGPT, TinyGPTConfig

    return TinyGPT(TinyGPTConfig(vocab_size=16384, block_size=256, n_layer=6, n_embd=512, n_head=8))


def save_models() -> list[tuple[str, object]]:
    models = []
    try:
        import transformers  # noqa: F401

        models.append(("transformers GPT2LMHeadModel 6x512, vocab 16384", gpt2_100mb))
    except ImportError:
        pass
    models.append(("trainwright TinyGPT 6x512, vocab 16384", tinygpt_100mb))
    return models


# ----------------------------------------------------------------------------------------- save


def _trained_trainer(build, out: str) -> Trainer:
    """A Trainer whose model and AdamW state exist (one optimizer step taken)."""
    torch.manual_seed(0)
    args = TrainingArguments(
        output_dir=out,
        max_steps=1,
        per_device_train_batch_size=2,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        logging_strategy="no",
        use_cpu=True,
        seed=0,
    )
    trainer = Trainer(model=build(), args=args, train_dataset=TokenData(n=4, seq=32, vocab=16384))
    trainer.train()
    return trainer


def _unique_tensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One entry per storage (safetensors refuses shared tensors, e.g. tied embeddings)."""
    seen: set[int] = set()
    out = {}
    for name, t in state_dict.items():
        if t.untyped_storage().data_ptr() in seen:
            continue
        seen.add(t.untyped_storage().data_ptr())
        out[name] = t.detach().contiguous()
    return out


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_save(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: str, durable: bool) -> float:
    from safetensors.torch import save_file

    os.makedirs(folder)
    start = time.perf_counter()
    weights, opt = os.path.join(folder, "model.safetensors"), os.path.join(folder, "optimizer.pt")
    save_file(_unique_tensors(model.state_dict()), weights, metadata={"format": "pt"})
    torch.save(optimizer.state_dict(), opt)
    if durable:
        _fsync(weights)
        _fsync(opt)
        _fsync(folder)
    return time.perf_counter() - start


def trainwright_save(trainer: Trainer) -> float:
    start = time.perf_counter()
    trainer._save_checkpoint()
    return time.perf_counter() - start


def _folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(folder) for f in fs)


def _reset(path: str) -> None:
    """Remove what a run wrote and flush the disk, outside the timed region."""
    shutil.rmtree(path, ignore_errors=True)
    os.sync()


def bench_save(name: str, build, repeats: int, profile: bool) -> float:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as root:
        trainer = _trained_trainer(build, os.path.join(root, "run"))
        model, optimizer = trainer.model, trainer.optimizer
        tw_path = os.path.join(root, "run", "checkpoint-1")
        raw_path = os.path.join(root, "raw")
        runners = {
            "trainwright _save_checkpoint": lambda: trainwright_save(trainer),
            "raw save_file + torch.save": lambda: raw_save(model, optimizer, raw_path, durable=False),
            "raw + fsync": lambda: raw_save(model, optimizer, raw_path, durable=True),
        }
        outputs = {"trainwright _save_checkpoint": tw_path}
        keys = list(runners)
        times: dict[str, list[float]] = {k: [] for k in keys}
        sizes: dict[str, int] = {}
        for key in keys:  # warm-up: first writes of a process pay page-cache and allocator set-up
            runners[key]()
            _reset(outputs.get(key, raw_path))
        for r in range(repeats):
            order = keys[r % len(keys) :] + keys[: r % len(keys)]  # rotate which runs first
            for key in order:
                times[key].append(runners[key]())
                out = outputs.get(key, raw_path)
                sizes[key] = _folder_bytes(out)
                _reset(out)
        if profile:
            prof = cProfile.Profile()
            prof.enable()
            trainwright_save(trainer)
            prof.disable()
            _reset(tw_path)
            print(f"\n  cProfile of one trainwright save ({name}):")
            pstats.Stats(prof).sort_stats("cumulative").print_stats(18)

    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    print(f"\nSave: {name}, {params / 1e6:.1f}M parameters, AdamW state; {repeats} alternating runs")
    for key in keys:
        print(f"  {key:30s} {summary(times[key])}   {sizes[key] / 1e6:7.1f} MB written")
    tw = statistics.median(times["trainwright _save_checkpoint"])
    vs_raw = tw / statistics.median(times["raw save_file + torch.save"])
    vs_fsync = tw / statistics.median(times["raw + fsync"])
    print(f"  ratio trainwright / raw         {vs_raw:.3f}   <- the issue's goal comparison (goal <= 1.15)")
    print(f"  ratio trainwright / raw+fsync   {vs_fsync:.3f}   (same durability as trainwright)")
    return vs_raw, vs_fsync


# --------------------------------------------------------------------------------------- resume

BATCH = 4
EPOCH_BATCHES = 5000
RESUME_AT = 2000  # 40% of the epoch


class CostlyData(Dataset):
    """Regression pairs whose construction costs real work (a few small matmuls), counting calls."""

    def __init__(self, n: int = BATCH * EPOCH_BATCHES, dim: int = 32, work: int = 8) -> None:
        g = torch.Generator().manual_seed(0)
        self.base = torch.randn(97, dim, generator=g)
        self.w = torch.randn(dim, dim, generator=g) / dim**0.5
        self.n, self.work = n, work
        self.calls = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        self.calls += 1
        x = self.base[i % 97]
        for _ in range(self.work):
            x = torch.tanh(x @ self.w)
        return {"x": x, "labels": x.sum()}


class SaveAt(StepClock):
    """Asks for a checkpoint at `step`, then stops: the checkpoint a real run would write there."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_save = control.should_training_stop = True
        return control


def _resume_args(out: str) -> TrainingArguments:
    return TrainingArguments(
        output_dir=out,
        num_train_epochs=1,
        per_device_train_batch_size=BATCH,
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        seed=42,
    )


def time_to_first_step(data: CostlyData, out: str, resume: str | None, profile: bool = False):
    """(seconds from train() to the first step's end, __getitem__ calls before it)."""
    torch.manual_seed(0)
    clock = StepClock(stop_after=1, probe=lambda: data.calls)
    trainer = Trainer(model=MLP(), args=_resume_args(out), train_dataset=data, callbacks=[clock])
    data.calls = 0
    prof = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if prof is not None:
        prof.enable()
    trainer.train(resume_from_checkpoint=resume)
    if prof is not None:
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    return clock.first - start, clock.probed, trainer.state.global_step


def naive_skip_cost(data: CostlyData) -> tuple[float, int]:
    """Seconds and __getitem__ calls to skip RESUME_AT batches by iterating a dataloader."""
    loader = DataLoader(data, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(0))
    data.calls = 0
    start = time.perf_counter()
    for i, _ in enumerate(loader):
        if i + 1 == RESUME_AT:
            break
    return time.perf_counter() - start, data.calls


def bench_resume(repeats: int, profile: bool) -> float:
    data = CostlyData()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as root:
        torch.manual_seed(0)
        maker = Trainer(
            model=MLP(),
            args=_resume_args(os.path.join(root, "run")),
            train_dataset=data,
            callbacks=[SaveAt(RESUME_AT)],
        )
        start = time.perf_counter()
        maker.train()
        made = time.perf_counter() - start
        ckpt = os.path.join(root, "run", f"checkpoint-{RESUME_AT}")
        if not os.path.isdir(ckpt):
            raise RuntimeError(f"the checkpoint run did not write {ckpt}")
        timed = os.path.join(root, "timed")
        variants = {"fresh train()": None, f"train(resume_from_checkpoint=checkpoint-{RESUME_AT})": ckpt}
        times: dict[str, list[float]] = {k: [] for k in variants}
        calls: dict[str, int] = {}
        first_step: dict[str, int] = {}
        for resume in variants.values():  # warm-up (first-call imports, allocator)
            time_to_first_step(data, timed, resume)
        for r in range(repeats):
            keys = list(variants) if r % 2 == 0 else list(reversed(variants))
            for key in keys:
                seconds, n_calls, step = time_to_first_step(data, timed, variants[key])
                times[key].append(seconds)
                calls[key], first_step[key] = n_calls, step
        if profile:
            print("\n  cProfile of one resumed train() up to its first step:")
            time_to_first_step(data, timed, ckpt, profile=True)
        skip_s, skip_calls = naive_skip_cost(data)

    per_item = skip_s / max(skip_calls, 1)
    print(
        f"\nResume: MLP on {len(data)} samples, batch {BATCH} = {EPOCH_BATCHES} batches/epoch, checkpoint at "
        f"batch {RESUME_AT} (written by a {made:.1f} s run); __getitem__ ~{per_item * 1e6:.0f} us; "
        f"{repeats} alternating runs"
    )
    for key in variants:
        print(
            f"  {key:45s} {summary(times[key], 'ms', 1e3)}   first step = global step {first_step[key]}, "
            f"__getitem__ calls before it: {calls[key]}"
        )
    ratio = statistics.median(times[list(variants)[1]]) / statistics.median(times["fresh train()"])
    print(
        f"  for reference, skipping {RESUME_AT} batches by iterating the dataloader: {skip_s * 1e3:.0f} ms, "
        f"{skip_calls} __getitem__ calls"
    )
    print(f"  ratio resumed / fresh time-to-first-step  {ratio:.3f}   (goal <= 1.1)")
    return ratio


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="alternating save runs per variant")
    p.add_argument("--resume-repeats", type=int, default=9, help="alternating resume/fresh runs")
    p.add_argument("--skip", choices=["save", "resume"], help="leave one of the two parts out")
    p.add_argument("--profile", action="store_true", help="print cProfile of one trainwright save and resume")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ns = p.parse_args()
    if ns.threads:
        torch.set_num_threads(ns.threads)
    where = os.environ.get("BENCH_DIR") or tempfile.gettempdir()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, files under {where} (BENCH_DIR)")
    results = []
    if ns.skip != "save":
        for name, build in save_models():
            vs_raw, vs_fsync = bench_save(name, build, ns.repeats, ns.profile)
            results.append(f"save {name.split()[0]} {vs_raw:.3f} (vs raw+fsync {vs_fsync:.3f})")
    if ns.skip != "resume":
        results.append(f"resume/fresh time-to-first-step {bench_resume(ns.resume_repeats, ns.profile):.3f}")
    print("\nSUMMARY (goals: save <= 1.15 vs raw; resume <= 1.1):\n  " + "\n  ".join(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
