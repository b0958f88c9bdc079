"""Training jobs for the distributed tests, run by torchrun (or in-process as one-process references):

    python -m torch.distributed.run --nproc_per_node=2 dist_job.py '{"out": DIR, "tasks": [...]}'

Each task trains a fresh small model with the Trainer and writes, under DIR/<name>/: result.json
(rank 0: logged loss rows, train_loss, global_step, predictions and metrics), final/ (save_model),
checkpoints, and probe_<rank>.json (what every rank saw: its log level, should_log / should_save,
main_process_first order, parameter dtype inside forward). Task keys:

    name, model ("mlp" | "mlp_dropout" | "lm" | "gpt2" | "llama" | "llama_tied"), n (training samples), args (TrainingArguments
    overrides), resume (null | true | path), predict (eval samples: predict() after training),
    eval (eval samples: an eval_dataset), fail / hang ({"rank", "step"}: raise / block forever at that step's start), announce (print
    "STEP n"), per_rank_dirs (each rank gets its own output_dir: DIR/<name>/view<rank>),
    save_model (default true), init_seed_per_rank (rank r initialises its model with seed r), slow_items
    (seconds each training item of the "mlp" models takes to load).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared kit
from kit.models import DropoutMLP  # noqa: E402

from trainwright.app.tinygpt import TinyGPT, TinyGPTConfig
from trainwright.args.training_args import TrainingArguments
from trainwright.core.events import TrainerCallback
from trainwright.data import pad_sequence_collator
from trainwright.loop.trainer import Trainer

VOCAB = 32
LMS = ("lm", "gpt2", "llama", "llama_tied")


class VectorData(Dataset):
    def __init__(self, n: int, d: int = 8, seed: int = 0, item_sleep: float = 0.0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, d, generator=g)
        self.y = self.x.sum(-1) + 0.1 * torch.randn(n, generator=g)
        self.item_sleep = item_sleep

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        if self.item_sleep:
            time.sleep(self.item_sleep)
        return {"x": self.x[i], "labels": self.y[i]}


class TokenData(Dataset):
    """Sequences of 3 to 14 tokens: ranks and micro-batches hold different numbers of label tokens."""

    def __init__(self, n: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(3, 15, (n,), generator=g)
        self.rows = [torch.randint(1, VOCAB, (int(k),), generator=g) for k in lengths]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def build_model(kind: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    # transformers models from configs (nothing is downloaded), imported only by the tasks that train one
    if kind == "gpt2":
        from kit.hf import gpt2

        return gpt2(seed=None, n_positions=32)
    if kind in ("llama", "llama_tied"):  # tiny Llama: a tensor-parallel plan of its own
        from kit.ecosystem import llama_lm

        tied = kind == "llama_tied"
        return llama_lm(seed=None, vocab_size=VOCAB, max_position_embeddings=16, tie_word_embeddings=tied)
    if kind == "lm":
        return TinyGPT(
            TinyGPTConfig(vocab_size=VOCAB, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0)
        )
    return DropoutMLP(p=0.2 if kind == "mlp_dropout" else 0.0)


def build_data(kind: str, n: int, seed: int = 0, item_sleep: float = 0.0) -> Dataset:
    return TokenData(n, seed) if kind in LMS else VectorData(n, seed=seed, item_sleep=item_sleep)


def mse_metric(p) -> dict:
    return {"mse": float(np.mean((np.asarray(p.predictions) - np.asarray(p.label_ids)) ** 2))}


def token_accuracy(p) -> dict:
    logits, labels = np.asarray(p.predictions), np.asarray(p.label_ids)
    mask = labels[:, 1:] != -100
    hits = logits[:, :-1].argmax(-1) == labels[:, 1:]
    return {"token_accuracy": float(hits[mask].mean())}


class Probe(TrainerCallback):
    """Failure injection and per-step announcements."""

    def __init__(self, task: dict, rank: int):
        self.task, self.rank = task, rank
        self.flos_at_step_end: list[float] = []

    def on_step_end(self, args, state, control, **kw):
        self.flos_at_step_end.append(state.total_flos)

    def on_step_begin(self, args, state, control, **kw):
        step = state.global_step + 1
        if self.task.get("announce") and self.rank == 0:
            print(f"STEP {step}", flush=True)
        fail = self.task.get("fail")
        if fail and fail["rank"] == self.rank and fail["step"] == step:
            raise RuntimeError(f"injected failure on rank {self.rank} at step {step}")
        hang = self.task.get("hang")
        if hang and hang["rank"] == self.rank and hang["step"] == step:
            print(f"rank {self.rank} hangs at step {step}", flush=True)
            threading.Event().wait()  # never set: this rank stops answering collectives


def make_args(task: dict, output_dir: str) -> TrainingArguments:
    kw = {
        "output_dir": output_dir,
        "per_device_train_batch_size": 4,
        "max_steps": 4,
        "learning_rate": 0.01,
        "lr_scheduler_type": "constant",
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "use_cpu": True,
        "seed": 3,
        "per_device_eval_batch_size": 4,
        "ddp_timeout": 60,
    }
    kw.update(task.get("args", {}))
    return TrainingArguments(**kw)


def run_task(task: dict, out_root: str) -> dict:
    """Train (and maybe predict) one task; returns rank 0's result (also written to result.json)."""
    rank = int(os.environ.get("RANK", "0"))
    folder = os.path.join(out_root, task["name"])
    output_dir = os.path.join(folder, f"view{rank}") if task.get("per_rank_dirs") else folder
    args = make_args(task, output_dir)
    kind = task.get("model", "mlp")
    probe: dict = {"rank": rank}
    trainer = Trainer(
        model=build_model(kind, seed=rank if task.get("init_seed_per_rank") else 0),
        args=args,
        train_dataset=build_data(kind, task.get("n", 32), item_sleep=task.get("slow_items", 0.0)),
        eval_dataset=build_data(kind, task["eval"], seed=1) if task.get("eval") else None,
        data_collator=pad_sequence_collator() if kind in LMS else None,
        compute_metrics=token_accuracy if kind in LMS else mse_metric,
        callbacks=[probe_cb := Probe(task, rank)],
    )
    runtime = trainer.runtime
    probe.update(
        world_size=runtime.world_size,
        level=logging.getLogger("trainwright").getEffectiveLevel(),
        should_log=args.should_log,
        should_save=args.should_save,
    )
    if task.get("main_process_first"):
        marker = os.path.join(folder, "first.txt")
        os.makedirs(folder, exist_ok=True)
        with args.main_process_first(local=False, desc="marker"):
            if runtime.is_main_process:
                time.sleep(0.5)  # a window in which a replica that did not wait would find no marker
                with open(marker, "w") as f:
                    f.write("rank 0 was here")
            else:
                probe["saw_marker"] = os.path.exists(marker)
    dtypes: list[str] = []
    if task.get("record_dtype"):
        layer = trainer.model.blocks[0].mlp[0] if kind == "lm" else trainer.model.net[0]
        layer.register_forward_pre_hook(lambda m, a: dtypes.append(str(m.weight.dtype)))
    out = trainer.train(resume_from_checkpoint=task.get("resume"))
    wrapped = trainer.model_wrapped
    if isinstance(wrapped, nn.parallel.DistributedDataParallel):
        probe["ddp"] = {
            "bucket_bytes_cap": wrapped.bucket_bytes_cap,
            "broadcast_buffers": wrapped.broadcast_buffers,
            "static_graph": wrapped.static_graph,
            "find_unused_parameters": wrapped.find_unused_parameters,
        }
    probe["param_dtype_in_forward"] = sorted(set(dtypes))
    probe["sharded"] = type(trainer.model).__name__.startswith("FSDP")
    probe["total_flos_at_step_end"] = probe_cb.flos_at_step_end
    probe["samples_run"] = trainer._run.samples_and_tokens_run()[0]  # this call's, over the processes
    if kind.startswith("llama"):  # this process's copy of a weight no tensor-parallel rule splits
        norm = trainer.model.model.norm.weight
        probe["norm_weight"] = (norm.to_local() if hasattr(norm, "to_local") else norm).detach().tolist()
    if task.get("save_model", True):
        trainer.save_model(os.path.join(output_dir, "final"))
    trainer.save_metrics("train", out.metrics)
    trainer.save_state()
    result: dict = {
        "rows": [r for r in trainer.state.log_history if "loss" in r],
        "train_loss": out.training_loss,
        "global_step": out.global_step,
        "log_history": trainer.state.log_history,
        "best_model_checkpoint": trainer.state.best_model_checkpoint,
    }
    if task.get("predict"):
        pred = trainer.predict(build_data(kind, task["predict"], seed=1))
        result["metrics"] = {
            k: v for k, v in pred.metrics.items() if "runtime" not in k and "per_second" not in k
        }
        if runtime.is_main_process:
            np.savez(
                os.path.join(folder, "predictions.npz"), predictions=pred.predictions, labels=pred.label_ids
            )
    with open(os.path.join(folder, f"probe_{rank}.json"), "w") as f:
        json.dump(probe, f)
    if runtime.is_main_process:
        with open(os.path.join(folder, "result.json"), "w") as f:
            json.dump(result, f)
    return result


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(format=f"R{rank} %(name)s %(levelname)s %(message)s", stream=sys.stdout)
    logging.getLogger("trainwright").setLevel(cfg.get("level", logging.WARNING))
    for task in cfg["tasks"]:
        run_task(task, cfg["out"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
