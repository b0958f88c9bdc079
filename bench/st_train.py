"""sentence-transformers' trainer on trainwright against the same script on transformers: steady steps/s.

A bi-encoder on a tiny BERT built offline and loaded by the library from its folder (as from the
Hub), in-batch negatives (MultipleNegativesRankingLoss) over question/answer pairs, batch 16, logging
every 10 steps, no checkpoints; the two libraries alternate, each run in a fresh process
(bench/_libraries.py).

    .venv/bin/python bench/st_train.py [--repeats 3] [--steps 120] [--warmup 20] [--threads 1]
                                       [--clock wall|thread]

Goal: trainwright / transformers >= 1.0.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the offline tokenizer and data of the tests
import _libraries  # noqa: E402


def child(ns: argparse.Namespace) -> None:
    """One training run on whichever library `transformers.Trainer` is."""
    from jobs import st_job
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
    )

    clock, marks = _libraries.step_clock(ns.clock)
    with tempfile.TemporaryDirectory() as out:
        model = SentenceTransformer(st_job.model_folder(out, "bert"))
        args = SentenceTransformerTrainingArguments(
            output_dir=os.path.join(out, "run"),
            max_steps=ns.steps,
            per_device_train_batch_size=16,
            logging_steps=10,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            seed=0,
        )
        trainer = SentenceTransformerTrainer(
            model=model,
            args=args,
            train_dataset=st_job.pairs(4096, 0),
            loss=losses.MultipleNegativesRankingLoss(model),
            callbacks=[clock],
        )
        trainer.train()
    _libraries.report(trainer, marks, ns.warmup)


if __name__ == "__main__":
    _libraries.compare(__file__, __doc__, "sentence-transformers", child, steps=120)
