"""The training and evaluation loops fetch each batch one ahead, as accelerate's `DataLoaderShard`
fetches it in transformers' Trainer: a collator or dataset that draws from the global RNG draws
batch k+1's numbers before the step that trains batch k (between the dropout of two steps), so the
losses and evaluation losses are transformers' (beside transformers.Trainer in the same test).

A checkpoint keeps the batch in hand (fetched, not yet trained): the batch itself, weights-only
(`batch_in_hand.safetensors`), or, for a batch no checkpoint can hold so, the RNG state it was fetched from
(`rng_state.pth`'s "look_ahead"); a resume, in this process or in a new one after SIGKILL, then
continues the uninterrupted run bit for bit. The cases are look_ahead_kit.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from kit import hf, job, job_env
from look_ahead_kit import CASES, SAVE_STEPS, build, logged
from safetensors import safe_open
from safetensors.torch import load_file

import trainwright

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
tokenizer_dir = hf.tokenizer_dir  # session fixture

JOB = job("look_ahead_job.py")
RESUMED = 2  # the checkpoint resumed: mid-epoch, with a batch in hand
STORED = ("mlm", "random", "numpy")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tokenizer_dir):
    """Each case's uninterrupted runs, made once: {case: (transformers' losses, trainwright's trainer)}."""
    made: dict = {}

    def get(case: str):
        if case not in made:
            base = tmp_path_factory.mktemp(case)
            upstream = build(transformers, case, str(base / "hf"), tokenizer_dir)
            upstream.train()
            ours = build(trainwright, case, str(base / "tw"), tokenizer_dir)
            ours.train()
            made[case] = (logged(upstream), ours)
        return made[case]

    return get


def _weights(model: torch.nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _after(entries: list, step: int) -> list:
    return [e for e in entries if e[0] > step]


@pytest.mark.parametrize("case", CASES)
def test_losses_and_evaluation_losses_are_transformers(runs, case):
    upstream, ours = runs(case)
    mine = logged(ours)
    assert [e[:2] for e in mine] == [e[:2] for e in upstream]
    assert sum(key == "eval_loss" for _, key, _ in mine) == 3  # the evaluations' batches draw too
    assert [e[2] for e in mine] == pytest.approx([e[2] for e in upstream], rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("case", CASES)
def test_the_checkpoint_keeps_the_batch_in_hand(runs, case):
    _, ours = runs(case)
    folder = os.path.join(ours.args.output_dir, f"checkpoint-{RESUMED}")
    rng = torch.load(os.path.join(folder, "rng_state.pth"), weights_only=True)
    with open(os.path.join(folder, "checkpoint_complete.json")) as f:
        listed = json.dumps(json.load(f))
    if case in STORED:  # the batch itself, as safetensors; no RNG state captured per fetch
        name = os.path.join(folder, "batch_in_hand.safetensors")
        with safe_open(name, framework="pt") as f:
            assert json.loads(f.metadata()["layout"])["mapping"] == (
                "BatchEncoding" if case == "mlm" else "dict"
            )
            assert "labels" in f.keys()
        assert "batch_in_hand.safetensors" in listed and "look_ahead" not in rng
    else:  # the state it was fetched from, where the checkpoint cannot hold it
        assert not os.path.exists(os.path.join(folder, "batch_in_hand.safetensors"))
        assert set(rng["look_ahead"]) >= {"python", "numpy", "cpu"}
        assert not torch.equal(rng["look_ahead"]["cpu"], rng["cpu"])


@pytest.mark.parametrize("case", CASES)
def test_a_resume_continues_exactly(runs, tokenizer_dir, tmp_path, case):
    upstream, whole = runs(case)
    resumed = build(trainwright, case, str(tmp_path / "resumed"), tokenizer_dir)
    resumed.train(resume_from_checkpoint=os.path.join(whole.args.output_dir, f"checkpoint-{RESUMED}"))
    assert _after(logged(resumed), RESUMED) == _after(logged(whole), RESUMED)
    assert [e[2] for e in _after(logged(resumed), RESUMED)] == pytest.approx(
        [e[2] for e in _after(upstream, RESUMED)], rel=1e-6, abs=1e-7
    )
    ref = _weights(whole.model)
    for name, value in _weights(resumed.model).items():
        assert torch.equal(value, ref[name]), name


def _job(cfg: dict, **popen: object) -> subprocess.Popen:
    here = os.path.dirname(__file__)  # the job builds its run with look_ahead_kit
    return subprocess.Popen(
        [sys.executable, JOB, json.dumps(cfg)],
        text=True,
        env=job_env(here),
        **popen,  # type: ignore[call-overload]
    )


@pytest.mark.parametrize("case", ["mlm", "unstorable-stream"])  # a stored batch; one fetched again
def test_after_sigkill_a_new_process_resumes_exactly(runs, tokenizer_dir, tmp_path, case):
    upstream, whole = runs(case)
    out = str(tmp_path / "killed")
    cfg = {"case": case, "tokenizer": tokenizer_dir, "output_dir": out}
    proc = _job(cfg, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    # killed as step 4 begins: checkpoint-2 is the newest, written with a batch in hand
    assert any(line.startswith(f"STEP {RESUMED + SAVE_STEPS}") for line in proc.stdout)
    proc.kill()
    proc.wait(timeout=60)
    assert not os.path.exists(os.path.join(out, f"checkpoint-{RESUMED + SAVE_STEPS}"))
    resumed = _job({**cfg, "resume": True}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-4000:]
    with open(os.path.join(out, "result.json")) as f:
        got = [tuple(e) for e in json.load(f)["logged"]]
    assert _after(got, RESUMED) == _after(logged(whole), RESUMED)
    assert [e[2] for e in _after(got, RESUMED)] == pytest.approx(
        [e[2] for e in _after(upstream, RESUMED)], rel=1e-6, abs=1e-7
    )
    final = load_file(os.path.join(out, "final", "model.safetensors"))
    ref = _weights(whole.model)
    for name, value in final.items():
        assert torch.equal(value, ref[name]), name


def test_a_checkpoint_holds_a_mapping_of_tensors_as_it_was(tmp_path):
    from collections import UserDict

    from trainwright.checkpoint.files import load_tensors_state, save_tensors_state
    from trainwright.data.look_ahead import batch_from_state, stored_state

    ids = torch.arange(12).view(3, 4)
    batch = transformers.BatchEncoding({"labels": ids[1:], "input_ids": ids, "mask": ids > 3})
    save_tensors_state(stored_state(batch), tmp_path / "b.safetensors")
    back = batch_from_state(load_tensors_state(tmp_path / "b.safetensors"))
    assert type(back) is transformers.BatchEncoding and list(back) == ["labels", "input_ids", "mask"]
    assert all(torch.equal(back[k], batch[k]) and back[k].dtype == batch[k].dtype for k in batch)
    # what no safetensors file holds as it was: the run fetches such a batch again instead
    for other in ({"x": ids.t()}, {"x": ids, "names": ["a"]}, [ids], UserDict(x=ids), {0: ids}):
        assert stored_state(other) is None, other


def test_a_batch_in_hand_that_does_not_describe_its_tensors_is_refused_naming_the_file():
    from trainwright.checkpoint.files import CheckpointError
    from trainwright.data.look_ahead import batch_from_state

    with pytest.raises(CheckpointError, match="batch_in_hand.safetensors"):
        batch_from_state({"tensors": {"x": torch.zeros(1)}, "metadata": {"keys": '["x"]'}})
