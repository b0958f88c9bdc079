"""MFU of a real training run, as the SpeedMonitor logs it: GPT-2 small (124M, built offline from
its config) in bf16 on the accelerator, counted FLOPs against the device's dense peak, beside the
6N·tokens estimate and a hand-written torch loop's tokens/s measured in the same process.

    python bench/mfu.py                      # GPT-2 small, batch 8 x 1024, 60 steps (a GPU)
    python bench/mfu.py --tiny --steps 20    # a smoke run on the CPU (no MFU: no known peak)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import torch
from _common import load_average, quiet
from torch.utils.data import Dataset

from trainwright import SpeedMonitor, Trainer, TrainingArguments
from trainwright.observe.flops import estimate_6n_flops


class Tokens(Dataset):
    def __init__(self, n: int, seq: int, vocab: int):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def model_and_data(tiny: bool, steps: int, batch: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    if tiny:
        config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=128)
    else:
        config = GPT2Config()  # 124M: 12 layers, 768 wide, 1024 positions, vocabulary 50257
    config.use_cache = False
    seq = config.n_positions
    torch.manual_seed(0)
    return GPT2LMHeadModel(config), Tokens(batch * (steps + 1), seq, config.vocab_size), seq


def raw_loop(model, data, batch: int, steps: int, device, dtype) -> float:
    """Tokens/s of a hand-written loop (AdamW fused, bf16 autocast), steps after the first 5."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    model.train()
    ids = data.ids.to(device)
    times = []
    for step in range(steps):
        x = ids[(step * batch) % len(ids) :][:batch]
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return batch * x.shape[1] / statistics.median(times[5:])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="a 2-layer GPT-2 (CPU smoke run)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=8)
    ns = p.parse_args()
    if ns.steps < 20:  # SpeedMonitor's first full 10-step window ends after the first logged one
        p.error(
            f"--steps must be >= 20 (one full 10-step throughput window after the first log), got {ns.steps}"
        )
    quiet()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    bf16 = cuda and torch.cuda.is_bf16_supported()
    name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"torch {torch.__version__}, {name}, bf16 {bf16}, {load_average()}")

    model, data, seq = model_and_data(ns.tiny, ns.steps, ns.batch)
    monitor = SpeedMonitor(window_size=10)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=ns.batch,
            max_steps=ns.steps,
            logging_steps=10,
            bf16=bf16,
            optim="adamw_torch_fused",
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            use_cpu=not cuda,
        )
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[monitor])
        trainer.train()
    rows = [r for r in trainer.state.log_history if "throughput/tokens_per_sec" in r]
    tokens_per_sec = max(r["throughput/tokens_per_sec"] for r in rows)
    one = {"input_ids": data.ids[:1], "labels": data.ids[:1]}
    counted = trainer.floating_point_ops(one) / seq
    six_n = estimate_6n_flops(model, one) / seq
    print(f"GPT-2 {'tiny' if ns.tiny else 'small (124M)'}, batch {ns.batch} x {seq}, {ns.steps} steps")
    print(
        f"  counted FLOPs per token {counted / 1e6:.1f} M, 6N {six_n / 1e6:.1f} M (ratio {counted / six_n:.3f})"
    )
    print(f"  trainwright tokens/s (best 10-step window) {tokens_per_sec:,.0f}")
    mfu = [r["throughput/device/mfu"] for r in rows if "throughput/device/mfu" in r]
    if mfu:
        print(
            f"  MFU (SpeedMonitor, counted FLOPs / dense peak) best {max(mfu):.3f}, median {statistics.median(mfu):.3f}"
        )
    else:
        print("  MFU: none (no known dense peak for this device)")
    torch.manual_seed(0)
    fresh, _, _ = model_and_data(ns.tiny, ns.steps, ns.batch)
    raw = raw_loop(
        fresh.to(device), data, ns.batch, min(ns.steps, 40), device, torch.bfloat16 if bf16 else torch.float32
    )
    print(
        f"  hand-written loop tokens/s (median step) {raw:,.0f}; trainwright / raw {tokens_per_sec / raw:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
