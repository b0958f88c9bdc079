"""A model loaded with `from_pretrained(tp_plan="auto")` under torchrun (transformers v5 shards it
itself) is trained as it is: trainwright adopts its DTensors and tensor-parallel mesh instead of
refusing it, and two processes train it to the losses and weights of one process training the whole
model; its DCP checkpoint resumes bit-exact (real torchrun processes, gloo)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from kit.torchrun import torchrun_command

transformers = pytest.importorskip("transformers")
from kit import ecosystem as eco  # noqa: E402
from kit import job, job_env  # noqa: E402

JOB = job("tp_loaded_job.py")


def test_a_model_loaded_tensor_parallel_trains_as_one_process_and_resumes_exactly(tmp_path):
    tok = eco.tokenizer(str(tmp_path / "tok"))
    eco.llama(tok).save_pretrained(str(tmp_path / "model"))
    reports = {}
    for procs in (1, 2):
        report = str(tmp_path / f"report{procs}.json")
        cfg = json.dumps({"folder": str(tmp_path), "report": report})
        launcher = [sys.executable, JOB] if procs == 1 else [*torchrun_command(), JOB]
        done = subprocess.run(
            [*launcher, cfg],
            capture_output=True,
            text=True,
            timeout=600,
            env=job_env(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"),
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        with open(report) as f:
            reports[procs] = json.load(f)
    one, two = reports[1], reports[2]
    assert two["tp_size"] == 2 and one["tp_size"] == 1
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-6)
    assert {"pytorch_model_fsdp_0", "optimizer_0"} <= set(two["files"])  # its shards, in DCP folders
    assert two["resume_exact"]
    whole = torch.load(str(tmp_path / "report1.json.weights.pt"), weights_only=True)
    sharded = torch.load(str(tmp_path / "report2.json.weights.pt"), weights_only=True)
    for k, v in whole.items():
        assert torch.allclose(sharded[k], v, rtol=1e-5, atol=1e-6), k
