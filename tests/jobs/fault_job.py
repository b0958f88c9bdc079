"""A training job for tests/loop/test_faults_runtime.py, run in its own process:

    python fault_job.py '{"output_dir": ..., "max_steps": 50, "step_sleep": 0.1, ...}'

A small MLP on a fixed dataset. It prints, flushed, one line per event the parent waits for:
`STARTED <pid>` (train() began: the output_dir lock is held), `STEP <n>` (a step begins),
`EVAL_BATCH <n>` (an evaluation batch was predicted), `EVALUATED <step>`, `SAVED <step>` (on_save), `IN_SAVE <step>` (inside a checkpoint's write),
`DONE <global_step>` (train() returned). Options:

- `step_sleep`: seconds each training step sleeps (a slow job to signal or to compete with);
- `eval_items`, `eval_item_sleep`: an evaluation set whose every item sleeps (a slow evaluation),
  evaluated every `eval_steps`;
- `save_sleep`: seconds a checkpoint's write sleeps after the weights are written (a slow save);
- `workers`: dataloader workers (`mp_context`: their start method; `persistent`: persistent workers);
  `train_item_sleep`: seconds each training item takes to load (the main process then mostly waits for
  a worker); `augment`: each item draws noise from the worker's global torch RNG;
- `eval_augment`: each evaluation item draws noise from the global torch RNG too; `save_strategy`;
- `dropout`, `async_save`, `resume` (`resume_from_checkpoint`), `final` (a folder: `save_model` there
  after training);
- `use_cpu` (default true; false: the accelerator, pinned memory with workers);
- `no_folder_flock`: flock on a directory fails with EBADF, as on NFS (the output-dir lock then takes
  its file beside the folder);
- `lora`: adapter names (the first one trained): a tiny Llama with LoRA adapters of these names on
  causal-LM rows instead (`tok`: the folder of the test kit's tokenizer).
- `hf_args`: transformers' own `TrainingArguments` (its fields only: no `preemption_signals`,
  `async_save`), given these keywords on top (`{"enable_jit_checkpoint": false}`).
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import Dataset

from trainwright import Trainer, TrainerCallback, TrainingArguments


class Data(Dataset):
    def __init__(self, n: int, item_sleep: float = 0.0, augment: bool = False) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x.sum(-1)
        self.item_sleep = item_sleep
        self.augment = augment

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        if self.item_sleep:
            time.sleep(self.item_sleep)
        x = self.x[i] + 0.1 * torch.randn(8) if self.augment else self.x[i]
        return {"x": x, "labels": self.y[i]}


class Net(nn.Module):
    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 1))

    def forward(self, x, labels=None):
        out = self.net(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


class Report(TrainerCallback):
    def __init__(self, step_sleep: float) -> None:
        self.step_sleep = step_sleep
        self.eval_batches = 0

    def on_train_begin(self, args, state, control, **kw):
        print(f"STARTED {os.getpid()}", flush=True)

    def on_step_begin(self, args, state, control, **kw):
        print(f"STEP {state.global_step + 1}", flush=True)
        if self.step_sleep:
            time.sleep(self.step_sleep)

    def on_save(self, args, state, control, **kw):
        print(f"SAVED {state.global_step}", flush=True)

    def on_evaluate(self, args, state, control, metrics=None, **kw):
        print(f"EVALUATED {state.global_step}", flush=True)

    def on_prediction_step(self, args, state, control, **kw):
        self.eval_batches += 1
        print(f"EVAL_BATCH {self.eval_batches}", flush=True)


class SlowSaveTrainer(Trainer):
    save_sleep = 0.0

    def _save(self, output_dir=None, state_dict=None):
        super()._save(output_dir, state_dict)
        if self.save_sleep and os.path.basename(output_dir).startswith(".checkpoint-"):
            print(f"IN_SAVE {self.state.global_step}", flush=True)
            deadline = time.monotonic() + self.save_sleep
            while time.monotonic() < deadline:  # short sleeps: a signal's handler runs promptly
                time.sleep(0.05)


def _no_folder_flock() -> None:
    import fcntl
    import stat

    from trainwright.core import output_lock

    real = fcntl.flock

    def flock(fd, op):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        return real(fd, op)

    output_lock.fcntl.flock = flock  # type: ignore[union-attr]


def _peft_model_and_data(cfg: dict) -> tuple[nn.Module, list]:
    """A tiny Llama with LoRA adapters named `cfg["lora"]` (the first one active) and 64 LM rows."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the kit
    import peft
    from kit import ecosystem as eco

    tok = eco.tokenizer(cfg["tok"])
    first, *others = cfg["lora"]
    lora = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    model = peft.get_peft_model(eco.llama(tok), peft.LoraConfig(**lora), adapter_name=first)
    for name in others:
        model.add_adapter(name, peft.LoraConfig(**lora))
    return model, eco.lm_rows(tok, n=64)


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    if cfg.get("no_folder_flock"):
        _no_folder_flock()
    eval_items = cfg.get("eval_items", 0)
    fields = dict(
        output_dir=cfg["output_dir"],
        per_device_train_batch_size=4,
        per_device_eval_batch_size=1,
        max_steps=cfg.get("max_steps", 50),
        save_strategy=cfg.get("save_strategy", "steps"),
        save_steps=cfg.get("save_steps", 1000),
        logging_steps=1,
        eval_strategy="steps" if eval_items else "no",
        eval_steps=cfg.get("eval_steps", 2),
        dataloader_num_workers=cfg.get("workers", 0),
        dataloader_multiprocessing_context=cfg.get("mp_context"),
        dataloader_persistent_workers=cfg.get("persistent", False),
        report_to="none",
        disable_tqdm=True,
        use_cpu=cfg.get("use_cpu", True),
    )
    if "hf_args" in cfg:
        import transformers

        args = transformers.TrainingArguments(**fields, **cfg["hf_args"])
    else:
        args = TrainingArguments(
            **fields,
            async_save=cfg.get("async_save", False),
            preemption_signals=["SIGTERM", "SIGUSR1", "SIGINT"],  # named explicitly (also the default)
        )
    SlowSaveTrainer.save_sleep = cfg.get("save_sleep", 0.0)
    torch.manual_seed(0)
    model, train_data = (
        _peft_model_and_data(cfg)
        if cfg.get("lora")
        else (
            Net(cfg.get("dropout", 0.0)),
            Data(64, cfg.get("train_item_sleep", 0.0), cfg.get("augment", False)),
        )
    )
    trainer = SlowSaveTrainer(
        model=model,
        args=args,
        train_dataset=train_data,
        eval_dataset=Data(eval_items, cfg.get("eval_item_sleep", 0.0), cfg.get("eval_augment", False))
        if eval_items
        else None,
        callbacks=[Report(cfg.get("step_sleep", 0.0))],
    )
    out = trainer.train(resume_from_checkpoint=cfg.get("resume"))
    if cfg.get("final"):
        trainer.save_model(cfg["final"])
    print(f"DONE {out.global_step}", flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
