"""A training job for the collator resume tests (test_collators_real.py), run in its own process:

    python collator_resume_job.py '{"case": ..., "tokenizer": dir, "output_dir": ..., "resume": null | true}'

Builds the case's tiny model, tokenized dataset (12 rows) and transformers collator, trains 2 epochs
of 3 optimizer steps (batch 2, accumulation 2, shuffled, AdamW, linear schedule), saving every step;
then writes the final weights and the logged rows to output_dir.
"""

from __future__ import annotations

import json
import os
import sys

import torch


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    import transformers
    from test_collators_real import CASES, build, make_args

    from trainwright import Trainer

    tok = transformers.AutoTokenizer.from_pretrained(cfg["tokenizer"])
    model, data, collator = build(cfg["case"], tok, n=12, seed=2)
    args = make_args(
        cfg["output_dir"],
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        num_train_epochs=2,
        learning_rate=5e-3,
        warmup_steps=1,
        logging_steps=1,
        save_strategy="steps",
        save_steps=1,
        seed=3,
        include_num_input_tokens_seen=True,
        remove_unused_columns=not CASES[cfg["case"]].keep_columns,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=collator)
    out = trainer.train(resume_from_checkpoint=cfg.get("resume"))
    trainer.save_model(os.path.join(cfg["output_dir"], "final"))
    # timings (runtime, rates) differ between any two runs; every other logged number must not
    rows = [
        {k: v for k, v in r.items() if not (k.endswith("_runtime") or k.endswith("_per_second"))}
        for r in trainer.state.log_history
        if "loss" in r
    ]
    with open(os.path.join(cfg["output_dir"], "result.json"), "w") as f:
        json.dump(
            {
                "rows": rows,
                "train_loss": out.training_loss,
                "global_step": out.global_step,
                "samples_seen": trainer.cursor.samples_seen,
                "num_input_tokens_seen": trainer.state.num_input_tokens_seen,
            },
            f,
        )


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
