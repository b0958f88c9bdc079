"""The model path on one GPU: tokens/s, MFU and the largest batch of trainwright's recipe against
transformers.Trainer's best (torch.compile), bf16, on GPT-2 124M and a Llama-style ~0.5B model with a
128,256 vocabulary, sequences of 1,024 random tokens; both trainers on the same machine in one call.

    python bench/gpu_model_path.py                  # both models (budget: about 8 minutes on an H100)
    python bench/gpu_model_path.py --smoke          # tiny models and sizes, on the CPU if no GPU (a test)

Both trainers run with `bf16=True`, `optim="adamw_torch_fused"`, `torch_compile=True`; trainwright's
recipe adds `fused_linear_cross_entropy=True` (the data has no padding, so `padding_free` would
change nothing here). For each (model, trainer), in a fresh process: the largest per-device batch
that fits is searched eagerly (2 training steps per try: doubling from 4, then one bisection; an
out-of-memory error is a miss), then the compiled model trains at that batch (a smaller one if the
compiled step does not fit): `--warmup` steps, then `--steps` timed steps (CUDA synchronised at each
step end, the same callback in both). MFU counts 6 x (matmul parameters, the LM head included) +
12 x layers x width x sequence FLOPs per token (the same formula for both trainers) against the
device's dense bf16 peak (trainwright.observe.flops).

Prints, per model:

    GPU recipe tokens/s / transformers.Trainer best (compile), <model>: <ratio>
    largest batch, trainwright recipe / transformers.Trainer, <model>: <ratio>

Goals (issue 19): >= 1.3x the tokens/s, and >= 2x the largest batch on the 128k-vocabulary model.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

from _common import load_average, quiet

MODELS = {
    "gpt2": "GPT-2 124M (12 layers, 768 wide, vocabulary 50,257, tied head)",
    "llama": "Llama-style 0.51B (16 layers, 1024 wide, GQA 16/8, vocabulary 128,256, untied head)",
}


def build_model(name: str, smoke: bool):
    import torch
    import transformers

    torch.manual_seed(0)
    if name == "gpt2":
        config = transformers.GPT2Config(use_cache=False)
        if smoke:
            config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=128)
            config.use_cache = False
        return transformers.GPT2LMHeadModel(config)
    size = (
        {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 2000,
        }
        if smoke
        else {
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_hidden_layers": 16,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "vocab_size": 128256,
        }
    )
    config = transformers.LlamaConfig(
        **size, max_position_embeddings=2048, tie_word_embeddings=False, use_cache=False
    )
    return transformers.LlamaForCausalLM(config)


def matmul_parameters(model) -> int:
    """Parameters of the 2-D weights that multiply activations: every matrix but the embedding
    lookups (an input embedding tied to the head counts once, as the head)."""
    import torch

    head = model.get_output_embeddings().weight
    lookups = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)} - {id(head)}
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if p.dim() == 2 and id(p) not in lookups and id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


class RandomRows:
    """Rows of `seq` random token ids, made per index (nothing held)."""

    def __init__(self, n: int, seq: int, vocab: int):
        self.n, self.seq, self.vocab = n, seq, vocab

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        import torch

        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, self.vocab, (self.seq,), generator=g)
        return {"input_ids": ids, "labels": ids}


def _is_oom(err: BaseException) -> bool:
    import torch

    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()


def train_once(spec: dict, model, batch: int, steps: int, compile_: bool) -> list[float]:
    """Train `steps` steps at `batch`; the step-end times (after synchronising the device)."""
    import torch

    lib = __import__("transformers" if spec["trainer"] == "hf" else "trainwright")
    cuda = torch.cuda.is_available()

    class Clock(lib.TrainerCallback):
        def __init__(self):
            self.times: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            self.times.append(time.perf_counter())

    clock = Clock()
    extra = {"fused_linear_cross_entropy": True} if spec["trainer"] == "tw" else {}
    if compile_:
        extra["torch_compile"] = True
        if spec.get("backend"):
            extra["torch_compile_backend"] = spec["backend"]
    data = RandomRows(batch * steps, spec["seq"], model.config.vocab_size)
    with tempfile.TemporaryDirectory() as out:
        args = lib.TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=batch,
            max_steps=steps,
            learning_rate=1e-4,
            bf16=True,
            optim="adamw_torch_fused",
            logging_steps=max(steps, 1),
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            dataloader_num_workers=0,
            seed=0,
            use_cpu=not cuda,
            **extra,
        )
        trainer = lib.Trainer(model=model, args=args, train_dataset=data, callbacks=[clock])
        try:
            trainer.train()
        finally:
            del trainer
            model.zero_grad(set_to_none=True)
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
    return clock.times


def fits(spec: dict, model, batch: int) -> bool:
    try:
        train_once(spec, model, batch, 2, compile_=False)
        return True
    except (RuntimeError, MemoryError) as err:
        if not _is_oom(err):
            raise
        return False


def largest_batch(spec: dict, model) -> int:
    """Doubling from 4 up to `max_batch`, then one bisection between the last fit and the first miss."""
    good, bad, batch = 0, None, 4
    while batch <= spec["max_batch"]:
        if not fits(spec, model, batch):
            bad = batch
            break
        good, batch = batch, batch * 2
    if good == 0:
        raise RuntimeError(f"{spec['model']}: not even a batch of 4 fits")
    if bad is not None and bad - good > 1:
        middle = (good + bad) // 2
        if fits(spec, model, middle):
            good = middle
    return good


def child(spec: dict) -> dict:
    import torch

    from trainwright.observe.flops import get_peak_flops

    cuda = torch.cuda.is_available()
    model = build_model(spec["model"], spec["smoke"])
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    started = time.perf_counter()
    batch = largest_batch(spec, model)
    searched = time.perf_counter() - started
    model.load_state_dict(initial)
    steps = spec["warmup"] + spec["steps"]
    run = batch
    while True:
        try:
            times = train_once(spec, model, run, steps, compile_=True)
            break
        except (RuntimeError, MemoryError) as err:
            if not _is_oom(err) or run <= 1:
                raise
            run = max(1, int(run * 0.85))
    timed = times[spec["warmup"] - 1 :]
    tokens_per_s = run * spec["seq"] * (len(timed) - 1) / (timed[-1] - timed[0])
    config = model.config
    layers = getattr(config, "num_hidden_layers", None) or config.n_layer
    width = getattr(config, "hidden_size", None) or config.n_embd
    per_token = 6 * matmul_parameters(model) + 12 * layers * width * spec["seq"]
    peak = get_peak_flops(torch.cuda.get_device_name(), torch.bfloat16) if cuda else None
    return {
        "largest_batch": batch,
        "timed_batch": run,
        "tokens_per_s": tokens_per_s,
        "mfu": tokens_per_s * per_token / peak if peak else None,
        "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "search_s": searched,
        "total_s": time.perf_counter() - started,
    }


def run_child(spec: dict) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"{spec} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny models, sequences of 64, batches up to 8")
    p.add_argument("--models", default="gpt2,llama", help="comma-separated: gpt2, llama")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="steps before the timed ones (compilation)")
    p.add_argument("--max-batch", type=int, default=512)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--backend", default=None, help="torch.compile backend (default: inductor)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    ns = p.parse_args()
    quiet()
    if ns.child:
        print("RESULT " + json.dumps(child(json.loads(ns.child))), flush=True)
        return 0
    import torch

    if ns.smoke:
        ns.seq, ns.max_batch, ns.steps, ns.warmup = (
            64,
            min(ns.max_batch, 8),
            min(ns.steps, 3),
            min(ns.warmup, 2),
        )
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(f"torch {torch.__version__}, {device}, {load_average()}, sequences of {ns.seq}")
    started = time.perf_counter()
    for name in ns.models.split(","):
        label = MODELS[name] + (" [smoke: tiny]" if ns.smoke else "")
        results = {}
        for trainer in ("hf", "tw"):
            spec = {
                "model": name,
                "trainer": trainer,
                "smoke": ns.smoke,
                "seq": ns.seq,
                "steps": ns.steps,
                "warmup": ns.warmup,
                "max_batch": ns.max_batch,
                "backend": ns.backend,
            }
            results[trainer] = run_child(spec)
        hf, tw = results["hf"], results["tw"]
        print(f"\n{label}")
        for title, r in (("transformers.Trainer (compile)", hf), ("trainwright recipe", tw)):
            mfu = f"{r['mfu']:.3f}" if r["mfu"] is not None else "n/a"
            memory = f"{r['peak_memory_gb']:.1f} GB" if r["peak_memory_gb"] is not None else "n/a"
            print(
                f"  {title:32s} largest batch {r['largest_batch']:4d} (timed at {r['timed_batch']}), "
                f"{r['tokens_per_s']:12,.0f} tokens/s, MFU {mfu}, peak memory {memory}, "
                f"search {r['search_s']:.0f} s, total {r['total_s']:.0f} s"
            )
        print(
            f"GPU recipe tokens/s / transformers.Trainer best (compile), {label}: {tw['tokens_per_s'] / hf['tokens_per_s']:.3f}"
        )
        print(
            f"largest batch, trainwright recipe / transformers.Trainer, {label}: {tw['largest_batch'] / hf['largest_batch']:.3f}"
        )
    print(f"\nwall time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
