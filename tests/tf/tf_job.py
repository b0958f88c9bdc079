"""One TFTrainer run in its own process, for tests that need a fresh TensorFlow (logical devices,
TF_CONFIG workers, resume in a new process, SIGKILL during a save).

    python tf_job.py OUTPUT_DIR [--devices N] [--bs B] [--ga G] [--max_steps S] [--save_steps K]
        [--stop_at S] [--resume] [--dropout P] [--kill_in tf_write|json|rename --kill_save N]
        [--weights FILE] [--clip C] [--announce] [--step_sleep SECONDS]

Writes the final weights to --weights (.npz) on the chief.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

p = argparse.ArgumentParser()
p.add_argument("output_dir")
p.add_argument("--devices", type=int, default=1)
p.add_argument("--bs", type=int, default=8)
p.add_argument("--ga", type=int, default=1)
p.add_argument("--max_steps", type=int, default=12)
p.add_argument("--save_steps", type=int, default=500)
p.add_argument("--stop_at", type=int, default=0)
p.add_argument("--resume", action="store_true")
p.add_argument("--dropout", type=float, default=0.0)
p.add_argument("--kill_in", default="")
p.add_argument("--kill_save", type=int, default=2)
p.add_argument("--weights", default="")
p.add_argument("--clip", type=float, default=1.0)
p.add_argument("--n", type=int, default=40)
p.add_argument("--predict", default="")
p.add_argument("--announce", action="store_true")  # print "STEP n" (flushed) as each step begins
p.add_argument("--step_sleep", type=float, default=0.0)  # a slow run, to signal mid-way
ns = p.parse_args()

import tensorflow as tf  # noqa: E402

if ns.devices > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * ns.devices)

import numpy as np  # noqa: E402
from tfkit import make_data, make_model  # noqa: E402

from trainwright import TFTrainer, TFTrainingArguments  # noqa: E402
from trainwright.core.events import TrainerCallback  # noqa: E402

args = TFTrainingArguments(
    output_dir=ns.output_dir,
    per_device_train_batch_size=ns.bs,
    per_device_eval_batch_size=5,
    gradient_accumulation_steps=ns.ga,
    max_steps=ns.max_steps,
    learning_rate=0.05,
    warmup_steps=2,
    weight_decay=0.01,
    max_grad_norm=ns.clip,
    logging_steps=3,
    save_steps=ns.save_steps,
    disable_tqdm=True,
    seed=7,
)

if ns.kill_in:
    # SIGKILL this process at one moment of the kill_save-th save (no cleanup can run).
    import trainwright.checkpoint.folder as folder_mod
    import trainwright.tf.checkpointing as ckpt_mod

    saves = {"n": 0}

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    real_save = ckpt_mod.save

    def counting_save(*a, **k):
        saves["n"] += 1
        return real_save(*a, **k)

    ckpt_mod.save = counting_save
    if ns.kill_in == "tf_write":
        real_write = tf.train.Checkpoint.write

        def write(self, prefix, *a, **k):
            if saves["n"] == ns.kill_save:
                with open(prefix + ".index", "wb") as f:  # a partial file, then death
                    f.write(b"partial")
                die()
            return real_write(self, prefix, *a, **k)

        tf.train.Checkpoint.write = write
    elif ns.kill_in == "json":
        real_json = ckpt_mod.write_json

        def write_json(path, obj):
            if saves["n"] == ns.kill_save:
                die()
            return real_json(path, obj)

        ckpt_mod.write_json = write_json
    elif ns.kill_in == "rename":
        real_rename = os.rename

        def rename(src, dst):
            if saves["n"] == ns.kill_save and ".tmp-" in str(src):
                die()
            return real_rename(src, dst)

        folder_mod.os.rename = rename  # type: ignore[attr-defined]
    else:
        raise SystemExit(f"unknown --kill_in {ns.kill_in}")


class StopAt(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        if ns.announce:
            print(f"STEP {state.global_step + 1}", flush=True)
        if ns.step_sleep:
            time.sleep(ns.step_sleep)

    def on_step_end(self, args, state, control, **kwargs):
        if ns.stop_at and state.global_step >= ns.stop_at:
            control.should_training_stop = True
        return control


with args.strategy.scope():
    model = make_model(dropout=ns.dropout)
data = make_data(ns.n)
trainer = TFTrainer(model, args, train_dataset=data, eval_dataset=make_data(13, seed=3), callbacks=[StopAt()])
out = trainer.train(resume_from_checkpoint=True if ns.resume else None)
print("LOSSES", [round(r["loss"], 6) for r in trainer.state.log_history if "loss" in r])
if ns.weights and args.process_index == 0:
    np.savez(ns.weights, *[v.numpy() for v in model.weights])
if ns.predict:  # every worker takes part (the gather is collective); the chief writes
    pred = trainer.predict(make_data(13, seed=3))
    if args.process_index == 0:
        np.savez(ns.predict, predictions=pred.predictions, loss=pred.metrics["test_loss"])
print("DONE", out.global_step)
