"""A training job for the model-path tests (fused loss, padding-free packing), run in its own process
(python model_path_job.py CFG, or under torchrun for 2 ranks):

    cfg: {"output_dir": ..., "tokenizer": dir, "resume": null | true, "fused": bool,
          "padding_free": bool, "lean": bool (lean_activations), "batch": per-device batch,
          "ga": accumulation, "max_steps": n,
          "save_steps": n, "dropout": p, "optim": name}

Trains a tiny GPT-2 (dropout on) on texts of varying lengths tokenized by the tests' tokenizer
(transformers' DataCollatorForLanguageModeling, shuffled, AdamW, cosine schedule), saving every
`save_steps`; rank 0 writes the final weights and the logged rows (without timings) to output_dir.
"""

from __future__ import annotations

import json
import os
import sys

import torch


def dataset(tokenizer, n: int = 48, seed: int = 5) -> list[dict]:
    """Texts of 1 to 30 words tokenized by the session's tokenizer: 3 to ~40 tokens."""
    from kit.hf import text_corpus

    texts = text_corpus(n, seed=seed, min_words=1, max_words=30)
    return [{"input_ids": ids} for ids in tokenizer(texts, truncation=True)["input_ids"]]


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    import transformers
    from kit import hf

    from trainwright import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=cfg["output_dir"],
        per_device_train_batch_size=cfg.get("batch", 3),
        gradient_accumulation_steps=cfg.get("ga", 2),
        num_train_epochs=2,
        max_steps=cfg.get("max_steps", -1),
        learning_rate=5e-3,
        lr_scheduler_type="cosine",
        warmup_steps=1,
        logging_steps=1,
        save_strategy="steps",
        save_steps=cfg.get("save_steps", 1),
        seed=11,
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        include_num_input_tokens_seen="non_padding",
        fused_linear_cross_entropy=cfg.get("fused", False),
        padding_free=cfg.get("padding_free", False),
        lean_activations=cfg.get("lean", False),
        optim=cfg.get("optim", "adamw_torch"),
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(cfg["tokenizer"])
    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm=False)
    model = hf.tiny_gpt2_lm(tokenizer, dropout=cfg.get("dropout", 0.1), use_cache=True)
    trainer = Trainer(model=model, args=args, train_dataset=dataset(tokenizer), data_collator=collator)
    out = trainer.train(resume_from_checkpoint=cfg.get("resume"))
    trainer.save_model(os.path.join(cfg["output_dir"], "final"))  # every process calls it
    if trainer.is_world_process_zero():
        rows = [
            {k: v for k, v in r.items() if not (k.endswith("_runtime") or k.endswith("_per_second"))}
            for r in trainer.state.log_history
            if "loss" in r
        ]
        result = {
            "rows": rows,
            "train_loss": out.training_loss,
            "global_step": out.global_step,
            "tokens_seen": trainer.state.num_input_tokens_seen,
            "samples_seen": trainer.cursor.samples_seen,
        }
        with open(os.path.join(cfg["output_dir"], "result.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
