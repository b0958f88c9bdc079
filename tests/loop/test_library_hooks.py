"""What TRL's trainers lean on in the Trainer, beside transformers.Trainer: the evaluation of a trainer
without label names (the reward trainer's), the model's outputs under mixed precision, an accelerator
put on the trainer, `_get_output_dir` and `_load_optimizer_and_scheduler` (GRPO's entropy controller
keeps its state in the checkpoint through them)."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch
from conftest import RegressionDataset, RegressionModel
from torch import nn
from torch.utils.data import Dataset

transformers = pytest.importorskip("transformers")

import trainwright  # noqa: E402

LIBRARIES = {"transformers": transformers, "trainwright": trainwright}


class Pairs(Dataset):
    """Preference pairs of 4-vectors: {"chosen": x, "rejected": y}."""

    def __init__(self, n: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.chosen, self.rejected = torch.randn(n, 4, generator=g), torch.randn(n, 4, generator=g)

    def __len__(self) -> int:
        return len(self.chosen)

    def __getitem__(self, i: int) -> dict:
        return {"chosen": self.chosen[i], "rejected": self.rejected[i]}


def chosen_then_rejected(rows: list[dict]) -> dict:
    """A batch's chosen rows, then its rejected rows (as TRL's reward collator)."""
    return {"x": torch.stack([r["chosen"] for r in rows] + [r["rejected"] for r in rows])}


class Scorer(nn.Module):
    """A reward model: one score a row, no loss of its own."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.score = nn.Linear(4, 1)

    def forward(self, x):
        return {"logits": self.score(x)}


def reward_trainer(library: str) -> type:
    """A trainer written as TRL's reward trainer is: its loss from the scores outside the model's
    forward, no label names, a loss all the same."""

    class Reward(LIBRARIES[library].Trainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.can_return_loss, self.label_names = True, []

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(**inputs)
            chosen, rejected = torch.chunk(outputs["logits"].squeeze(-1), chunks=2)
            loss = -nn.functional.logsigmoid(chosen - rejected).mean()
            return (loss, outputs) if return_outputs else loss

    return Reward


def arguments(library: str, out, **kw):
    kw = {
        "output_dir": str(out / library),
        "report_to": "none",
        "use_cpu": True,
        "disable_tqdm": True,
        "remove_unused_columns": False,
        "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 4,
        "save_strategy": "no",
        **kw,
    }
    return LIBRARIES[library].TrainingArguments(**kw)


def rewards(library: str, tmp_path, metrics=None, **kw):
    return reward_trainer(library)(
        model=Scorer(),
        args=arguments(library, tmp_path, **kw),
        train_dataset=Pairs(16),
        eval_dataset=Pairs(8, seed=1),  # whole batches: upstream cuts a last batch's rows as padding
        data_collator=chosen_then_rejected,
        compute_metrics=metrics,
    )


TIMINGS = ("_runtime", "_per_second", "total_flos", "_model_preparation_time")


def comparable(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.endswith(TIMINGS)} for row in history]


# ---------------------------------------------------------------------- no label names
@pytest.mark.parametrize("batch_metrics", [False, True])
def test_compute_metrics_of_a_trainer_without_label_names_gets_its_predictions(tmp_path, batch_metrics):
    """TRL's reward trainer empties `label_names` to have its loss computed: the labels are then an
    empty tuple, not None, so `compute_metrics` is called, on every row's score (chosen and rejected)."""
    got: dict[str, list] = {"transformers": [], "trainwright": []}

    def metrics_of(library):
        def metrics(prediction, compute_result=True):
            got[library].append((prediction.label_ids, torch.as_tensor(prediction.predictions).clone()))
            return {"mean_score": float(torch.as_tensor(prediction.predictions).mean())}

        return metrics

    results = {
        lib: rewards(lib, tmp_path, metrics_of(lib), batch_eval_metrics=batch_metrics).evaluate()
        for lib in LIBRARIES
    }
    theirs, ours = results["transformers"], results["trainwright"]
    assert "eval_mean_score" in theirs, "transformers calls compute_metrics: the check works"
    assert ours["eval_mean_score"] == pytest.approx(theirs["eval_mean_score"], rel=1e-6)
    assert ours["eval_loss"] == pytest.approx(theirs["eval_loss"], rel=1e-6)
    assert len(got["trainwright"]) == len(got["transformers"]) == (2 if batch_metrics else 1)
    for (their_labels, their_scores), (our_labels, our_scores) in zip(
        got["transformers"], got["trainwright"]
    ):
        assert their_labels == our_labels == ()
        torch.testing.assert_close(our_scores, their_scores)


