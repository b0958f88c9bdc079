"""N-D parallel layouts on a multi-GPU machine: step time, tokens/s per GPU, MFU, peak memory and
the share of the step with communication in flight, for each layout over the node's GPUs (nccl).

    python bench/parallelism_gpu.py [--nproc N] [--layouts dp_shard=8 tp=2,dp_shard=4 tp=8]
                                    [--hidden 2048] [--layers 8] [--seq 2048] [--global-batch 16] [--bf16]

Default layouts for N GPUs: dp_shard=N, tp=2 x dp_shard=N/2, tp=N (and dp_replicate=2 x dp_shard=N/2
with --hsdp); on one GPU, the single-GPU path (no mesh: parallelism_config's sizes all 1). The same
Llama (from a config) and global batch in every layout; MFU is 6N FLOPs per token (attention not
counted) against the dense peak of the GPU (trainwright.observe.flops) in the compute dtype.
`--cpu` runs the same layouts with gloo on the CPU (tiny sizes; a check of the script, not a
benchmark). Worker and measurements: bench/parallelism.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import parallelism as bench  # noqa: E402 (the sibling script: the worker and the launcher)


def parse_layout(text: str) -> dict[str, int]:
    """ "tp=2,dp_shard=4" -> {"tp_size": 2, "dp_shard_size": 4}; "one" -> {} (no mesh)."""
    if text in ("one", "1"):
        return {}
    layout = {}
    for part in text.split(","):
        name, _, size = part.partition("=")
        if name not in ("dp_replicate", "dp_shard", "tp", "cp") or not size.isdigit():
            raise SystemExit(
                f"--layouts: {part!r} is not dim=size with dim in dp_replicate, dp_shard, tp, cp"
            )
        layout[f"{name}_size"] = int(size)
    return layout


def default_layouts(n: int, hsdp: bool) -> list[dict[str, int]]:
    if n == 1:
        return [{}]
    layouts = [{"dp_shard_size": n}]
    if n % 2 == 0 and n > 2:
        layouts.append({"tp_size": 2, "dp_shard_size": n // 2})
    layouts.append({"tp_size": n})
    if hsdp and n % 4 == 0:
        layouts.append({"dp_replicate_size": 2, "dp_shard_size": n // 2})
    return layouts


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    bench.add_model_arguments(parser, hidden=2048, layers=8, seq=2048, batch=16)
    parser.add_argument("--nproc", type=int, default=None, help="processes (default: every visible GPU)")
    parser.add_argument("--layouts", nargs="*", default=None, help='e.g. "tp=2,dp_shard=4" "dp_shard=8"')
    parser.add_argument("--hsdp", action="store_true", help="also dp_replicate=2 x dp_shard=N/2")
    parser.add_argument("--bf16", action="store_true", help="mixed precision in bfloat16")
    parser.add_argument("--cpu", action="store_true", help="check the script on the CPU with gloo")
    opts = parser.parse_args()
    if opts.worker:
        bench.worker(json.loads(opts.worker))
        return
    import torch

    device = "cpu" if opts.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU machine, or pass --cpu to check the script")
    n = opts.nproc or (torch.cuda.device_count() if device == "cuda" else 2)
    layouts = [parse_layout(t) for t in opts.layouts] if opts.layouts else default_layouts(n, opts.hsdp)
    peak = None
    if device == "cuda":
        from trainwright.observe.flops import get_peak_flops

        name = torch.cuda.get_device_name(0)
        peak = get_peak_flops(name, torch.bfloat16 if opts.bf16 else torch.float32)
    results = []
    with tempfile.TemporaryDirectory() as out:
        for i, layout in enumerate(layouts):
            cfg = {**bench.base_config(opts, out, device), "name": f"layout{i}", "layout": layout}
            processes = 1 if not layout else n
            results.append(bench.run_layout(cfg, processes))
    where = f"{n} x {torch.cuda.get_device_name(0)}" if device == "cuda" else f"{n} CPU processes (gloo)"
    print(
        f"trainwright N-D parallel benchmark on {where}: Llama hidden={opts.hidden} layers={opts.layers} "
        f"({results[0]['parameters'] / 1e6:.1f}M parameters), global batch {opts.global_batch} x {opts.seq} "
        f"tokens, {'bf16' if opts.bf16 else 'fp32'}, median of {opts.steps} steps after {opts.warmup}"
    )
    base = results[0]
    for r in results:
        gpus = r["world"]
        line = (
            f"  {bench.describe(r['layout']):<28} step {r['step_s'] * 1000:8.1f} ms  "
            f"{r['tokens_per_s'] / gpus:9.0f} tokens/s/device  comm in flight {r['comm_share']:4.0%}  "
            f"step vs {bench.describe(base['layout'])}: {r['step_s'] / base['step_s']:.2f}x"
        )
        if peak:
            line += f"  MFU {r['flops_per_step'] / r['step_s'] / gpus / peak:.1%}"
        if "peak_memory_gb" in r:
            line += f"  peak memory {r['peak_memory_gb']:.1f} GiB/device"
        print(line)
    if device == "cuda" and peak is None:
        print("  (no dense peak known for this GPU: MFU not shown)")


if __name__ == "__main__":
    main()
