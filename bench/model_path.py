"""The model path on the CPU: the fused loss's peak memory and padding-free packing's real tokens/s,
each against transformers.Trainer measured in the same run.

    python bench/model_path.py [--steps 3] [--pack-steps 4] [--skip memory|checkpointing|packing] [--threads 1]
                               [--clock thread|wall] [--malloc fixed|default]

(a) **Fused loss** (`fused_linear_cross_entropy=True`), per model: GPT-2 (6 layers, 50,257
vocabulary) and a Llama-style config with a 128,256 vocabulary, batch 8 x 512 random tokens, fp32,
AdamW. Four variants, each in a fresh process: transformers.Trainer (the model's own loss),
trainwright with its own loss, trainwright fused, and fused with `lean_activations=True`. Peak RSS is the process's high-water mark
(`VmHWM`) reset after the model and data are built, so it is the training steps' peak; steps/s are
steady (from the end of the first step to the end of the last), on this thread's CPU time by
default (one torch thread does all the work, so other processes on a shared machine do not count;
`--clock wall --threads 0` for the wall clock on every core). Two more processes check one batch
(dropout on, the same seed for both forwards): the fused loss and every gradient, without and with
`lean_activations`, against the model's own (relative gaps). Then GPT-2 again with
`gradient_checkpointing=True` in both trainers (its activations, dropout's attention masks included,
are most of the fused run's peak otherwise).

(b) **Packing** (`padding_free=True`) on a variable-length corpus made from CPython's own standard
library (the source of its functions and classes, tokenized with a byte-level BPE trained on it
here; 20 to 1,000 tokens): trainwright flattening each batch of 8 into one row vs transformers.Trainer
with `DataCollatorForLanguageModeling(mlm=False)` (padding to the longest), same GPT-2 (6 layers,
dropout off), same batches in the same order (sequential sampling), each in a fresh process. Real
(non-pad) tokens/s over the steady steps, and the per-step losses of the two (the same loss per
token).

Prints, among other lines, exactly:

    fused loss peak memory / transformers.Trainer, <model>: <ratio>
    fused loss peak memory / transformers.Trainer, <model>, with lean_activations: <ratio>
    packed real tokens/s / transformers.Trainer padded, <corpus>: <ratio>

Goals (issue 19): fused <= 0.6x the peak RSS with loss and gradients within 1e-5 relative and steps/s
not lower; packed >= 1.8x the real tokens/s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

from _common import add_malloc_argument, apply_malloc, load_average, quiet

BATCH, SEQ = 8, 512
PACK_BATCH = 8
MODELS = {
    "gpt2": "GPT-2 (6 layers, 768 wide, vocabulary 50,257, batch 8 x 512)",
    "llama": "Llama-style (4 layers, 512 wide, untied head, vocabulary 128,256, batch 8 x 512)",
}


# ----------------------------------------------------------------------------------- models, data
def build_model(name: str, dropout: bool = True):
    import torch
    import transformers

    torch.manual_seed(0)
    if name == "gpt2":
        p = 0.1 if dropout else 0.0
        config = transformers.GPT2Config(
            n_layer=6, resid_pdrop=p, embd_pdrop=p, attn_pdrop=p, use_cache=False
        )
        return transformers.GPT2LMHeadModel(config)
    config = transformers.LlamaConfig(
        vocab_size=128256,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        use_cache=False,
    )
    return transformers.LlamaForCausalLM(config)


def random_tokens(n: int, vocab: int) -> list[dict]:
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (n, SEQ), generator=g)
    return [{"input_ids": row, "labels": row} for row in ids]


def stdlib_corpus(folder: str, n: int = 400, low: int = 20, high: int = 1000) -> dict:
    """Function and class sources from CPython's standard library, tokenized by a byte-level BPE
    trained on them; `n` samples with `low` to `high` tokens, in a fixed shuffled order."""
    import ast
    import random
    import sysconfig

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    stdlib = sysconfig.get_paths()["stdlib"]
    texts = []
    for name in sorted(os.listdir(stdlib)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(stdlib, name), encoding="utf-8", errors="replace") as f:
            source = f.read()
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                segment = ast.get_source_segment(source, node)
                if segment:
                    texts.append(segment)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<pad>"], show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    encoded = [e.ids for e in tokenizer.encode_batch(texts)]
    kept = [ids for ids in encoded if low <= len(ids) <= high]
    random.Random(0).shuffle(kept)
    kept = kept[:n]
    path = os.path.join(folder, "corpus.json")
    with open(path, "w") as f:
        json.dump({"samples": kept, "pad": tokenizer.token_to_id("<pad>"), "texts": len(texts)}, f)
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    lengths = sorted(len(s) for s in kept)
    return {"path": path, "lengths": lengths, "texts": len(texts)}


# ----------------------------------------------------------------------------------- measurements
# --clock thread (the default, with --threads 1): the step clock is this thread's CPU time, which is
# all the work (no DataLoader workers), so other processes on a shared machine do not count against
# whichever variant they overlap; --clock wall: the wall clock
_now = time.thread_time


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _clock(lib):
    class Clock(lib.TrainerCallback):
        def __init__(self):
            self.times: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(_now())

    return Clock()


def _train(lib, model, data, steps: int, batch: int, collator=None, **extra) -> dict:
    clock = _clock(lib)
    with tempfile.TemporaryDirectory() as out:
        args = lib.TrainingArguments(
            output_dir=out,
            max_steps=steps,
            per_device_train_batch_size=batch,
            learning_rate=1e-4,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            logging_steps=1,
            seed=0,
            use_cpu=True,
            **extra,
        )
        trainer = lib.Trainer(
            model=model, args=args, train_dataset=data, data_collator=collator, callbacks=[clock]
        )
        reset_peak()
        trainer.train()
        peak = peak_mb()
    t = clock.times
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    return {"peak_mb": peak, "times": t, "steady_s": t[-1] - t[0], "losses": losses}


def memory_variant(spec: dict) -> dict:
    import torch

    lib = __import__("transformers" if spec["trainer"] == "hf" else "trainwright")
    model = build_model(spec["model"])
    data = random_tokens(BATCH * (spec["steps"] + 1), model.config.vocab_size)
    extra = {
        "tw-fused": {"fused_linear_cross_entropy": True},
        "tw-lean": {"fused_linear_cross_entropy": True, "lean_activations": True},
    }.get(spec["trainer"], {})
    if spec.get("checkpointing"):
        extra["gradient_checkpointing"] = True
    result = _train(lib, model, data, spec["steps"], BATCH, **extra)
    result["steps_per_s"] = (spec["steps"] - 1) / result["steady_s"]
    result["threads"] = torch.get_num_threads()
    return result


def equality_variant(spec: dict) -> dict:
    """One batch: the model's own loss and gradients against the fused loss's (same process, same
    RNG state for both forwards)."""
    import torch

    from trainwright.modeling import lean_activations
    from trainwright.modeling.fused_loss import fused_causal_lm_loss

    model = build_model(spec["model"]).train()  # dropout on: the same seed gives both the same masks
    batch = random_tokens(2, model.config.vocab_size)
    ids = torch.stack([b["input_ids"] for b in batch])

    def grads(fused: bool):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        if fused:
            lean = lean_activations.applied(model) if spec.get("lean") else contextlib.nullcontext()
            with lean:
                loss, _ = fused_causal_lm_loss(model, {"input_ids": ids, "labels": ids})
        else:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return float(loss), {n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None}

    own_loss, own = grads(False)
    fused_loss, fused = grads(True)
    scale = max(float(g.abs().max()) for g in own.values())
    per_tensor = {
        n: float((fused[n] - g).norm() / g.norm()) for n, g in own.items() if g.abs().max() > 1e-3 * scale
    }
    flat_own = torch.cat([g.flatten() for g in own.values()])
    flat_fused = torch.cat([fused[n].flatten() for n in own])
    return {
        "loss_gap": abs(fused_loss - own_loss) / abs(own_loss),
        "grad_gap": float((flat_fused - flat_own).norm() / flat_own.norm()),
        "worst_tensor": max(per_tensor.items(), key=lambda kv: kv[1]),
        "same_params": sorted(own) == sorted(fused),
    }


def packing_variant(spec: dict) -> dict:
    import torch
    import transformers

    with open(spec["data"]) as f:
        corpus = json.load(f)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(os.path.dirname(spec["data"]), "tokenizer.json"), pad_token="<pad>"
    )
    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm=False)
    data = [{"input_ids": s} for s in corpus["samples"]]
    model = build_model("gpt2", dropout=False)
    steps = spec["steps"]
    extra = {"train_sampling_strategy": "sequential"}
    if spec["trainer"] == "hf":
        lib = transformers
    else:
        lib = __import__("trainwright")
        extra["padding_free"] = True
    result = _train(lib, model, data, steps, PACK_BATCH, collator=collator, **extra)
    real = sum(len(s) for s in corpus["samples"][PACK_BATCH : PACK_BATCH * steps])  # steps 2..N
    result["real_tokens_per_s"] = real / result["steady_s"]
    result["threads"] = torch.get_num_threads()
    return result


VARIANTS = {"memory": memory_variant, "equality": equality_variant, "packing": packing_variant}


CHILD_FLAGS: list[str] = []  # --threads and --clock, passed on to every variant


def run_child(spec: dict) -> dict:
    """Run one variant in a fresh process; its result."""
    cmd = [sys.executable, os.path.abspath(__file__), "--variant", json.dumps(spec), *CHILD_FLAGS]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"variant {spec} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


# ----------------------------------------------------------------------------------- report
def bench_checkpointing(steps: int) -> None:
    """GPT-2 with `gradient_checkpointing=True` in both trainers: the activations no longer hide
    what the loss holds."""
    label = MODELS["gpt2"] + ", gradient_checkpointing=True in both"
    runs = {
        t: run_child({"kind": "memory", "model": "gpt2", "trainer": t, "steps": steps, "checkpointing": True})
        for t in ("hf", "tw-fused")
    }
    hf, fused = runs["hf"], runs["tw-fused"]
    print(f"\n{label}: {steps} steps, {hf['threads']} threads")
    for name, r in (("transformers.Trainer", hf), ("trainwright fused", fused)):
        print(f"  {name:22s} peak RSS {r['peak_mb']:8.0f} MB   steady {r['steps_per_s']:.4f} steps/s")
    print(f"  fused steps/s / transformers.Trainer: {fused['steps_per_s'] / hf['steps_per_s']:.3f}")
    print(f"fused loss peak memory / transformers.Trainer, {label}: {fused['peak_mb'] / hf['peak_mb']:.3f}")


def bench_memory(steps: int) -> None:
    for key, label in MODELS.items():
        runs = {
            t: run_child({"kind": "memory", "model": key, "trainer": t, "steps": steps})
            for t in ("hf", "tw", "tw-fused", "tw-lean")
        }
        hf, tw, fused, lean = runs["hf"], runs["tw"], runs["tw-fused"], runs["tw-lean"]
        print(f"\n{label}: {steps} steps, {hf['threads']} threads")
        named = (
            ("transformers.Trainer", hf),
            ("trainwright", tw),
            ("trainwright fused", fused),
            ("  + lean_activations", lean),
        )
        for name, r in named:
            print(
                f"  {name:22s} peak RSS {r['peak_mb']:8.0f} MB   steady {r['steps_per_s']:.4f} steps/s   "
                f"losses {' '.join(f'{v:.5f}' for v in r['losses'])}"
            )
        for what, is_lean in (("fused", False), ("fused + lean_activations", True)):
            eq = run_child({"kind": "equality", "model": key, "lean": is_lean})
            print(
                f"  one batch, {what} vs the model's own (dropout on, same seed): loss gap {eq['loss_gap']:.1e}, "
                f"gradient gap {eq['grad_gap']:.1e} (all parameters), worst tensor {eq['worst_tensor'][0]} "
                f"{eq['worst_tensor'][1]:.1e}"
            )
        for what, r in (("fused", fused), ("fused + lean_activations", lean)):
            print(f"  {what} steps/s / transformers.Trainer: {r['steps_per_s'] / hf['steps_per_s']:.3f}")
        print(f"  fused peak memory / trainwright unfused: {fused['peak_mb'] / tw['peak_mb']:.3f}")
        print(
            f"fused loss peak memory / transformers.Trainer, {label}: {fused['peak_mb'] / hf['peak_mb']:.3f}"
        )
        print(
            f"fused loss peak memory / transformers.Trainer, {label}, with lean_activations: "
            f"{lean['peak_mb'] / hf['peak_mb']:.3f}"
        )


def bench_packing(steps: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        corpus = stdlib_corpus(folder)
        with open(corpus["path"]) as f:
            corpus["samples"] = json.load(f)["samples"]
        lengths = corpus["lengths"]
        label = (
            f"CPython {sys.version_info.major}.{sys.version_info.minor} stdlib functions and classes "
            f"({len(lengths)} samples, {lengths[0]}-{lengths[-1]} tokens, median {lengths[len(lengths) // 2]}, "
            f"batch {PACK_BATCH})"
        )
        runs = {
            t: run_child({"kind": "packing", "trainer": t, "steps": steps, "data": corpus["path"]})
            for t in ("hf", "tw")
        }
    hf, tw = runs["hf"], runs["tw"]
    print(
        f"\npacking: GPT-2 (6 layers, dropout off), {steps} steps, {hf['threads']} threads, {corpus['texts']} texts"
    )
    # transformers.Trainer divides each step's summed loss by its unshifted label count (every real
    # token), trainwright by the targets of a causal LM (every token but each sample's first): the
    # same summed loss per token once that is undone
    samples = corpus["samples"]
    ratios = [
        sum(len(s) - 1 for s in samples[k * PACK_BATCH : (k + 1) * PACK_BATCH])
        / sum(len(s) for s in samples[k * PACK_BATCH : (k + 1) * PACK_BATCH])
        for k in range(len(tw["losses"]))
    ]
    gaps = [abs(a * r - b) / abs(b) for a, b, r in zip(tw["losses"], hf["losses"], ratios, strict=True)]
    for name, r in (("transformers.Trainer padded", hf), ("trainwright padding_free", tw)):
        print(
            f"  {name:30s} {r['real_tokens_per_s']:8.1f} real tokens/s   peak RSS {r['peak_mb']:6.0f} MB   "
            f"losses {' '.join(f'{v:.5f}' for v in r['losses'])}"
        )
    print(
        "  per-step summed loss per token, packed vs padded (transformers.Trainer's unshifted token count "
        f"undone): largest relative gap {max(gaps):.1e}"
    )
    print(
        f"packed real tokens/s / transformers.Trainer padded, {label}: {tw['real_tokens_per_s'] / hf['real_tokens_per_s']:.3f}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3, help="training steps per fused-loss variant (>= 2)")
    p.add_argument("--pack-steps", type=int, default=4, help="training steps per packing variant (>= 2)")
    p.add_argument("--skip", choices=("memory", "checkpointing", "packing"), action="append", default=[])
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads in each variant (0: torch's default)"
    )
    p.add_argument("--clock", choices=("thread", "wall"), default="thread", help="step clock (see above)")
    p.add_argument("--variant", help=argparse.SUPPRESS)
    add_malloc_argument(p)
    ns = p.parse_args()
    quiet()
    if ns.variant:
        import torch

        global _now
        _now = time.thread_time if ns.clock == "thread" else time.perf_counter
        if ns.threads:
            torch.set_num_threads(ns.threads)
        spec = json.loads(ns.variant)
        print("RESULT " + json.dumps(VARIANTS[spec["kind"]](spec)), flush=True)
        return 0
    malloc = apply_malloc(ns.malloc)
    if min(ns.steps, ns.pack_steps) < 2:
        p.error("--steps and --pack-steps must be >= 2 (steady rates start after the first step)")
    CHILD_FLAGS.extend(["--threads", str(ns.threads), "--clock", ns.clock])
    print(f"model path on the CPU: {malloc}, {ns.clock} clock, {load_average()}")
    if "memory" not in ns.skip:
        bench_memory(ns.steps)
    if "checkpointing" not in ns.skip:
        bench_checkpointing(ns.steps)
    if "packing" not in ns.skip:
        bench_packing(ns.pack_steps)
    print(f"\n{load_average()} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
