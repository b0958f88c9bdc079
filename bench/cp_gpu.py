"""Context parallelism on GPUs against one process: the same tiny Llama, data and global batch trained
with `parallelism_config` cp_size=2 (and dp_shard=2 x cp=2 with 4 GPUs, HSDP dp_replicate=2 x cp=2
with --hsdp), step by step, and the losses and gradient norms compared with one GPU's.

    python bench/cp_gpu.py [--steps 6] [--seq 250] [--global-batch 4] [--bf16] [--rotate allgather|alltoall]

The sequences are right-padded rows of different lengths (the padding mask is dropped under context
parallelism: `trainwright.distributed.context_parallel`), with a length that is not a multiple of
2 x cp_size (padded at the end). Every layout reads the same samples per optimizer step, so its
losses and gradient norms must match one process's up to float summation order (fp32: 1e-4
relative; bf16: 2e-2). Prints one line per layout and exits 1 when a layout differs by more.

With fewer than 2 CUDA GPUs it prints why it cannot run and exits 0 (`--plan` prints the layouts it
would run without running them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import launch_job  # noqa: E402

HERE = os.path.abspath(__file__)
VOCAB = 512


def worker(cfg: dict) -> None:
    """One layout: train `steps` optimizer steps, rank 0 writes every step's loss and gradient norm."""
    import torch
    import transformers

    from trainwright.args.training_args import TrainingArguments
    from trainwright.data import pad_sequence_collator
    from trainwright.loop.trainer import Trainer

    layout = cfg["layout"]
    data_ranks = layout.get("dp_replicate_size", 1) * layout.get("dp_shard_size", 1)

    class Rows(torch.utils.data.Dataset):
        """Rows of seq/2 to seq tokens: right padding in every batch."""

        def __init__(self, n: int):
            g = torch.Generator().manual_seed(0)
            lengths = torch.randint(cfg["seq"] // 2, cfg["seq"] + 1, (n,), generator=g)
            self.rows = [torch.randint(1, VOCAB, (int(k),), generator=g) for k in lengths]

        def __len__(self) -> int:
            return len(self.rows)

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": self.rows[i], "labels": self.rows[i]}

    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=cfg["hidden"],
        intermediate_size=2 * cfg["hidden"],
        num_hidden_layers=cfg["layers"],
        num_attention_heads=cfg["heads"],
        num_key_value_heads=cfg["kv_heads"],
        max_position_embeddings=2 * cfg["seq"],
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    parallel = dict(layout, cp_comm_strategy=cfg["rotate"]) if layout else None
    args = TrainingArguments(
        output_dir=cfg["out"],
        parallelism_config=parallel,
        per_device_train_batch_size=cfg["global_batch"] // data_ranks,
        max_steps=cfg["steps"],
        logging_steps=1,
        learning_rate=1e-3,
        optim="sgd",
        max_grad_norm=1.0,
        bf16=cfg["bf16"],
        save_strategy="no",
        report_to="none",
        dataloader_drop_last=True,
        seed=0,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Rows(cfg["global_batch"] * cfg["steps"]),
        data_collator=pad_sequence_collator(),
    )
    trainer.train()
    if trainer.is_world_process_zero():
        rows = [r for r in trainer.state.log_history if "loss" in r and "grad_norm" in r]
        with open(os.path.join(cfg["out"], "rows.json"), "w") as f:
            json.dump([{"loss": r["loss"], "grad_norm": r["grad_norm"]} for r in rows], f)


def layouts(gpus: int, hsdp: bool) -> list[dict[str, int]]:
    """The context-parallel layouts this many GPUs run (the reference is one process)."""
    out = [{"cp_size": 2}]
    if gpus >= 4:
        out.append({"dp_shard_size": 2, "cp_size": 2})
        if hsdp:
            out.append({"dp_replicate_size": 2, "cp_size": 2})
    return out


def describe(layout: dict[str, int]) -> str:
    return " x ".join(f"{k[:-5]}={v}" for k, v in layout.items()) or "one process"


def compare(rows: list[dict], reference: list[dict]) -> float:
    """The largest relative difference of a step's loss or gradient norm."""
    if len(rows) != len(reference):
        return float("inf")
    gaps = [
        abs(r[key] - ref[key]) / max(abs(ref[key]), 1e-12)
        for r, ref in zip(rows, reference)
        for key in ("loss", "grad_norm")
    ]
    return max(gaps, default=float("inf"))


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seq", type=int, default=250, help="longest row (rows are seq/2 to seq tokens)")
    parser.add_argument("--global-batch", type=int, default=4, help="rows per optimizer step, every layout")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4, help="key/value heads (< heads: grouped-query)")
    parser.add_argument("--bf16", action="store_true", help="mixed precision in bfloat16 (tolerance 2e-2)")
    parser.add_argument(
        "--rotate", choices=("allgather", "alltoall"), default="allgather", help="cp_comm_strategy"
    )
    parser.add_argument("--hsdp", action="store_true", help="also dp_replicate=2 x cp=2 (4 GPUs)")
    parser.add_argument("--plan", action="store_true", help="print the layouts for --gpus and exit")
    parser.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: every visible one)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.global_batch % 2:
        parser.error("--global-batch must be even (dp_shard=2 splits it)")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_arguments(argv)
    if opts.worker:
        worker(json.loads(opts.worker))
        return 0
    import torch

    gpus = (
        opts.gpus
        if opts.gpus is not None
        else (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    )
    if opts.plan:
        print(
            f"{gpus} GPU(s): one process, then",
            ", ".join(describe(x) for x in layouts(max(gpus, 2), opts.hsdp)),
        )
        return 0
    if gpus < 2:
        print(
            f"bench/cp_gpu.py: {gpus} CUDA GPU(s) here; context parallelism splits a sequence over at least 2 "
            "(PyTorch's ring attention runs on CUDA only). Nothing was run: use a machine with 2 or more GPUs."
        )
        return 0
    tolerance = 2e-2 if opts.bf16 else 1e-4
    base = {
        k: getattr(opts, k) for k in ("steps", "seq", "global_batch", "hidden", "layers", "heads", "kv_heads")
    }
    base.update(bf16=opts.bf16, rotate=opts.rotate, threads=1)
    results = {}
    with tempfile.TemporaryDirectory() as root:
        for layout in [{}, *layouts(gpus, opts.hsdp)]:
            out = os.path.join(root, describe(layout).replace(" ", ""))
            os.makedirs(out)
            nproc = 1
            for size in layout.values():
                nproc *= size
            launch_job(HERE, {**base, "layout": layout, "out": out}, nproc, timeout=1200)
            with open(os.path.join(out, "rows.json")) as f:
                results[describe(layout)] = json.load(f)
    reference = results.pop("one process")
    print(
        f"{torch.cuda.get_device_name(0)}; {opts.steps} steps, global batch {opts.global_batch}, rows up to {opts.seq} tokens"
    )
    print(f"one process: losses {[round(r['loss'], 5) for r in reference]}")
    failed = False
    for name, rows in results.items():
        gap = compare(rows, reference)
        ok = gap <= tolerance
        failed |= not ok
        print(
            f"{name} ({opts.rotate}): max relative difference {gap:.2e} ({'ok' if ok else 'MORE THAN'} {tolerance:g})"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
