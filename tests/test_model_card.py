"""Trainer.create_model_card: the README.md of a real training run of a tiny transformers model,
checked field by field and against transformers' own TrainingSummary built from the same Trainer."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import yaml
from conftest import RegressionDataset, RegressionModel

from trainwright import Trainer, TrainingArguments
from trainwright.loop.model_card import make_markdown_table, parse_log_history, read_metadata

transformers = pytest.importorskip("transformers")


class TokenDataset(torch.utils.data.Dataset):
    """Random token sequences, labels = inputs (causal LM)."""

    def __init__(self, n: int, seed: int = 0, length: int = 16) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 64, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_gpt2(name_or_path: str | None = None):
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32)
    model = transformers.GPT2LMHeadModel(config)
    if name_or_path is not None:
        model.config._name_or_path = name_or_path  # as from_pretrained("<repo id>") sets it
    return model


def token_accuracy(pred) -> dict:
    logits, labels = pred.predictions, pred.label_ids
    return {"accuracy": float((np.argmax(logits[:, :-1], -1) == labels[:, 1:]).mean())}


def run(tmp_path, name: str = "tiny-run", model=None, train: bool = True, **overrides) -> Trainer:
    args = {
        "output_dir": str(tmp_path / name),
        "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "num_train_epochs": 2,
        "logging_steps": 1,
        "eval_strategy": "steps",
        "eval_steps": 2,
        "save_strategy": "no",
        "warmup_steps": 1,
        "report_to": "none",
        "disable_tqdm": True,
        **overrides,
    }
    trainer = Trainer(
        model=model if model is not None else tiny_gpt2(),
        args=TrainingArguments(**args),
        train_dataset=TokenDataset(24),
        eval_dataset=TokenDataset(8, seed=1),
        compute_metrics=token_accuracy,
    )
    if train:
        trainer.train()
    return trainer


def _rounded(v) -> str:
    return f"{v:.4f}" if isinstance(v, float) and len(str(v).split(".")[1]) > 4 else str(v)


def card_of(trainer: Trainer) -> str:
    with open(os.path.join(trainer.args.output_dir, "README.md"), encoding="utf-8") as f:
        return f.read()


CARD_KWARGS = {
    "language": "en",
    "license": "apache-2.0",
    "tags": ["tiny", "test"],
    "finetuned_from": "org/tiny-base",
    "tasks": "text-generation",
    "dataset_tags": "org/tiny-text",
    "dataset": "Tiny Text",
    "dataset_args": "default",
}


def test_card_equals_transformers_training_summary(tmp_path, monkeypatch):
    """Everything but the framework versions is what transformers writes for the same run."""
    from transformers import modelcard

    from trainwright.core.enums import ParallelMode

    # upstream compares args.parallel_mode with its own (plain) Enum members: give it ours
    monkeypatch.setattr(modelcard, "ParallelMode", ParallelMode)
    trainer = run(tmp_path)
    trainer.create_model_card(**CARD_KWARGS)
    ours = card_of(trainer)
    theirs = modelcard.TrainingSummary.from_trainer(
        trainer, **{**CARD_KWARGS, "tags": ["tiny", "test"]}
    ).to_model_card()
    versions = "\n### Framework versions\n"
    assert ours.split(versions)[0] == theirs.split(versions)[0]
    assert "- Pytorch " + torch.__version__ in ours and "- Transformers " + transformers.__version__ in ours
    assert "- trainwright " in ours


def test_metadata_results_table_and_hyperparameters(tmp_path):
    trainer = run(tmp_path, max_grad_norm=1.0, label_smoothing_factor=0.1)
    trainer.create_model_card(**CARD_KWARGS)
    card = card_of(trainer)
    meta = read_metadata(os.path.join(trainer.args.output_dir, "README.md"))
    assert meta == yaml.safe_load(card.split("---\n")[1])
    history = trainer.state.log_history
    evals = [row for row in history if "eval_loss" in row]
    last = evals[-1]
    assert meta["library_name"] == "transformers" and meta["base_model"] == "org/tiny-base"
    assert meta["language"] == ["en"] and meta["license"] == "apache-2.0"
    assert meta["tags"] == ["tiny", "test", "generated_from_trainer"]
    assert meta["datasets"] == ["org/tiny-text"] and meta["metrics"] == ["accuracy"]
    (index,) = meta["model-index"]
    assert index["name"] == "tiny-run"
    assert index["results"] == [
        {
            "task": {"name": "Causal Language Modeling", "type": "text-generation"},
            "dataset": {"name": "Tiny Text", "type": "org/tiny-text", "args": "default"},
            "metrics": [{"name": "Accuracy", "type": "accuracy", "value": last["eval_accuracy"]}],
        }
    ]
    assert (
        "fine-tuned version of [org/tiny-base](https://huggingface.co/org/tiny-base) on the Tiny Text" in card
    )
    assert f"- Loss: {last['eval_loss']:.4f}" in card

    # one results row per evaluation: the last training loss logged before it, epoch, step, metrics
    table = card.split("### Training results\n\n")[1].split("\n\n")[0].splitlines()
    assert [c.strip() for c in table[0].strip("|").split("|")] == [
        "Training Loss",
        "Epoch",
        "Step",
        "Accuracy",  # in the order of the logged row (compute_metrics' keys come before eval_loss)
        "Validation Loss",
    ]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table[2:]]
    assert len(rows) == len(evals) == 3  # 24 samples / 8 per step: 3 steps per epoch, 2 epochs, every 2
    for row, ev in zip(rows, evals):
        loss = [r["loss"] for r in history[: history.index(ev)] if "loss" in r][-1]
        expected = [loss, ev["epoch"], ev["step"], ev["eval_accuracy"], ev["eval_loss"]]
        assert row == [_rounded(v) for v in expected]

    hp = dict(
        line[2:].split(": ", 1)
        for line in card.split("used during training:\n")[1].split("\n\n")[0].splitlines()
        if line.startswith("- ")
    )
    assert hp == {
        "learning_rate": "5e-05",
        "train_batch_size": "4",
        "eval_batch_size": "4",
        "seed": "42",
        "gradient_accumulation_steps": "2",
        "total_train_batch_size": "8",
        "optimizer": f"Use {trainer.args.optim} with betas=(0.9,0.999) and epsilon=1e-08 and "
        "optimizer_args=No additional optimizer arguments",
        "lr_scheduler_type": "linear",
        "lr_scheduler_warmup_steps": "1",
        "num_epochs": "2",
        "label_smoothing_factor": "0.1",
    }


def test_defaults_from_the_trainer(tmp_path):
    """Without arguments: trained from scratch (a config-built model), task from the model class,
    name from output_dir, the generated_from_trainer tag, no license."""
    trainer = run(tmp_path, name="scratch", max_steps=2, eval_strategy="no")
    trainer.create_model_card()
    card, meta = card_of(trainer), read_metadata(os.path.join(trainer.args.output_dir, "README.md"))
    assert "This model was trained from scratch on an unknown dataset." in card
    assert "base_model" not in meta and "license" not in meta and "datasets" not in meta
    assert meta["tags"] == ["generated_from_trainer"]
    assert meta["model-index"] == [{"name": "scratch", "results": []}]
    assert "- training_steps: 2" in card and "num_epochs" not in card
    assert "### Training results\n\n\n" in card  # no evaluation: an empty table, as upstream

    # the base model defaults to the checkpoint the model was loaded from (a Hub id, not a folder)
    trainer = run(tmp_path, name="tuned", model=tiny_gpt2("org/tiny-base"), max_steps=2, eval_strategy="no")
    trainer.create_model_card(model_name="my-model", dataset="wiki", dataset_tags="wikitext")
    meta = read_metadata(os.path.join(trainer.args.output_dir, "README.md"))
    assert meta["base_model"] == "org/tiny-base" and meta["model-index"][0]["name"] == "my-model"
    assert "# my-model" in card_of(trainer)


def test_existing_card_tags_are_kept_when_tags_are_given(tmp_path):
    trainer = run(tmp_path, train=False)
    path = os.path.join(trainer.args.output_dir, "README.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("---\nlibrary_name: transformers\ntags:\n- earlier\n- tiny\n---\n# old card\n")
    trainer.create_model_card(tags="tiny")
    assert read_metadata(path)["tags"] == ["tiny", "earlier", "generated_from_trainer"]
    trainer.create_model_card()  # no tags given: the default tag only (upstream)
    assert read_metadata(path)["tags"] == ["generated_from_trainer"]


def test_plain_torch_model_names_no_library_and_only_main_process_writes(tmp_path, monkeypatch):
    args = TrainingArguments(
        output_dir=str(tmp_path / "reg"), max_steps=3, report_to="none", disable_tqdm=True, fp16=False
    )
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=16))
    trainer.train()
    trainer.create_model_card()
    meta = read_metadata(os.path.join(args.output_dir, "README.md"))
    assert "library_name" not in meta  # transformers cannot load a plain nn.Module
    os.remove(os.path.join(args.output_dir, "README.md"))
    monkeypatch.setattr(trainer, "is_world_process_zero", lambda: False)
    trainer.create_model_card()
    assert not os.path.exists(os.path.join(args.output_dir, "README.md"))


def test_parse_log_history_and_table_edge_cases():
    assert parse_log_history([]) == (None, None, None)
    only_eval = [{"eval_loss": 1.0, "eval_runtime": 0.1, "epoch": 0.0, "step": 0}]
    assert parse_log_history(only_eval) == (None, None, only_eval[0])
    history = [
        {"eval_loss": 2.0, "eval_f1": 0.5, "eval_runtime": 0.1, "epoch": 0.0, "step": 0},
        {"loss": 1.5, "epoch": 1.0, "step": 5},
        {"train_runtime": 3.0, "train_loss": 1.5, "epoch": 1.0, "step": 5},
    ]
    train_log, lines, results = parse_log_history(history)
    assert train_log is history[2]
    assert lines == [{"Training Loss": "No log", "Epoch": 0.0, "Step": 0, "Validation Loss": 2.0, "F1": 0.5}]
    assert results == {"Loss": 2.0, "F1": 0.5}
    assert make_markdown_table([]) == ""
    assert make_markdown_table([{"A": 0.123456, "Long name": 1}]).splitlines() == [
        "| A      | Long name |",
        "|:------:|:---------:|",
        "| 0.1235 | 1         |",
    ]


def test_dataset_named_by_a_hub_datasets_dataset(tmp_path, monkeypatch):
    """A `datasets` dataset from a Hub builder names the dataset, its config and split, as upstream;
    an in-memory one (no builder) names none (upstream writes "the None dataset")."""
    datasets = pytest.importorskip("datasets")
    from transformers import modelcard

    from trainwright.core.enums import ParallelMode

    monkeypatch.setattr(modelcard, "ParallelMode", ParallelMode)
    rows = {"input_ids": TokenDataset(8, seed=1).ids.tolist()}
    rows["labels"] = rows["input_ids"]
    info = datasets.DatasetInfo(builder_name="tiny_text", config_name="small")
    # a base model: upstream's card for a config-built one reads "fine-tuned version of []"
    trainer = run(tmp_path, max_steps=2, model=tiny_gpt2("org/tiny-base"))
    trainer.eval_dataset = datasets.Dataset.from_dict(rows, info=info, split="validation")
    trainer.evaluate()
    trainer.create_model_card(tasks="text-generation", license="mit")
    meta = read_metadata(os.path.join(trainer.args.output_dir, "README.md"))
    assert meta["datasets"] == ["tiny_text"]
    assert meta["model-index"][0]["results"][0]["dataset"] == {
        "name": "tiny_text",
        "type": "tiny_text",
        "config": "small",
        "split": "validation",
        "args": "small",
    }
    theirs = modelcard.TrainingSummary.from_trainer(
        trainer, tasks="text-generation", license="mit"
    ).to_model_card()
    versions = "\n### Framework versions\n"
    assert card_of(trainer).split(versions)[0] == theirs.split(versions)[0]

    trainer.eval_dataset = datasets.Dataset.from_dict(rows)
    trainer.create_model_card()
    assert "(https://huggingface.co/org/tiny-base) on an unknown dataset." in card_of(trainer)
