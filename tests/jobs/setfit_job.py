"""setfit's few-shot classifier training on a tiny offline body, as its users write it (only setfit and
datasets are imported): run with `python setfit_job.py CFG` it trains on transformers, with
`python -m trainwright run setfit_job.py CFG` on trainwright (tests/app/test_setfit.py runs both).

setfit fine-tunes the sentence-transformers body on pairs made from the labelled texts (its own
trainer over sentence-transformers' trainer, with its callbacks called through setfit's replacement
of the callback handler's `call_event`), then fits a logistic-regression head. The body is a BERT
built from a config and saved with the word-level tokenizer, loaded by setfit from the folder.

CFG is JSON: {"scenarios": [...], "root": dir, "report": file.json, options}. Scenarios: setfit (the
body trained with checkpoints every 2 steps and an evaluation, a user callback). Reported: the body
trainer's log history, the files written, the events the user callback saw with the model it was
given, the predictions and accuracy, whether setfit loads what was saved. Options as
kit/library_jobs.py's (resumed: the body's trainer resumed from checkpoint-2; async: its checkpoints
written in the background; announce/pause, only_resume).
"""

from __future__ import annotations

import functools
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared kit
import transformers  # noqa: E402
from datasets import Dataset  # noqa: E402
from kit import ecosystem as eco  # noqa: E402
from kit import library_jobs as jobs  # noqa: E402
from setfit import SetFitModel, Trainer, TrainingArguments  # noqa: E402

BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


def body_folder(root: str) -> str:
    folder = os.path.join(root, "models", "bert")
    if not os.path.isdir(folder):
        tok = eco.tokenizer(os.path.join(root, "models", "tokenizer"))
        config = transformers.BertConfig(
            vocab_size=len(tok), max_position_embeddings=64, pad_token_id=tok.pad_token_id, **BERT
        )
        torch.manual_seed(0)
        transformers.BertModel(config).save_pretrained(folder)
        tok.save_pretrained(folder)
    return folder


def texts(n: int, seed: int) -> Dataset:
    """Labelled texts: whether the sum in the question is even."""
    r = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = r.randint(0, 9), r.randint(0, 9)
        rows.append({"text": f"what is {a} plus {b} ?", "label": (a + b) % 2})
    return Dataset.from_list(rows)


class Seen(transformers.TrainerCallback):
    """A user's callback: the events it saw and the model class each was given (setfit hands the
    SetFitModel to its callbacks)."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.models: set[str] = set()

    def _seen(self, event: str, kwargs: dict) -> None:
        self.events.append(event)
        self.models.add(type(kwargs.get("model")).__name__)

    def on_train_begin(self, args, state, control, **kwargs):
        self._seen("on_train_begin", kwargs)

    def on_step_end(self, args, state, control, **kwargs):
        self._seen("on_step_end", kwargs)

    def on_evaluate(self, args, state, control, **kwargs):
        self._seen("on_evaluate", kwargs)

    def on_save(self, args, state, control, **kwargs):
        self._seen("on_save", kwargs)


def accuracy(y_pred, y_test) -> dict:
    """The metric as a function (setfit's default, "accuracy", would be loaded from the Hub)."""
    return {"accuracy": sum(int(a) == int(b) for a, b in zip(y_pred, y_test)) / len(y_test)}


def build(scenario: str, out: str, cfg: dict, **overrides):
    if scenario != "setfit":
        raise ValueError(f"unknown scenario {scenario!r}")
    kw = dict(
        output_dir=out,
        batch_size=4,
        num_iterations=2,
        max_steps=4,
        logging_steps=1,
        save_strategy="steps",
        save_steps=2,
        save_total_limit=None,  # setfit's default keeps one checkpoint
        eval_strategy="steps",
        eval_steps=2,
        seed=5,
        report_to="none",
        show_progress_bar=False,
    )
    kw.update(overrides)
    torch.manual_seed(1)
    model = SetFitModel.from_pretrained(body_folder(cfg["root"]))
    return Trainer(
        model=model,
        args=TrainingArguments(**kw),
        train_dataset=texts(16, 0),
        eval_dataset=texts(8, 9),
        metric=accuracy,
        callbacks=[Seen(), *jobs.callbacks(cfg)],
    )


def probabilities(model, rows: list[str]) -> list[list[float]]:
    return torch.as_tensor(model.predict_proba(rows)).tolist()


def body_weights(trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.model_body.state_dict().items()}


def run_setfit(cfg: dict) -> dict:
    scenario = "setfit"
    out = os.path.join(cfg["root"], scenario)
    trainer = build(scenario, out, cfg)
    if cfg.get("only_resume"):
        resume(trainer, True)
        return {"global_step": trainer.st_trainer.state.global_step, **save_body(trainer, out, "resumed")}
    trainer.train()
    seen = next(cb for cb in trainer.st_trainer.callback_handler.callbacks if isinstance(cb, Seen))
    probe = texts(8, 3)
    report = {
        "base": jobs.trainer_base(trainer.st_trainer),
        "history": trainer.st_trainer.state.log_history,
        "files": jobs.folder_files(out),
        "events": seen.events,
        "callback_models": sorted(seen.models),
        "predictions": probabilities(trainer.model, probe["text"]),
        "metrics": trainer.evaluate(),
        **save_body(trainer, out, "final"),
    }
    saved = os.path.join(cfg["root"], "saved")
    trainer.model.save_pretrained(saved)
    loaded = SetFitModel.from_pretrained(saved)
    report["loads_back"] = probabilities(loaded, probe["text"]) == report["predictions"]
    if cfg.get("resumed"):
        again = build(scenario, out + "_resumed", cfg)
        resume(again, os.path.join(out, "checkpoint-2"))
        report["resume_exact"] = jobs.same_weights(body_weights(again), body_weights(trainer))
    if cfg.get("async"):  # setfit's arguments have no async_save: set on its body trainer's (trainwright's)
        later = build(scenario, out + "_async", cfg)
        later.st_trainer.args.async_save = True
        later.train()
        report["async_same_bytes"] = all(
            jobs.weight_files_equal(os.path.join(out, c), os.path.join(out + "_async", c))
            for c in ("checkpoint-2", "checkpoint-4")
        )
    return report


def resume(trainer, checkpoint) -> None:
    """setfit's train() with its body's trainer resuming `checkpoint` (setfit has no resume argument;
    what it checkpoints is that trainer's run)."""
    trainer.st_trainer.train = functools.partial(trainer.st_trainer.train, resume_from_checkpoint=checkpoint)
    trainer.train()


def save_body(trainer, out: str, tag: str) -> dict:
    path = os.path.join(os.path.dirname(out), f"{os.path.basename(out)}-{tag}-weights.pt")
    torch.save(body_weights(trainer), path)
    return {"weights_file": path}


def run(cfg: dict) -> dict:
    return {"setfit": run_setfit(cfg)} if "setfit" in cfg.get("scenarios", ["setfit"]) else {}


if __name__ == "__main__":
    jobs.main(run)
