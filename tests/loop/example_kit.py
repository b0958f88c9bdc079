"""Shared parts of the example-script scenarios (test_examples_*.py): what transformers' official
example scripts (run_clm.py, run_mlm.py, run_glue.py, run_ner.py, run_summarization.py) have in
common, and the checks of what every such run leaves behind.

Each scenario is a small script `main(argv)`: argument dataclasses parsed with `HfArgumentParser`
together with the training arguments from a command line, `get_last_checkpoint`, a model and
tokenizer loaded with `Auto*.from_pretrained` from a local folder (a tiny model saved from a config,
the offline-trained tokenizer), tokenization with `Dataset.map` on in-memory data, train / evaluate /
predict, `log_metrics` / `save_metrics` / `save_state`, and `create_model_card(**kwargs)` at the end.
The Trainer family comes from trainwright, everything else from transformers / datasets.
"""

import json
import math
import os
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import numpy as np
import pytest
from kit.hf import build_model

from trainwright import HfArgumentParser, Trainer, TrainingArguments, get_last_checkpoint, set_seed


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


# --------------------------------------------------------------------------- argument dataclasses
@dataclass
class ModelArguments:
    model_name_or_path: str = field(metadata={"help": "Local folder of a pretrained model and tokenizer."})
    config_name: Optional[str] = field(
        default=None, metadata={"help": "Config name or path, if not the model's."}
    )
    tokenizer_name: Optional[str] = field(default=None, metadata={"help": "Tokenizer name or path."})
    use_fast_tokenizer: bool = field(default=True, metadata={"help": "Use a fast tokenizer."})


@dataclass
class DataTrainingArguments:
    max_seq_length: Optional[int] = field(default=None, metadata={"help": "Truncate inputs to this length."})
    block_size: Optional[int] = field(default=None, metadata={"help": "Causal/masked LM: chunk length."})
    max_train_samples: Optional[int] = field(default=None, metadata={"help": "Keep this many training rows."})
    max_eval_samples: Optional[int] = field(default=None, metadata={"help": "Keep this many eval rows."})
    max_predict_samples: Optional[int] = field(default=None, metadata={"help": "Keep this many test rows."})
    pad_to_max_length: bool = field(default=False, metadata={"help": "Pad at tokenization (else per batch)."})
    mlm_probability: float = field(default=0.15, metadata={"help": "Share of tokens masked for MLM."})
    label_all_tokens: bool = field(default=False, metadata={"help": "NER: label every sub-token."})
    max_source_length: int = field(default=48, metadata={"help": "Summarization: source length."})
    max_target_length: int = field(default=16, metadata={"help": "Summarization: target length."})
    val_max_target_length: Optional[int] = field(default=None, metadata={"help": "Target length for eval."})
    num_beams: Optional[int] = field(default=None, metadata={"help": "Beams for evaluate/predict."})


# --------------------------------------------------------------------------- the scripts' shared steps
def detect_last_checkpoint(training_args) -> Optional[str]:
    """The v4 example scripts' preamble: resume from the newest checkpoint of a used output_dir."""
    last_checkpoint = None
    out = training_args.output_dir
    if os.path.isdir(out) and training_args.do_train and not training_args.overwrite_output_dir:
        last_checkpoint = get_last_checkpoint(out)
        if last_checkpoint is None and len(os.listdir(out)) > 0:
            raise ValueError(f"Output directory ({out}) already exists and is not empty.")
    return last_checkpoint


def argmax_logits(logits, labels):
    """preprocess_logits_for_metrics of the LM examples: keep token ids, not the vocabulary logits."""
    if isinstance(logits, tuple):
        logits = logits[0]
    return logits.argmax(dim=-1)


def token_accuracy(preds: np.ndarray, labels: np.ndarray) -> float:
    mask = labels != -100
    return float((preds[mask] == labels[mask]).mean())


class Script(NamedTuple):
    """What a script has after its preamble: its parsed arguments and the checkpoint to resume."""

    model_args: ModelArguments
    data_args: DataTrainingArguments
    training_args: TrainingArguments
    last_checkpoint: Optional[str]


def start(argv: list[str], args_class=TrainingArguments) -> Script:
    """The start of every example: parse the command line, find the checkpoint to resume, seed."""
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, args_class))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    last_checkpoint = detect_last_checkpoint(training_args)
    set_seed(training_args.seed)
    return Script(model_args, data_args, training_args, last_checkpoint)


