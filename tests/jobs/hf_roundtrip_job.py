"""A GPT-2 training job run by trainwright's Trainer or by the installed transformers.Trainer, for
the tests of checkpoints that travel between them (test_checkpoint_transformers.py):

    python hf_roundtrip_job.py '{"trainer": "trainwright" | "transformers", "tokenizer": dir,
                                 "output_dir": ..., "report": dir, "resume": null | path}'

GPT-2 built from a config (dropout on), texts tokenized by a tokenizer trained offline, padded by
DataCollatorForLanguageModeling (BatchEncoding), 2 dataloader workers, batch 4, accumulation 2
(6 optimizer steps an epoch), AdamW, a linear schedule with warmup, 9 steps, a checkpoint every 4.

It writes under `report`: at every save (`on_save`, so the state the checkpoint holds), and after a
resume has restored everything (when the Trainer restores the RNG, its last step), `<tag>.pt`
holding the model's weights, the optimizer state by parameter name, the schedule's state, the global
step, and the first numbers the Python, NumPy and torch generators would draw (taken without
drawing). `final.json`: the logged losses and the global step at the end.
"""

from __future__ import annotations

import json
import os
import random
import sys

import numpy as np
import torch


def draws() -> list:
    """What the global generators would draw next, leaving them where they are."""
    saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
    out = [random.random(), random.gauss(0, 1), float(np.random.rand()), torch.rand(3).tolist()]
    random.setstate(saved[0])
    np.random.set_state(saved[1])
    torch.set_rng_state(saved[2])
    return out


def snapshot(trainer, path: str) -> None:
    model, optimizer = trainer.model, trainer.optimizer
    names = {id(p): n for n, p in model.named_parameters()}
    state = optimizer.state_dict()["state"]
    by_name = {}
    for index, param in enumerate(p for group in optimizer.param_groups for p in group["params"]):
        if index in state:
            by_name[names[id(param)]] = {k: v.clone() for k, v in state[index].items()}
    torch.save(
        {
            "weights": {k: v.clone() for k, v in model.state_dict().items()},
            "optimizer": by_name,
            "scheduler": trainer.lr_scheduler.state_dict(),
            "global_step": trainer.state.global_step,
            "draws": draws(),
        },
        path,
    )


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    import transformers

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared kit
    from kit import hf

    report = cfg["report"]
    os.makedirs(report, exist_ok=True)
    upstream = cfg["trainer"] == "transformers"
    if upstream:
        from transformers import Trainer, TrainerCallback, TrainingArguments
    else:
        from trainwright import Trainer, TrainerCallback, TrainingArguments

    class OnSave(TrainerCallback):
        def on_save(self, args, state, control, **kw):
            snapshot(trainer, os.path.join(report, f"save-{state.global_step}.pt"))

    class Recording(Trainer):  # type: ignore[misc, valid-type]
        def _load_rng_state(self, checkpoint):
            super()._load_rng_state(checkpoint)
            loaded = os.path.join(report, "loaded.pt")
            if checkpoint is not None and not os.path.exists(loaded):
                snapshot(self, loaded)

    tok = transformers.AutoTokenizer.from_pretrained(cfg["tokenizer"])
    texts = hf.text_corpus(48, seed=4, min_words=4, max_words=20)
    data = hf.datasets.Dataset.from_dict({"text": texts}).map(
        lambda b: tok(b["text"], truncation=True, max_length=hf.MAX_LEN),
        batched=True,
        remove_columns=["text"],
    )
    model = hf.tiny_gpt2_lm(tok, dropout=0.1)  # GPT-2's default dropout: the RNG matters
    args = TrainingArguments(
        output_dir=cfg["output_dir"],
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        dataloader_num_workers=2,
        max_steps=9,
        learning_rate=3e-3,
        warmup_steps=2,
        weight_decay=0.01,
        logging_steps=1,
        save_strategy="steps",
        save_steps=4,
        seed=5,
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
    )
    trainer = Recording(
        model=model,
        args=args,
        train_dataset=data,
        data_collator=transformers.DataCollatorForLanguageModeling(tok, mlm=False),
        callbacks=[OnSave()],
    )
    out = trainer.train(resume_from_checkpoint=cfg.get("resume"))
    rows = [
        {k: r[k] for k in ("step", "loss", "learning_rate") if k in r}
        for r in trainer.state.log_history
        if "loss" in r
    ]
    with open(os.path.join(report, "final.json"), "w") as f:
        json.dump({"rows": rows, "global_step": out.global_step}, f)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
