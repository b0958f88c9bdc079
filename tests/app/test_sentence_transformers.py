"""sentence-transformers' trainers on trainwright, against the same script on transformers
(tests/jobs/st_job.py run with `python` and with `python -m trainwright run`): a bi-encoder with
in-batch negatives and an evaluator, scored pairs, `model_init`, a LoRA adapter, a cross-encoder, a
sparse (SPLADE) encoder and a multi-vector encoder, each loaded by the library from a saved folder
(its transformer starts in evaluation mode, as after `from_pretrained`).

Each scenario's logged losses and evaluator metrics equal transformers' (relative 1e-5), the files
it leaves are transformers' (plus trainwright's own), the library loads the saved model and a
checkpoint back to the trained model's outputs, and trainwright's guarantees hold: a resume from
checkpoint-2 ends on the uninterrupted weights bit for bit (in the job's process; after SIGKILL and
after SIGTERM to the process group, in new processes), and a background checkpoint is the
synchronous one's bytes.
"""

from __future__ import annotations

import os
import signal

import pytest
from kit import job
from kit import library_runs as lr

pytest.importorskip("sentence_transformers")
pytest.importorskip("peft")

JOB = job("st_job.py")
SCENARIOS = ["st", "st_cosine", "st_init", "st_lora", "cross", "sparse", "multi_vector"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("st")
    base = {"scenarios": SCENARIOS}
    hf = lr.run_job(JOB, "transformers", {**base, "root": str(root / "hf"), "report": str(root / "hf.json")})
    extra = {"resumed": True, "async": True}
    tw = lr.run_job(
        JOB, "trainwright", {**base, **extra, "root": str(root / "tw"), "report": str(root / "tw.json")}
    )
    return {"transformers": hf, "trainwright": tw}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_sentence_transformers_trainer_runs_on_trainwright_as_on_transformers(runs, scenario):
    hf, tw = runs["transformers"][scenario], runs["trainwright"][scenario]
    assert hf["base"] == "transformers.trainer" and tw["base"] == "trainwright.loop.trainer"
    lr.assert_same_history(hf["history"], tw["history"])
    assert any("eval_loss" in row for row in tw["history"])
    if scenario in ("st", "st_cosine", "st_init", "st_lora"):  # the evaluator's metrics are logged
        assert any("eval_sums_spearman_cosine" in row for row in tw["history"])
    lr.assert_same_files(hf["files"], tw["files"], set())


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_library_loads_what_trainwright_saved(runs, scenario):
    loaded = runs["trainwright"][scenario]["loads_back"]
    assert loaded == {scenario: True, "checkpoint-4": True}, loaded


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_resume_and_background_checkpoints_keep_trainwrights_guarantees(runs, scenario):
    tw = runs["trainwright"][scenario]
    assert tw["resume_exact"], "a resume from checkpoint-2 did not end on the uninterrupted weights"
    assert tw["async_same_bytes"], "a background checkpoint's files differ from the synchronous one's"


def test_a_killed_run_resumes_bit_exact_in_a_new_process(runs, tmp_path):
    proc, resumed, output = lr.interrupted(JOB, tmp_path, "st", signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL, output[-3000:]
    assert resumed["global_step"] == 4
    lr.same_weights(resumed["weights_file"], runs["trainwright"]["st"]["weights_file"])


def test_a_run_stopped_by_sigterm_saves_and_resumes_bit_exact(runs, tmp_path):
    proc, resumed, output = lr.interrupted(JOB, tmp_path, "cross", signal.SIGTERM)
    assert proc.returncode == 0, output[-3000:]  # the preemption save, then a clean exit
    assert "SAVED 3" in output  # the step in progress when the signal came
    assert os.path.isfile(tmp_path / "run" / "cross" / "checkpoint-3" / "model.safetensors")
    assert resumed["global_step"] == 4
    lr.same_weights(resumed["weights_file"], runs["trainwright"]["cross"]["weights_file"])