def train_and_evaluate(
    script: Script,
    model,
    tokenizer,
    train_dataset,
    eval_dataset,
    data_collator,
    compute_metrics,
    trainer_class=Trainer,
    language_model: bool = False,
    eval_kwargs: Optional[dict] = None,
):
    """The shared middle of every example: build the trainer, train (resuming), save, metrics,
    state, evaluate and log the eval metrics. A language model keeps token ids rather than
    vocabulary logits for its metrics, and reports perplexity."""
    training_args = script.training_args
    trainer = trainer_class(
        model=model,
        args=training_args,
        train_dataset=train_dataset if training_args.do_train else None,
        eval_dataset=eval_dataset if training_args.do_eval else None,
        processing_class=tokenizer,
        data_collator=data_collator,
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=argmax_logits if language_model else None,
    )
    results = {}
    if training_args.do_train:
        checkpoint = training_args.resume_from_checkpoint or script.last_checkpoint
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model()  # saves the tokenizer too
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
        results["train"] = metrics
    if training_args.do_eval:
        metrics = trainer.evaluate(**(eval_kwargs or {}))
        metrics["eval_samples"] = len(eval_dataset)
        if language_model:
            metrics["perplexity"] = math.exp(metrics["eval_loss"])
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
        results["eval"] = metrics
    return trainer, results


def predict_and_log(trainer, predict_dataset, **kwargs):
    """Predict on the test split and log / save its metrics as `predict_*`."""
    output = trainer.predict(predict_dataset, metric_key_prefix="predict", **kwargs)
    output.metrics["predict_samples"] = len(predict_dataset)
    trainer.log_metrics("predict", output.metrics)
    trainer.save_metrics("predict", output.metrics)
    return output


# --------------------------------------------------------------------------- fixtures and checks
class _Pretrained(dict):
    """name -> local folder, each saved on first use (a module builds only the models it runs)."""

    def __init__(self, root, tokenizer) -> None:
        super().__init__()
        self.root, self.tokenizer = root, tokenizer

    def __missing__(self, name: str) -> str:
        path = str(self.root / name)
        build_model(name, self.tokenizer).save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        self[name] = path
        return path


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, tokenizer):
    """Local 'pretrained' folders (model + tokenizer) as the scripts' --model_name_or_path."""
    return _Pretrained(tmp_path_factory.mktemp("pretrained"), tokenizer)


def common_argv(model_path: str, out: str, *extra: str) -> list[str]:
    return [
        "--model_name_or_path",
        model_path,
        "--output_dir",
        out,
        "--do_train",
        "--do_eval",
        "--per_device_train_batch_size",
        "4",
        "--per_device_eval_batch_size",
        "8",
        "--learning_rate",
        "5e-3",
        "--num_train_epochs",
        "2",
        "--logging_steps",
        "2",
        "--save_strategy",
        "steps",
        "--save_steps",
        "5",
        "--seed",
        "7",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--use_cpu",
        "true",
        *extra,
    ]


def read_json(*parts: str) -> dict:
    with open(os.path.join(*parts)) as f:
        return json.load(f)


def assert_common_outcomes(result: dict, out: str, model_path: str, n_train: int, eval_keys: set[str]):
    """What every example run leaves: a saved model and tokenizer, metrics files, trainer state,
    a checkpoint get_last_checkpoint finds, a model card; and a training loss that went down."""
    trainer = result["trainer"]
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert os.path.isfile(os.path.join(out, name)), name
    for name in ("train_results.json", "eval_results.json", "all_results.json", "trainer_state.json"):
        assert os.path.isfile(os.path.join(out, name)), name

    train = read_json(out, "train_results.json")
    assert {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss"} <= set(train)
    assert {"total_flos", "epoch", "train_samples"} <= set(train)
    epochs = trainer.args.num_train_epochs
    assert train["train_samples"] == n_train and train["epoch"] == pytest.approx(epochs)
    eval_metrics = read_json(out, "eval_results.json")
    assert {"eval_loss", "eval_runtime", "eval_samples_per_second", "epoch"} | eval_keys <= set(eval_metrics)
    assert np.isfinite(eval_metrics["eval_loss"])
    combined = read_json(out, "all_results.json")
    assert (
        combined["train_loss"] == train["train_loss"] and combined["eval_loss"] == eval_metrics["eval_loss"]
    )

    state = read_json(out, "trainer_state.json")
    steps = math.ceil(n_train / 4) * epochs
    assert state["global_step"] == trainer.state.global_step == steps
    losses = [row["loss"] for row in state["log_history"] if "loss" in row]
    assert len(losses) >= 3 and all(np.isfinite(losses))
    assert np.mean(losses[-2:]) < np.mean(losses[:2]), f"training loss did not go down: {losses}"
    summary = [row for row in trainer.state.log_history if "train_loss" in row]
    assert len(summary) == 1 and train["train_loss"] == pytest.approx(summary[0]["train_loss"])

    last = get_last_checkpoint(out)
    assert last is not None and os.path.basename(last).startswith("checkpoint-")
    assert os.path.isfile(os.path.join(last, "trainer_state.json"))

    card = os.path.join(out, "README.md")
    assert os.path.isfile(card), "create_model_card wrote no README.md"
    with open(card) as f:
        text = f.read()
    assert model_path in text and "learning_rate" in text
