"""setfit on trainwright, against the same script on transformers (tests/jobs/setfit_job.py run with
`python` and with `python -m trainwright run`): the body fine-tuned through setfit's trainer (which
replaces the callback handler's `call_event` to hand its callbacks the SetFitModel and its own
arguments), then the classifier head.

The body trainer's logged losses equal transformers' (relative 1e-5), the user callback sees the same
events with the SetFitModel, the head predicts the same probabilities, setfit loads what was saved,
and trainwright's guarantees hold for the body's run: a resume from checkpoint-2 ends on the
uninterrupted weights (in the job's process; after SIGKILL and after SIGTERM to the process group,
in new processes), a background checkpoint is the synchronous one's bytes.
"""

from __future__ import annotations

import os
import signal

import pytest
from kit import job
from kit import library_runs as lr

pytest.importorskip("setfit")

JOB = job("setfit_job.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("setfit")
    base = {"scenarios": ["setfit"]}
    hf = lr.run_job(JOB, "transformers", {**base, "root": str(root / "hf"), "report": str(root / "hf.json")})
    extra = {"resumed": True, "async": True}
    tw = lr.run_job(
        JOB, "trainwright", {**base, **extra, "root": str(root / "tw"), "report": str(root / "tw.json")}
    )
    return {"transformers": hf["setfit"], "trainwright": tw["setfit"]}


def test_setfit_trains_on_trainwright_as_on_transformers(runs):
    hf, tw = runs["transformers"], runs["trainwright"]
    assert hf["base"] == "transformers.trainer" and tw["base"] == "trainwright.loop.trainer"
    lr.assert_same_history(hf["history"], tw["history"])
    lr.assert_same_files(hf["files"], tw["files"], set())
    flat = [p for row in hf["predictions"] for p in row]
    assert [p for row in tw["predictions"] for p in row] == pytest.approx(flat, rel=1e-5)
    assert tw["metrics"] == hf["metrics"]


def test_setfits_call_event_reaches_its_callbacks(runs):
    """setfit's replacement of `call_event` runs: its callbacks get the SetFitModel, on the events and
    with the flags of a transformers run (the handler resets them before calling it, as upstream)."""
    hf, tw = runs["transformers"], runs["trainwright"]
    assert tw["callback_models"] == ["SetFitModel"]
    assert tw["events"] == hf["events"]


def test_setfit_loads_what_was_saved_and_the_body_resumes_exactly(runs):
    tw = runs["trainwright"]
    assert tw["loads_back"]
    assert tw["resume_exact"], "the body's resume from checkpoint-2 did not end on the uninterrupted weights"
    assert tw["async_same_bytes"], "a background checkpoint's files differ from the synchronous one's"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_an_interrupted_setfit_run_resumes_bit_exact_in_a_new_process(runs, tmp_path, sig):
    proc, resumed, output = lr.interrupted(JOB, tmp_path, "setfit", sig)
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL, output[-3000:]
    else:  # the preemption save at the step in progress, then a clean exit
        assert proc.returncode == 0 and "SAVED 3" in output, output[-3000:]
        assert os.path.isfile(tmp_path / "run" / "setfit" / "checkpoint-3" / "model.safetensors")
    assert resumed["global_step"] == 4
    lr.same_weights(resumed["weights_file"], runs["trainwright"]["weights_file"])
