"""DeepSpeed's engine behind the Trainer, in real 2-process torchrun jobs (gloo, DeepSpeed's CPU
accelerator). The same MLP, data and global batch as the DDP run must end with the same weights under
ZeRO-1, -2 and -3 (the engine only changes where the optimizer state lives), and a run resumed from
the engine's checkpoint must end where the uninterrupted one did."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("deepspeed", reason="deepspeed is not installed (optional extra: pip install deepspeed)")

from kit import job_env  # noqa: E402
from kit.torchrun import DIST_JOB, SGD, assert_close_weights, torchrun, weights  # noqa: E402

from trainwright.args.training_args import TrainingArguments  # noqa: E402
from trainwright.distributed.deepspeed import ENGINE_DIR, fill_config  # noqa: E402

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # inherited by the torchrun workers
RUN = {
    **SGD,
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 2,
    "max_steps": 4,
    "save_strategy": "steps",
    "save_steps": 2,
    "max_grad_norm": 0.0,  # clipping to a constant norm would hide a wrong gradient scale
}
CLIP = {**RUN, "max_grad_norm": 0.5}  # small enough that every step clips


def zero(stage: int) -> dict:
    return {
        "zero_optimization": {"stage": stage},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ds"))
    tasks = [{"name": "ddp", "n": 32, "args": RUN}, {"name": "ddp_clip", "n": 32, "args": CLIP}]
    tasks += [{"name": f"z{s}", "n": 32, "args": {**RUN, "deepspeed": zero(s)}} for s in (1, 2, 3)]
    tasks += [{"name": "z2_clip", "n": 32, "args": {**CLIP, "deepspeed": zero(2)}}]
    torchrun({"out": out, "tasks": tasks}, timeout=400)
    resumed = [
        {
            "name": f"z{s}_resumed",
            "n": 32,
            "args": {**RUN, "deepspeed": zero(s)},
            "resume": os.path.join(out, f"z{s}", "checkpoint-2"),
        }
        for s in (2, 3)
    ]
    torchrun({"out": out, "tasks": resumed}, timeout=400)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stages_match_ddp(runs, stage):
    assert_close_weights(weights(os.path.join(runs, f"z{stage}")), weights(os.path.join(runs, "ddp")))


@pytest.mark.slow
def test_engine_clips_to_max_grad_norm_like_ddp(runs):
    assert_close_weights(weights(os.path.join(runs, "z2_clip")), weights(os.path.join(runs, "ddp_clip")))


@pytest.mark.slow
def test_checkpoints_hold_the_engine_folder(runs):
    assert os.path.isdir(os.path.join(runs, "z2", "checkpoint-2", ENGINE_DIR))
    assert not os.path.exists(os.path.join(runs, "z2", "checkpoint-2", "optimizer.pt"))


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_resume_through_the_engine_ends_like_the_uninterrupted_run(runs, stage):
    assert_close_weights(
        weights(os.path.join(runs, f"z{stage}_resumed")), weights(os.path.join(runs, f"z{stage}"))
    )


def test_auto_values_come_from_the_arguments(tmp_path):
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=3,
        gradient_accumulation_steps=2,
        max_grad_norm=0.5,
        learning_rate=0.01,
    )
    cfg = fill_config(
        {**zero(2), "optimizer": {"type": "AdamW", "params": {"lr": "auto", "eps": "auto"}}}, args, 4
    )
    assert cfg["train_micro_batch_size_per_gpu"] == 3 and cfg["train_batch_size"] == 24
    assert cfg["gradient_clipping"] == 0.5 and cfg["optimizer"]["params"]["lr"] == 0.01


def test_conflicting_and_unfillable_values_are_refused(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=3)
    with pytest.raises(ValueError, match="train_micro_batch_size_per_gpu=8"):
        fill_config({"train_micro_batch_size_per_gpu": 8}, args, 1)
    with pytest.raises(ValueError, match="scheduler"):
        fill_config({"scheduler": {"type": "WarmupLR"}}, args, 1)
    with pytest.raises(ValueError, match="zero_optimization.reduce_bucket_size"):
        fill_config({"zero_optimization": {"reduce_bucket_size": "auto"}}, args, 1)


@pytest.mark.slow
def test_one_process_without_a_launcher(tmp_path):
    """No torchrun variables: the engine still gets its (one-process) group instead of looking for MPI,
    matches plain training, and bf16 "auto" follows the argument (weights kept in bfloat16)."""
    one = {"per_device_train_batch_size": 4, "max_steps": 3, "max_grad_norm": 0.0, **SGD}
    tasks = [
        {"name": "plain", "n": 16, "args": one},
        {"name": "z2", "n": 16, "args": {**one, "deepspeed": zero(2)}},
        {
            "name": "z2_bf16",
            "n": 16,
            "args": {**one, "bf16": True, "deepspeed": {**zero(2), "bf16": {"enabled": "auto"}}},
        },
    ]
    cfg = json.dumps({"out": str(tmp_path), "tasks": tasks})
    done = subprocess.run(
        [sys.executable, DIST_JOB, cfg], env=job_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert_close_weights(weights(str(tmp_path / "z2")), weights(str(tmp_path / "plain")))
    assert {t.dtype for t in weights(str(tmp_path / "z2_bf16")).values()} == {torch.bfloat16}
