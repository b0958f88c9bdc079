"""TRL's trainers on trainwright, against the same script on transformers (tests/jobs/trl_job.py run with
`python` and with `python -m trainwright run`): SFT (full, LoRA, packing), DPO (a reference model,
`ref_model=None` from a folder, LoRA), the reward trainer (with a `compute_metrics`; in bf16 over 20
steps), GRPO (generation, a Python reward; a `rollout_func`; the adaptive entropy bonus, whose
controller resumes from the checkpoint), and the other trainers TRL builds on the Trainer (KTO, RLOO,
distillation; ORPO, CPO, GKD).

Each scenario's logged losses and metrics (evaluation included) equal transformers' (relative 1e-5),
the files it leaves are transformers' (plus trainwright's own), and trainwright's guarantees hold
for it: a resume from checkpoint-2 ends on the uninterrupted weights, bit for bit (in the job's
process for every scenario; after SIGKILL to the process group and after SIGTERM, in new processes,
for DPO, GRPO and SFT with LoRA), a background checkpoint is the synchronous one's bytes, and SFT's
accumulation is token-exact.
"""

from __future__ import annotations

import os
import signal

import pytest
from kit import job
from kit import library_runs as lr

pytest.importorskip("trl")
pytest.importorskip("peft")

JOB = job("trl_job.py")
SCENARIOS = ["sft", "sft_lora", "sft_pack", "sft_padding_free", "dpo", "dpo_none", "dpo_lora", "reward"]
SCENARIOS += ["reward_metrics", "reward_bf16", "grpo", "grpo_rollout", "grpo_entropy"]
# the other trainers TRL builds on the Trainer (the last three are experimental): trained only
OTHERS = ["kto", "rloo", "distillation", "orpo", "cpo", "gkd"]


def run_job(library: str, cfg: dict) -> dict:
    return lr.run_job(JOB, library, cfg)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("trl")
    base = {"scenarios": SCENARIOS + OTHERS, "tokenizer": str(root / "tokenizer"), "lifetime": True}
    hf = run_job("transformers", {**base, "root": str(root / "hf"), "report": str(root / "hf.json")})
    extra = {"resumed": True, "async": True, "accumulation": True}
    tw = run_job("trainwright", {**base, **extra, "root": str(root / "tw"), "report": str(root / "tw.json")})
    return {"transformers": hf, "trainwright": tw, "root": root}


@pytest.mark.parametrize("scenario", SCENARIOS + OTHERS)
def test_trl_trainer_runs_on_trainwright_as_on_transformers(runs, scenario):
    hf, tw = runs["transformers"][scenario], runs["trainwright"][scenario]
    assert hf["base"] == "transformers.trainer" and tw["base"] == "trainwright.loop.trainer"
    lr.assert_same_history(hf["history"], tw["history"])
    assert scenario in OTHERS or any("eval_loss" in row for row in tw["history"])
    if scenario == "reward_metrics":  # compute_metrics was called, on every score, without labels
        assert any(row.get("eval_labels") == 0 and "eval_mean_score" in row for row in tw["history"])
    lr.assert_same_files(hf["files"], tw["files"], {"config.json", "generation_config.json"})


@pytest.mark.parametrize("scenario", SCENARIOS + OTHERS)
def test_trl_resume_and_background_checkpoints_keep_trainwrights_guarantees(runs, scenario):
    tw = runs["trainwright"][scenario]
    assert tw["resume_exact"], "a resume from checkpoint-2 did not end on the uninterrupted weights"
    assert tw["async_same_bytes"], "a background checkpoint's files differ from the synchronous one's"


def test_a_finished_sft_trainer_is_freed_at_once_wherever_it_is_on_transformers(runs):
    """`del trainer` frees the model by reference counting wherever transformers.Trainer does (the
    full-model SFT trainer keeps it in a cycle of TRL's own on transformers)."""
    hf, tw = runs["transformers"]["lifetime"], runs["trainwright"]["lifetime"]
    assert hf["sft_lora"], "transformers frees an SFT LoRA trainer's model at once: the check works"
    assert all(tw[scenario] or not hf[scenario] for scenario in hf), (hf, tw)


def test_sft_accumulation_is_token_exact(runs):
    report = runs["trainwright"]["accumulation"]
    assert report["losses"][0] == pytest.approx(report["losses"][1], rel=1e-6)
    assert report["max_weight_difference"] < 1e-6


def _interrupted(tmp_path, scenario: str, sig: signal.Signals):
    return lr.interrupted(JOB, tmp_path, scenario, sig, {"tokenizer": str(tmp_path / "tokenizer")})


@pytest.mark.parametrize("scenario", ["dpo", "grpo"])
def test_trl_run_killed_after_a_checkpoint_resumes_bit_exact_in_a_new_process(runs, tmp_path, scenario):
    proc, resumed, output = _interrupted(tmp_path, scenario, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL, output[-3000:]
    assert resumed["global_step"] == 4
    lr.same_weights(resumed["weights_file"], runs["trainwright"][scenario]["weights_file"])


def test_trl_run_stopped_by_sigterm_saves_and_resumes_bit_exact(runs, tmp_path):
    proc, resumed, output = _interrupted(tmp_path, "sft_lora", signal.SIGTERM)
    assert proc.returncode == 0, output[-3000:]  # the preemption save, then a clean exit
    assert "SAVED 3" in output  # the step in progress when the signal came
    assert os.path.isfile(tmp_path / "run" / "sft_lora" / "checkpoint-3" / "adapter_model.safetensors")
    assert resumed["global_step"] == 4
    lr.same_weights(resumed["weights_file"], runs["trainwright"]["sft_lora"]["weights_file"])