class LossAlways(nn.Module):
    """A model that returns a loss with or without labels."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, input_x, labels=None):
        y = input_x * self.w
        return {"loss": (y**2).mean(), "logits": y}


def test_a_batch_without_its_named_labels_is_predicted_without_a_loss(tmp_path):
    """Label names given, the batch lacks them: no loss, even from a model that can return one (the
    loss without labels is for a trainer without label names)."""
    metrics = {}
    for lib in LIBRARIES:
        args = arguments(lib, tmp_path, label_names=["labels"])
        trainer = LIBRARIES[lib].Trainer(model=LossAlways(), args=args)
        trainer.can_return_loss = True
        metrics[lib] = trainer.evaluate(RegressionDataset(length=8, label_names=[]))
    assert "eval_loss" not in metrics["transformers"], "transformers computes no loss: the check works"
    assert comparable([metrics["trainwright"]]) == comparable([metrics["transformers"]])


# ---------------------------------------------------------------------- mixed precision
def test_a_loss_computed_from_the_outputs_runs_on_float32_under_bf16(tmp_path):
    """bf16: the model's outputs come back as float32 (accelerate's prepared forward), so a loss a
    trainer computes from them (the reward trainer's log-sigmoid) is transformers', step by step, in
    training, in its evaluations and in an evaluation after it."""
    runs = {}
    for lib in LIBRARIES:
        trainer = rewards(
            lib,
            tmp_path,
            bf16=True,
            max_steps=6,
            logging_steps=1,
            eval_strategy="steps",
            eval_steps=3,
            learning_rate=0.05,
        )
        trainer.train()
        runs[lib] = (comparable(trainer.state.log_history), trainer.evaluate()["eval_loss"])
    (theirs, their_eval), (ours, our_eval) = runs["transformers"], runs["trainwright"]
    assert len(ours) == len(theirs)
    for a, b in zip(theirs, ours):
        assert b.keys() == a.keys()
        for key, value in a.items():
            assert b[key] == pytest.approx(value, rel=1e-6), (a["step"], key)
    assert our_eval == pytest.approx(their_eval, rel=1e-6)


# ---------------------------------------------------------------------- the accelerator
@pytest.mark.parametrize("library", list(LIBRARIES))
def test_an_accelerator_put_on_the_trainer_is_the_one_read(tmp_path, library):
    """Upstream's `accelerator` is an attribute: TRL's tests put a stand-in on a trainer made with
    `object.__new__`, a library may replace it on a built one."""
    cls = LIBRARIES[library].Trainer
    stand_in = SimpleNamespace(device=torch.device("cpu"), gather=lambda t: t)
    bare = object.__new__(cls)
    bare.accelerator = stand_in
    assert bare.accelerator is stand_in
    trainer = cls(model=RegressionModel(), args=arguments(library, tmp_path))
    trainer.accelerator = stand_in
    assert trainer.accelerator is stand_in


# ---------------------------------------------------------------------- checkpoint hooks
def controlled(library: str, skip_optimizer: bool = False) -> type:
    """A trainer with state of its own in each checkpoint, as TRL's GRPO keeps its entropy
    controller's: written beside the checkpoint's files, read back by `_load_optimizer_and_scheduler`."""

    class Controlled(LIBRARIES[library].Trainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.coef, self.loaded = 1.0, []

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            if model.training:
                self.coef += 1.0  # a controller's state, moved every step
            return loss * self.coef if not return_outputs else (loss[0] * self.coef, loss[1])

        def _save_checkpoint(self, model, trial):
            super()._save_checkpoint(model, trial)
            folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
            with open(os.path.join(folder, "controller.json"), "w") as f:
                json.dump({"coef": self.coef}, f)

        def _load_optimizer_and_scheduler(self, checkpoint):
            self.loaded.append(checkpoint)
            if not skip_optimizer:
                super()._load_optimizer_and_scheduler(checkpoint)
            if checkpoint is not None:
                with open(os.path.join(checkpoint, "controller.json")) as f:
                    self.coef = json.load(f)["coef"]

    return Controlled


def controlled_run(library: str, out, skip_optimizer: bool = False, resume: str | None = None):
    args = arguments(
        library, out, max_steps=4, save_strategy="steps", save_steps=2, logging_steps=1, learning_rate=0.05
    )
    trainer = controlled(library, skip_optimizer)(
        model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=32)
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


@pytest.mark.parametrize("skip_optimizer", [False, True], ids=["super", "no_super"])
def test_a_subclass_loads_its_own_checkpoint_state_in_load_optimizer_and_scheduler(tmp_path, skip_optimizer):
    """The override is called at a resume, with the checkpoint; its super() loads the optimizer and
    the schedule, and without that call they start anew, as upstream. Its own file is in every
    checkpoint, written where `_get_output_dir` says."""
    rows, calls = {}, {}
    for lib in LIBRARIES:
        first = controlled_run(lib, tmp_path)
        assert first.loaded == []  # no checkpoint: not called
        assert first._get_output_dir(None) == first.args.output_dir
        checkpoint = os.path.join(first.args.output_dir, "checkpoint-2")
        assert all(
            os.path.isfile(os.path.join(first.args.output_dir, c, "controller.json"))
            for c in ("checkpoint-2", "checkpoint-4")
        )
        again = controlled_run(lib, tmp_path / "again", skip_optimizer, resume=checkpoint)
        calls[lib] = [os.path.basename(c) for c in again.loaded]
        # train_loss after a resume: trainwright's is over every step of the run (docs/compatibility.md)
        rows[lib] = [
            {k: v for k, v in r.items() if k != "train_loss"} for r in comparable(again.state.log_history)
        ]
    assert calls["trainwright"] == calls["transformers"] == ["checkpoint-2"]
    assert len(rows["trainwright"]) == len(rows["transformers"])
    for a, b in zip(rows["transformers"], rows["trainwright"]):
        assert b.keys() == a.keys()
        for key, value in a.items():
            assert b[key] == pytest.approx(value, rel=1e-5), (a.get("step"), key)


@pytest.mark.parametrize("library", list(LIBRARIES))
def test_get_output_dir_overridden_moves_the_checkpoints(tmp_path, library):
    class Elsewhere(LIBRARIES[library].Trainer):
        def _get_output_dir(self, trial):
            return os.path.join(self.args.output_dir, "elsewhere")

    args = arguments(library, tmp_path, max_steps=2, save_strategy="steps", save_steps=2)
    Elsewhere(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=16)).train()
    assert os.path.isdir(os.path.join(args.output_dir, "elsewhere", "checkpoint-2"))
    assert not os.path.isdir(os.path.join(args.output_dir, "checkpoint-2"))
