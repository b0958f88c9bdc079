"""TRL's own training scripts (trl/scripts/sft.py, dpo.py, reward.py, grpo.py, kto.py, rloo.py), unchanged,
run with `python SCRIPT ARGS` (transformers) and with `trainwright run SCRIPT ARGS` (trainwright) on a
tiny Llama and local data: TRL parses its configs with its own copy of transformers' argument parser,
which has to read trainwright's argument fields. Each script's logged rows equal transformers', and
(SFT, GRPO) a run resumed from checkpoint-2 with `--resume_from_checkpoint` ends on the uninterrupted
weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from kit import ecosystem as eco
from kit import library_runs as lr
from safetensors.torch import load_file

trl = pytest.importorskip("trl")

SCRIPTS = ["sft", "dpo", "reward", "grpo", "kto", "rloo"]
RESUMED = ("sft", "grpo")  # every trainer's resume is checked in process by test_trl.py
COMMON = [
    "--max_steps", "4", "--per_device_train_batch_size", "4", "--logging_steps", "1", "--save_steps", "2",
    "--report_to", "none", "--use_cpu", "true", "--bf16", "false", "--seed", "5", "--disable_tqdm", "true",
    "--save_only_model", "false",
]  # fmt: skip
# per script: (its data, its own arguments)
EXTRA = {
    "sft": ("completions", ["--eval_strategy", "steps", "--eval_steps", "2", "--per_device_eval_batch_size", "4"]),
    "dpo": ("preferences", ["--eval_strategy", "steps", "--eval_steps", "2", "--per_device_eval_batch_size", "4"]),
    "reward": ("preferences", []),
    "grpo": ("prompts", ["--reward_funcs", "kit.ecosystem.reward_len", "--num_generations", "4",
                         "--max_completion_length", "8"]),
    "kto": ("kto", []),
    "rloo": ("prompts", ["--reward_funcs", "kit.ecosystem.reward_len", "--num_generations", "4",
                         "--max_completion_length", "8", "--beta", "0.0"]),
}  # fmt: skip


def _write_split(folder: str, name: str, rows) -> None:
    with open(os.path.join(folder, f"{name}.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    """A tiny Llama and a one-label Llama classifier saved with the tokenizer; each script's data as
    train/test JSON lines in a folder (what `load_dataset(folder)` reads)."""
    root = tmp_path_factory.mktemp("trl_inputs")
    tok = eco.tokenizer(str(root / "tokenizer"))
    paths = {"model": str(root / "model"), "classifier": str(root / "classifier")}
    eco.llama(tok).save_pretrained(paths["model"])
    eco.llama_classifier(tok).save_pretrained(paths["classifier"])
    for folder in (paths["model"], paths["classifier"]):
        tok.save_pretrained(folder)
    kto = [
        {"prompt": r["prompt"], "completion": r[side], "label": side == "chosen"}
        for r in eco.preferences()
        for side in ("chosen", "rejected")
    ]
    data = {
        "completions": (eco.completions(), eco.completions(8, 9)),
        "preferences": (eco.preferences(), eco.preferences(8, 9)),
        "prompts": (eco.prompts(), eco.prompts(8, 9)),
        "kto": (kto, kto[:8]),
    }
    for name, (train, test) in data.items():
        folder = str(root / name)
        os.makedirs(folder)
        _write_split(folder, "train", train)
        _write_split(folder, "test", test)
        paths[name] = folder
    return paths


def _run(script: str, library: str, out: str, inputs: dict, *extra: str) -> subprocess.CompletedProcess:
    path = os.path.join(os.path.dirname(trl.__file__), "scripts", f"{script}.py")
    data, own = EXTRA[script]
    model = inputs["classifier" if script == "reward" else "model"]
    args = ["--model_name_or_path", model, "--dataset_name", inputs[data], "--output_dir", out, *COMMON, *own]
    proc = subprocess.run(
        [*lr.command(path, library), *args, *extra], capture_output=True, text=True, timeout=600, env=lr.env()
    )
    assert proc.returncode == 0, f"{script} on {library} failed ({proc.returncode}):\n{proc.stderr[-5000:]}"
    return proc


def _history(out: str) -> list[dict]:
    with open(os.path.join(out, "checkpoint-4", "trainer_state.json")) as f:
        return json.load(f)["log_history"]


def _weights(out: str) -> dict:
    return load_file(os.path.join(out, "model.safetensors"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_trls_script_runs_on_trainwright_as_on_transformers_and_resumes_exactly(tmp_path, inputs, script):
    _run(script, "transformers", str(tmp_path / "hf"), inputs)
    _run(script, "trainwright", str(tmp_path / "tw"), inputs)
    lr.assert_same_history(_history(str(tmp_path / "hf")), _history(str(tmp_path / "tw")))
    if script not in RESUMED:
        return
    resumed = str(tmp_path / "resumed")
    _run(
        script,
        "trainwright",
        resumed,
        inputs,
        "--resume_from_checkpoint",
        str(tmp_path / "tw" / "checkpoint-2"),
    )
    whole, again = _weights(str(tmp_path / "tw")), _weights(resumed)
    assert whole.keys() == again.keys() and all((whole[k] == again[k]).all() for k in whole), script


def test_trls_cli_relaunched_through_accelerate_trains_on_trainwright(tmp_path, inputs):
    """`trl sft ...` re-launches TRL's script through `accelerate launch` in a new Python process;
    under `trainwright run trl sft ...` that process trains on trainwright too (its checkpoints carry
    trainwright's manifest), and logs what `trl sft` on transformers logs."""
    bin_dir = os.path.dirname(sys.executable)
    env = {**lr.env(), "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")])}
    data, own = EXTRA["sft"]
    args = ["sft", "--model_name_or_path", inputs["model"], "--dataset_name", inputs[data], *COMMON, *own]
    runs = {
        "transformers": [os.path.join(bin_dir, "trl")],
        "trainwright": [sys.executable, "-m", "trainwright", "run", "trl"],
    }
    for library, command in runs.items():
        out = str(tmp_path / library)
        proc = subprocess.run(
            [*command, *args, "--output_dir", out], capture_output=True, text=True, timeout=600, env=env
        )
        assert proc.returncode == 0, f"trl sft on {library} failed:\n{proc.stderr[-5000:]}"
    ours = tmp_path / "trainwright" / "checkpoint-2"
    assert (ours / "checkpoint_complete.json").is_file() and (ours / "data_state.json").is_file()
    assert not (tmp_path / "transformers" / "checkpoint-2" / "data_state.json").exists()
    lr.assert_same_history(_history(str(tmp_path / "transformers")), _history(str(tmp_path / "trainwright")))
