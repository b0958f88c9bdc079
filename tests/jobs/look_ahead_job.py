"""A run of the look-ahead tests (tests/loop/test_look_ahead.py) in a process of its own:

    python look_ahead_job.py '{"case": ..., "tokenizer": dir, "output_dir": ..., "resume": null | true}'

Trains the case of tests/loop/look_ahead_kit.py with trainwright (printing "STEP n" as each step
begins, for a test that kills it), then writes the logged losses and the final weights to output_dir.
"""

from __future__ import annotations

import json
import os
import sys

import torch


def main(cfg: dict) -> None:
    torch.set_num_threads(1)
    from look_ahead_kit import build, logged

    import trainwright

    class Announce(trainwright.TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            print(f"STEP {state.global_step + 1}", flush=True)

    trainer = build(trainwright, cfg["case"], cfg["output_dir"], cfg.get("tokenizer"))
    trainer.add_callback(Announce())
    trainer.train(resume_from_checkpoint=cfg.get("resume"))
    trainer.save_model(os.path.join(cfg["output_dir"], "final"))
    with open(os.path.join(cfg["output_dir"], "result.json"), "w") as f:
        json.dump({"logged": logged(trainer)}, f)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
