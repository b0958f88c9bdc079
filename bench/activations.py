"""What a training forward keeps for its backward, with and without `lean_activations`, and the
time of the attention under dropout on the CPU.

    python bench/activations.py [--layers 6] [--batch 8] [--seq 512] [--rounds 3] [--threads 1]

(a) **Saved tensors.** GPT-2 (`--layers`, 768 wide, vocabulary 50,257, dropout 0.1) in training mode,
one forward with its own loss on random tokens, every tensor autograd saves counted once per storage
(`torch.autograd.graph.saved_tensors_hooks`) and bucketed by shape: the ``queries x keys`` attention
tensors, the 3,072-wide MLP tensors, the logits-sized ones, the rest (the weights apart). Once as the model is, once
inside `lean_activations.applied` (what `lean_activations=True` does for a `train()` call).

(b) **The attention alone**, forward + backward of a batch's attention (`--batch` x 12 heads x
`--seq` x 64, causal, dropout 0.1): SDPA (its math path on the CPU) against `DropoutAttention`,
alternating, `--rounds` rounds of 3 calls each, on this thread's CPU time.

Prints, among other lines:

    saved for backward, lean_activations / as is: <ratio>
    dropout attention time, lean / SDPA: <ratio>
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

from _common import add_threads_argument, apply_threads, load_average, quiet


def saved_bytes(model, ids) -> collections.Counter:
    import torch

    seen: dict[int, tuple[str, int]] = {}
    vocab, seq = model.config.vocab_size, ids.shape[1]
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t):
        shape = tuple(t.shape)
        if t.untyped_storage().data_ptr() in weights:
            kind = "weights (not activations)"
        elif len(shape) >= 3 and shape[-1] == shape[-2] == seq:
            kind = f"queries x keys ({str(t.dtype).removeprefix('torch.')})"
        elif shape and shape[-1] == vocab:
            kind = "logits-sized"
        elif shape and shape[-1] == 4 * model.config.n_embd:
            kind = "MLP 4x wide"
        else:
            kind = "other"
        seen[t.untyped_storage().data_ptr()] = (kind, t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids)
    counts: collections.Counter = collections.Counter()
    for kind, nbytes in seen.values():
        counts[kind] += nbytes
    return counts


def bench_saved(layers: int, batch: int, seq: int) -> None:
    import torch
    import transformers

    from trainwright.modeling import lean_activations

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=layers, n_positions=max(seq, 1024), use_cache=False)
    model = transformers.GPT2LMHeadModel(config).train()
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    as_is = saved_bytes(model, ids)
    with lean_activations.applied(model):
        lean = saved_bytes(model, ids)
    print(f"\nsaved for backward, GPT-2 {layers} layers, batch {batch} x {seq}, dropout 0.1 (GB):")
    for kind in sorted(set(as_is) | set(lean), key=lambda k: -as_is.get(k, 0)):
        print(f"  {kind:28s} as is {as_is.get(kind, 0) / 2**30:6.3f}   lean {lean.get(kind, 0) / 2**30:6.3f}")
    total, total_lean = (sum(v for k, v in c.items() if not k.startswith("weights")) for c in (as_is, lean))
    print(f"  {'all activations':28s} as is {total / 2**30:6.3f}   lean {total_lean / 2**30:6.3f}")
    print(f"saved for backward, lean_activations / as is: {total_lean / total:.3f}")


def bench_attention(batch: int, seq: int, rounds: int) -> None:
    import torch
    import torch.nn.functional as F

    from trainwright.modeling.lean_attention import DropoutAttention

    heads, dim = 12, 64
    q, k, v = (torch.randn(batch, heads, seq, dim, requires_grad=True) for _ in range(3))
    variants = {
        "SDPA": lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True),
        "lean": lambda: DropoutAttention.apply(q, k, v, None, True, dim**-0.5, 0.1),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, attend in variants.items():
            start = time.thread_time()
            for _ in range(3):
                attend().sum().backward()
            times[name].append((time.thread_time() - start) / 3)
    print(f"\ndropout attention, batch {batch} x {heads} heads x {seq} x {dim}, causal, forward + backward:")
    for name, values in times.items():
        print(f"  {name:5s} " + " ".join(f"{t:.3f}" for t in values) + " s")
    print(f"dropout attention time, lean / SDPA: {min(times['lean']) / min(times['SDPA']):.3f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--rounds", type=int, default=3)
    add_threads_argument(p)
    ns = p.parse_args()
    quiet()
    apply_threads(ns.threads)
    print(f"activations on the CPU: {load_average()}")
    bench_saved(ns.layers, ns.batch, ns.seq)
    bench_attention(ns.batch, ns.seq, ns.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
