"""A training job for the resume tests, run in its own process:

    python resume_job.py '{"output_dir": ..., "resume": null | true | "path", ...}'

Trains a dropout MLP on shuffled data with gradient accumulation (and dataloader workers when
asked), saving every `save_steps`; then writes final weights and the loss rows to output_dir.
A custom dataset draws random noise in __getitem__ so worker RNG matters too.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import Dataset

from trainwright import EarlyStoppingCallback, Trainer, TrainerCallback, TrainingArguments


class NoisyData(Dataset):
    def __init__(self, n: int = 40, d: int = 8):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, d, generator=g)
        self.y = self.x.sum(-1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        # augmentation noise from the (worker's) global RNG
        return {"x": self.x[i] + 0.01 * torch.randn(self.x.shape[1]), "labels": self.y[i]}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))

    def forward(self, x, labels=None):
        out = self.net(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


class SlowDown(TrainerCallback):
    """Tells the parent which step is running (for signal tests); with a pause, waits that long
    after telling, so that a signal the parent sends on reading it arrives during that step even
    on a loaded machine."""

    def __init__(self, pause: float = 0.0):
        self.pause = pause

    def on_step_begin(self, args, state, control, **kw):
        print(f"STEP {state.global_step + 1}", flush=True)
        if self.pause:
            time.sleep(self.pause)  # a signal handler runs during the sleep; the sleep then finishes


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    args = TrainingArguments(
        output_dir=cfg["output_dir"],
        per_device_train_batch_size=4,
        gradient_accumulation_steps=cfg.get("ga", 2),
        num_train_epochs=cfg.get("epochs", 3),
        max_steps=cfg.get("max_steps", -1),
        learning_rate=0.05,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        logging_steps=cfg.get("logging_steps", 1),
        save_strategy="steps",
        save_steps=cfg.get("save_steps", 1),
        save_total_limit=cfg.get("save_total_limit"),
        eval_strategy="steps" if cfg.get("eval") else "no",
        eval_steps=cfg.get("eval_steps", 2),
        metric_for_best_model="loss" if cfg.get("eval") else None,
        dataloader_num_workers=cfg.get("workers", 0),
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        seed=cfg.get("seed", 7),
        per_device_eval_batch_size=8,
        preemption_signals=["SIGTERM", "SIGUSR1", "SIGINT"],  # named explicitly (also the default)
    )
    callbacks = [SlowDown(cfg.get("announce_pause", 0.0))] if cfg.get("announce") else []
    if cfg.get("early_stopping"):
        callbacks.append(
            EarlyStoppingCallback(
                early_stopping_patience=cfg["early_stopping"],
                early_stopping_threshold=cfg.get("early_stopping_threshold", 0.0),
            )
        )
    torch.manual_seed(0)  # the model is built before the Trainer seeds anything
    trainer = Trainer(
        model=Net(),
        args=args,
        train_dataset=NoisyData(),
        eval_dataset=NoisyData(16) if cfg.get("eval") else None,
        callbacks=callbacks,
    )
    out = trainer.train(resume_from_checkpoint=cfg.get("resume"))
    trainer.save_model(os.path.join(cfg["output_dir"], "final"))
    rows = [r for r in trainer.state.log_history if "loss" in r]
    with open(os.path.join(cfg["output_dir"], "result.json"), "w") as f:
        json.dump({"rows": rows, "train_loss": out.training_loss, "global_step": out.global_step}, f)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
