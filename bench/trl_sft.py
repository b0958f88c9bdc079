"""TRL's SFTTrainer on trainwright against the same script on transformers: steady steps/s.

A tiny Llama-style model built offline, prompt-completion data, TRL's defaults for logging (every 10
steps) and no checkpoints; the two libraries alternate, each run in a fresh process
(bench/_libraries.py).

    .venv/bin/python bench/trl_sft.py [--repeats 3] [--steps 120] [--warmup 20] [--threads 1] [--clock wall|thread]

Goal: trainwright / transformers >= 0.98.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the offline tokenizer, models and data of the tests
import _libraries  # noqa: E402


def child(ns: argparse.Namespace) -> None:
    """One training run on whichever library `transformers.Trainer` is."""
    import trl
    from kit import ecosystem as eco

    clock, marks = _libraries.step_clock(ns.clock)
    with tempfile.TemporaryDirectory() as out:
        tok = eco.tokenizer(os.path.join(out, "tok"))
        args = trl.SFTConfig(
            output_dir=out,
            max_steps=ns.steps,
            per_device_train_batch_size=8,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            bf16=False,
            gradient_checkpointing=False,
            disable_tqdm=True,
            seed=0,
        )
        trainer = trl.SFTTrainer(
            model=eco.llama(tok),
            args=args,
            train_dataset=eco.completions(512),
            processing_class=tok,
            callbacks=[clock],
        )
        trainer.train()
    _libraries.report(trainer, marks, ns.warmup)


if __name__ == "__main__":
    _libraries.compare(__file__, __doc__, "TRL SFT", child, steps=120)
