"""GLiNER's Trainer on trainwright, against the same script on transformers (tests/jobs/gliner_job.py
run with `python` and with `python -m trainwright run`, in .venv-gliner: gliner 0.2.29 needs
transformers < 5.17; scripts/setup_gliner.sh makes it). A tiny uni-encoder span GLiNER over a 2-layer
BERT built offline, trained through `gliner.training.Trainer` as its examples build it, and through
`model.train_model` as its README trains.

Each scenario's logged losses and evaluation losses equal transformers' (relative 1e-5), the files it
leaves are transformers' (plus trainwright's own), GLiNER loads the saved model and a checkpoint back
to the trained model's predictions, and trainwright's guarantees hold: a resume from checkpoint-2 ends
on the uninterrupted weights bit for bit (in the job's process; after SIGKILL and after SIGTERM to the
process group, in new processes), and a background checkpoint is the synchronous one's bytes.

What each needs of trainwright: the same losses, that `trainer.accelerator.prepare`'s loader fetches
one batch ahead as accelerate's (GLiNER's collator draws its label prompts from `random`); the same
files, that `TrainingArguments` has no `save_safetensors` attribute, as in transformers 5 (GLiNER
then writes pytorch_model.bin); a resume, `Trainer._issue_warnings_after_load` (GLiNER's
`_load_from_checkpoint` calls it) and a resumed epoch that fetches the checkpoint's batch in hand from
the RNG state it was fetched from.
"""

from __future__ import annotations

import os
import signal

import pytest
from kit import ROOT, job
from kit import library_runs as lr

PYTHON = str(ROOT / ".venv-gliner" / "bin" / "python")
pytestmark = pytest.mark.skipif(
    not os.path.isfile(PYTHON),
    reason="GLiNER runs in its own environment (it needs transformers < 5.17): run scripts/setup_gliner.sh",
)

JOB = job("gliner_job.py")
SCENARIOS = ["gliner", "train_model"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("gliner")
    base = {"scenarios": SCENARIOS}
    hf = lr.run_job(
        JOB, "transformers", {**base, "root": str(root / "hf"), "report": str(root / "hf.json")}, PYTHON
    )
    extra = {"resumed": True, "async": True}
    tw = lr.run_job(
        JOB,
        "trainwright",
        {**base, **extra, "root": str(root / "tw"), "report": str(root / "tw.json")},
        PYTHON,
    )
    return {"transformers": hf, "trainwright": tw}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_gliner_trains_on_trainwright_as_on_transformers(runs, scenario):
    hf, tw = runs["transformers"][scenario], runs["trainwright"][scenario]
    assert hf["base"] == "transformers.trainer" and tw["base"] == "trainwright.loop.trainer"
    lr.assert_same_history(hf["history"], tw["history"])
    assert sum("eval_loss" in row for row in tw["history"]) == 2
    lr.assert_same_files(hf["files"], tw["files"], set())


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_gliner_writes_the_weight_file_it_writes_on_transformers_5(runs, scenario):
    # GLiNER's _save asks getattr(args, "save_safetensors", False): transformers 5 has no such field
    files = runs["trainwright"][scenario]["files"]
    for folder in (".", "checkpoint-2", "checkpoint-4"):
        assert "pytorch_model.bin" in files[folder] and "model.safetensors" not in files[folder], folder


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_gliner_loads_what_trainwright_saved(runs, scenario):
    tw = runs["trainwright"][scenario]
    assert tw["loads_back"] == {scenario: True, "checkpoint-4": True}, tw["loads_back"]
    assert tw["predicted"] > 0  # the probe's predictions are compared, not two empty lists


def test_resume_and_background_checkpoints_keep_trainwrights_guarantees(runs):
    tw = runs["trainwright"]["gliner"]
    assert tw["resume_exact"], "a resume from checkpoint-2 did not end on the uninterrupted weights"
    assert tw["async_same_bytes"], "a background checkpoint's files differ from the synchronous one's"


def test_a_killed_run_resumes_bit_exact_in_a_new_process(runs, tmp_path):
    proc, resumed, output = lr.interrupted(JOB, tmp_path, "gliner", signal.SIGKILL, python=PYTHON)
    assert proc.returncode == -signal.SIGKILL, output[-3000:]
    assert resumed["global_step"] == 4
    lr.same_weights(resumed["weights_file"], runs["trainwright"]["gliner"]["weights_file"])


def test_a_run_stopped_by_sigterm_saves_and_resumes_bit_exact(runs, tmp_path):
    proc, resumed, output = lr.interrupted(JOB, tmp_path, "gliner", signal.SIGTERM, python=PYTHON)
    assert proc.returncode == 0, output[-3000:]  # the preemption save, then a clean exit
    assert "SAVED 3" in output  # the step in progress when the signal came
    assert os.path.isfile(tmp_path / "run" / "gliner" / "checkpoint-3" / "pytorch_model.bin")
    assert resumed["global_step"] == 4
    lr.same_weights(resumed["weights_file"], runs["trainwright"]["gliner"]["weights_file"])
