"""The model-path arguments in real processes: a run resumed in a new process from a mid-epoch checkpoint
ends bit-identical with `fused_linear_cross_entropy`, with `padding_free` and with `lean_activations`
(tests/jobs/model_path_job.py), and two DDP ranks with both train like one process with the same global
batch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from kit import hf, job, job_env
from kit.torchrun import torchrun_command
from safetensors.torch import load_file

tokenizer_dir = hf.tokenizer_dir  # session fixture

JOB = job("model_path_job.py")
FEATURES = {"fused": {"fused": True}, "padding_free": {"padding_free": True}, "lean": {"lean": True}}


def run_job(cfg: dict, nproc: int = 0) -> None:
    """The job in a new process, or under torchrun with `nproc` ranks (gloo, loopback)."""
    env = job_env(OMP_NUM_THREADS="1")
    launcher = torchrun_command(nproc) if nproc else [sys.executable]
    proc = subprocess.run(
        [*launcher, JOB, json.dumps(cfg)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if proc.returncode != 0:
        raise AssertionError(f"job failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def result(folder: str) -> tuple[dict, dict]:
    with open(os.path.join(folder, "result.json")) as f:
        res = json.load(f)
    return res, load_file(os.path.join(folder, "final", "model.safetensors"))


@pytest.fixture(scope="module", params=sorted(FEATURES))
def reference(request, tmp_path_factory, tokenizer_dir):
    """One uninterrupted run with the feature on: 2 epochs of 8 steps (batch 3, accumulation 2)."""
    out = str(tmp_path_factory.mktemp(f"ref_{request.param}"))
    cfg = {"output_dir": out, "tokenizer": tokenizer_dir, **FEATURES[request.param]}
    run_job(cfg)
    return cfg


@pytest.mark.parametrize("stop", [3, 8, 11], ids=["mid-epoch", "end-of-epoch", "epoch-2"])
def test_resume_in_a_new_process_is_bit_identical(reference, tmp_path, stop):
    ref_res, ref_weights = result(reference["output_dir"])
    out = str(tmp_path / "resumed")
    os.makedirs(out)
    name = f"checkpoint-{stop}"
    shutil.copytree(os.path.join(reference["output_dir"], name), os.path.join(out, name))
    run_job({**reference, "output_dir": out, "resume": True})
    res, weights = result(out)
    assert res["global_step"] == ref_res["global_step"] == 16
    assert res["rows"] == ref_res["rows"]  # every logged loss, grad norm, learning rate, token count
    assert res["train_loss"] == ref_res["train_loss"]
    assert res["tokens_seen"] == ref_res["tokens_seen"] and res["samples_seen"] == ref_res["samples_seen"]
    for k in ref_weights:
        assert torch.equal(weights[k], ref_weights[k]), k


def test_two_ddp_ranks_with_both_features_train_like_one_process(tmp_path, tokenizer_dir):
    # SGD: Adam would turn the float noise of gradients that are truly 0 (attention key biases) into
    # full-size steps; dropout off: the ranks' dropout masks differ from one process's
    common = {"tokenizer": tokenizer_dir, "fused": True, "padding_free": True, "dropout": 0.0, "optim": "sgd"}
    one = str(tmp_path / "one")
    run_job({**common, "output_dir": one, "batch": 4, "max_steps": 4, "save_steps": 100})
    two = str(tmp_path / "two")
    run_job({**common, "output_dir": two, "batch": 2, "max_steps": 4, "save_steps": 100}, nproc=2)
    one_res, one_weights = result(one)
    two_res, two_weights = result(two)
    one_losses = [r["loss"] for r in one_res["rows"]]
    two_losses = [r["loss"] for r in two_res["rows"]]
    assert two_losses == pytest.approx(one_losses, rel=1e-5)
    for k in one_weights:
        torch.testing.assert_close(two_weights[k], one_weights[k], rtol=0, atol=1e-5, msg=k)
