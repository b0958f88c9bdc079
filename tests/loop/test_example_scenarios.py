"""End-to-end scenarios that follow transformers' official example scripts (run_clm.py, run_mlm.py,
run_glue.py, run_ner.py, run_summarization.py), written for these tests, with the Trainer family
imported from trainwright and everything else from transformers / datasets.

Each `run_*` function is a small script `main(argv)`: argument dataclasses parsed with
`HfArgumentParser` together with the training arguments from a command line, `get_last_checkpoint`,
a model and tokenizer loaded with `Auto*.from_pretrained` from a local folder (a tiny model saved
from a config, the offline-trained tokenizer), tokenization with `Dataset.map` on in-memory data,
train / evaluate / predict, `log_metrics` / `save_metrics` / `save_state`, and
`create_model_card(**kwargs)` at the end. The tests check what such a run leaves behind.
"""

import json
import math
import os
from dataclasses import dataclass, field
from itertools import chain
from typing import Optional

import numpy as np
import pytest
from kit import hf
from kit.hf import build_model, datasets, text_corpus, transformers

from trainwright import (
    HfArgumentParser,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    Trainer,
    TrainingArguments,
    get_last_checkpoint,
    set_seed,
)

tokenizer, tokenizer_dir = hf.tokenizer, hf.tokenizer_dir  # session fixtures


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
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


def parse(argv: list[str], args_class=TrainingArguments):
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, args_class))
    return parser.parse_args_into_dataclasses(args=argv)


def detect_last_checkpoint(training_args) -> Optional[str]:
    """The v4 example scripts' preamble: resume from the newest checkpoint of a used output_dir."""
    last_checkpoint = None
    out = training_args.output_dir
    if os.path.isdir(out) and training_args.do_train and not training_args.overwrite_output_dir:
        last_checkpoint = get_last_checkpoint(out)
        if last_checkpoint is None and len(os.listdir(out)) > 0:
            raise ValueError(f"Output directory ({out}) already exists and is not empty.")
    return last_checkpoint


def train_evaluate_predict(trainer, training_args, last_checkpoint, train_dataset, eval_dataset):
    """The shared middle of every example: train (resuming), save, metrics, state, evaluate."""
    results = {}
    if training_args.do_train:
        checkpoint = training_args.resume_from_checkpoint or last_checkpoint
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model()  # saves the tokenizer too
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
        results["train"] = metrics
    if training_args.do_eval:
        metrics = trainer.evaluate()
        metrics["eval_samples"] = len(eval_dataset)
        results["eval"] = metrics
    return results


def raw_text_datasets(n_train: int, n_eval: int) -> "datasets.DatasetDict":
    return datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": text_corpus(n_train, seed=10)}),
            "validation": datasets.Dataset.from_dict({"text": text_corpus(n_eval, seed=11)}),
        }
    )


def group_texts_fn(block_size: int, copy_labels: bool):
    def group_texts(examples):
        concatenated = {k: list(chain(*examples[k])) for k in examples}
        total = (len(concatenated[next(iter(examples))]) // block_size) * block_size
        result = {
            k: [t[i : i + block_size] for i in range(0, total, block_size)] for k, t in concatenated.items()
        }
        if copy_labels:
            result["labels"] = result["input_ids"].copy()
        return result

    return group_texts


def token_accuracy(preds: np.ndarray, labels: np.ndarray) -> float:
    mask = labels != -100
    return float((preds[mask] == labels[mask]).mean())


# --------------------------------------------------------------------------- the scripts
def run_clm(argv: list[str]) -> dict:
    model_args, data_args, training_args = parse(argv)
    last_checkpoint = detect_last_checkpoint(training_args)
    set_seed(training_args.seed)
    raw = raw_text_datasets(96, 24)
    config = transformers.AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        model_args.tokenizer_name or model_args.model_name_or_path, use_fast=model_args.use_fast_tokenizer
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, config=config)
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))

    column_names = list(raw["train"].features)
    with training_args.main_process_first(desc="dataset map tokenization"):
        tokenized = raw.map(lambda b: tokenizer(b["text"]), batched=True, remove_columns=column_names)
    block_size = min(data_args.block_size or tokenizer.model_max_length, tokenizer.model_max_length)
    with training_args.main_process_first(desc="grouping texts together"):
        lm = tokenized.map(group_texts_fn(block_size, copy_labels=True), batched=True)
    train_dataset, eval_dataset = lm["train"], lm["validation"]
    if data_args.max_train_samples is not None:
        train_dataset = train_dataset.select(range(min(len(train_dataset), data_args.max_train_samples)))

    def preprocess_logits_for_metrics(logits, labels):
        if isinstance(logits, tuple):
            logits = logits[0]
        return logits.argmax(dim=-1)

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        return {"accuracy": token_accuracy(preds[:, :-1], labels[:, 1:])}

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset if training_args.do_train else None,
        eval_dataset=eval_dataset if training_args.do_eval else None,
        processing_class=tokenizer,
        data_collator=transformers.default_data_collator,
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
    )
    results = train_evaluate_predict(trainer, training_args, last_checkpoint, train_dataset, eval_dataset)
    if training_args.do_eval:
        metrics = results["eval"]
        metrics["perplexity"] = math.exp(metrics["eval_loss"])
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
    kwargs = {"finetuned_from": model_args.model_name_or_path, "tasks": "text-generation"}
    trainer.create_model_card(**kwargs)
    return {"trainer": trainer, "last_checkpoint": last_checkpoint, "block_size": block_size, **results}


def run_mlm(argv: list[str]) -> dict:
    model_args, data_args, training_args = parse(argv)
    last_checkpoint = detect_last_checkpoint(training_args)
    set_seed(training_args.seed)
    raw = raw_text_datasets(96, 24)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = transformers.AutoModelForMaskedLM.from_pretrained(model_args.model_name_or_path)
    max_seq_length = min(data_args.max_seq_length or tokenizer.model_max_length, tokenizer.model_max_length)

    def tokenize_function(examples):
        return tokenizer(examples["text"], return_special_tokens_mask=True)

    with training_args.main_process_first(desc="dataset map tokenization"):
        tokenized = raw.map(tokenize_function, batched=True, remove_columns=["text"])
        grouped = tokenized.map(group_texts_fn(max_seq_length, copy_labels=False), batched=True)
    train_dataset, eval_dataset = grouped["train"], grouped["validation"]

    def preprocess_logits_for_metrics(logits, labels):
        if isinstance(logits, tuple):
            logits = logits[0]
        return logits.argmax(dim=-1)

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        return {"accuracy": token_accuracy(preds, labels)}

    data_collator = transformers.DataCollatorForLanguageModeling(
        tokenizer=tokenizer, mlm_probability=data_args.mlm_probability
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=data_collator,
        compute_metrics=compute_metrics,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
    )
    results = train_evaluate_predict(trainer, training_args, last_checkpoint, train_dataset, eval_dataset)
    if training_args.do_eval:
        metrics = results["eval"]
        metrics["perplexity"] = math.exp(metrics["eval_loss"])
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
    trainer.create_model_card(finetuned_from=model_args.model_name_or_path, tasks="fill-mask")
    return {"trainer": trainer, "last_checkpoint": last_checkpoint, **results}


def glue_like_datasets() -> "datasets.DatasetDict":
    """Sentence pairs (an MRPC-like layout) whose label a tiny model can learn in a few steps: the
    sentences of a positive pair open with "yes", of a negative one with "no"."""

    def split(n, seed):
        texts = text_corpus(2 * n, seed=seed, min_words=4, max_words=12)
        labels = [i % 2 for i in range(n)]
        marks = ["yes " * 4 if y else "no " * 4 for y in labels]
        first = [m + a for m, a in zip(marks, texts[:n])]
        second = [m + b for m, b in zip(marks, texts[n:])]
        return datasets.Dataset.from_dict({"sentence1": first, "sentence2": second, "label": labels})

    return datasets.DatasetDict({"train": split(64, 20), "validation": split(16, 21), "test": split(12, 22)})


def run_glue(argv: list[str]) -> dict:
    model_args, data_args, training_args = parse(argv)
    last_checkpoint = detect_last_checkpoint(training_args)
    set_seed(training_args.seed)
    raw = glue_like_datasets()
    label_list = raw["train"].unique("label")
    label_list.sort()
    num_labels = len(label_list)
    config = transformers.AutoConfig.from_pretrained(
        model_args.model_name_or_path, num_labels=num_labels, finetuning_task="mrpc"
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        model_args.model_name_or_path, config=config
    )
    padding = "max_length" if data_args.pad_to_max_length else False
    max_seq_length = min(data_args.max_seq_length or tokenizer.model_max_length, tokenizer.model_max_length)
    model.config.label2id = {v: i for i, v in enumerate(label_list)}
    model.config.id2label = dict(enumerate(label_list))

    def preprocess_function(examples):
        return tokenizer(
            examples["sentence1"],
            examples["sentence2"],
            padding=padding,
            max_length=max_seq_length,
            truncation=True,
        )

    with training_args.main_process_first(desc="dataset map pre-processing"):
        raw = raw.map(preprocess_function, batched=True)
    train_dataset, eval_dataset, predict_dataset = raw["train"], raw["validation"], raw["test"]
    if data_args.max_predict_samples is not None:
        predict_dataset = predict_dataset.select(range(data_args.max_predict_samples))

    def compute_metrics(p):
        preds = np.argmax(p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions, axis=1)
        return {"accuracy": float((preds == p.label_ids).mean())}

    data_collator = (
        transformers.default_data_collator
        if data_args.pad_to_max_length
        else transformers.DataCollatorWithPadding(
            tokenizer, pad_to_multiple_of=8 if training_args.fp16 else None
        )
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        compute_metrics=compute_metrics,
        processing_class=tokenizer,
        data_collator=data_collator,
    )
    results = train_evaluate_predict(trainer, training_args, last_checkpoint, train_dataset, eval_dataset)
    if training_args.do_eval:
        trainer.log_metrics("eval", results["eval"])
        trainer.save_metrics("eval", results["eval"])
    if training_args.do_predict:
        predict_dataset = predict_dataset.remove_columns("label")
        predictions = trainer.predict(predict_dataset, metric_key_prefix="predict").predictions
        results["predictions"] = predictions
        predictions = np.argmax(predictions, axis=1)
        output_predict_file = os.path.join(training_args.output_dir, "predict_results_mrpc.txt")
        if trainer.is_world_process_zero():
            with open(output_predict_file, "w") as writer:
                writer.write("index\tprediction\n")
                for index, item in enumerate(predictions):
                    writer.write(f"{index}\t{model.config.id2label[int(item)]}\n")
    trainer.create_model_card(
        finetuned_from=model_args.model_name_or_path,
        tasks="text-classification",
        language="en",
        dataset="mrpc",
    )
    return {
        "trainer": trainer,
        "last_checkpoint": last_checkpoint,
        "n_predict": len(predict_dataset),
        **results,
    }


TAGS = ["O", "B-SHORT", "I-SHORT", "B-LONG", "I-LONG"]


def ner_datasets() -> "datasets.DatasetDict":
    def split(n, seed):
        words = [t.split() for t in text_corpus(n, seed=seed)]
        tags = [[(1 if len(w) <= 3 else 3) if len(w) % 2 else 0 for w in ws] for ws in words]
        return datasets.Dataset.from_dict({"tokens": words, "ner_tags": tags})

    return datasets.DatasetDict({"train": split(64, 30), "validation": split(16, 31), "test": split(12, 32)})


def run_ner(argv: list[str]) -> dict:
    model_args, data_args, training_args = parse(argv)
    last_checkpoint = detect_last_checkpoint(training_args)
    set_seed(training_args.seed)
    raw = ner_datasets()
    label_list = TAGS
    label_to_id = {label: i for i, label in enumerate(label_list)}
    config = transformers.AutoConfig.from_pretrained(
        model_args.model_name_or_path,
        num_labels=len(label_list),
        finetuning_task="ner",
        label2id=label_to_id,
        id2label=dict(enumerate(label_list)),
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = transformers.AutoModelForTokenClassification.from_pretrained(
        model_args.model_name_or_path, config=config
    )
    padding = "max_length" if data_args.pad_to_max_length else False

    def tokenize_and_align_labels(examples):
        tokenized = tokenizer(
            examples["tokens"],
            padding=padding,
            truncation=True,
            max_length=data_args.max_seq_length,
            is_split_into_words=True,
        )
        labels = []
        for i, label in enumerate(examples["ner_tags"]):
            word_ids = tokenized.word_ids(batch_index=i)
            previous, label_ids = None, []
            for word_idx in word_ids:
                if word_idx is None:
                    label_ids.append(-100)
                elif word_idx != previous:
                    label_ids.append(label[word_idx])
                else:
                    label_ids.append(label[word_idx] if data_args.label_all_tokens else -100)
                previous = word_idx
            labels.append(label_ids)
        tokenized["labels"] = labels
        return tokenized

    with training_args.main_process_first(desc="dataset map pre-processing"):
        processed = raw.map(tokenize_and_align_labels, batched=True, remove_columns=["tokens", "ner_tags"])
    train_dataset, eval_dataset, predict_dataset = (
        processed["train"],
        processed["validation"],
        processed["test"],
    )

    def compute_metrics(p):
        predictions = np.argmax(p.predictions, axis=2)
        return {"accuracy": token_accuracy(predictions, p.label_ids)}

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=transformers.DataCollatorForTokenClassification(tokenizer),
        compute_metrics=compute_metrics,
    )
    results = train_evaluate_predict(trainer, training_args, last_checkpoint, train_dataset, eval_dataset)
    if training_args.do_eval:
        trainer.log_metrics("eval", results["eval"])
        trainer.save_metrics("eval", results["eval"])
    if training_args.do_predict:
        predictions, labels, metrics = trainer.predict(predict_dataset, metric_key_prefix="predict")
        predictions = np.argmax(predictions, axis=2)
        true_predictions = [
            [label_list[p] for (p, lab) in zip(prediction, label) if lab != -100]
            for prediction, label in zip(predictions, labels)
        ]
        trainer.log_metrics("predict", metrics)
        trainer.save_metrics("predict", metrics)
        with open(os.path.join(training_args.output_dir, "predictions.txt"), "w") as writer:
            for prediction in true_predictions:
                writer.write(" ".join(prediction) + "\n")
        results.update(predict=metrics, true_predictions=true_predictions, predict_labels=labels)
    trainer.create_model_card(finetuned_from=model_args.model_name_or_path, tasks="token-classification")
    return {
        "trainer": trainer,
        "last_checkpoint": last_checkpoint,
        "predict_dataset": predict_dataset,
        **results,
    }


def summarization_datasets() -> "datasets.DatasetDict":
    def split(n, seed):
        docs = text_corpus(n, seed=seed, min_words=4, max_words=14)
        return datasets.Dataset.from_dict(
            {"document": docs, "summary": [" ".join(d.split()[:3]) for d in docs]}
        )

    return datasets.DatasetDict({"train": split(64, 40), "validation": split(12, 41), "test": split(10, 42)})


def run_summarization(argv: list[str]) -> dict:
    model_args, data_args, training_args = parse(argv, Seq2SeqTrainingArguments)
    last_checkpoint = detect_last_checkpoint(training_args)
    set_seed(training_args.seed)
    raw = summarization_datasets()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path)
    if model.config.decoder_start_token_id is None:
        raise ValueError("Make sure that `config.decoder_start_token_id` is correctly defined")
    padding = "max_length" if data_args.pad_to_max_length else False

    def preprocess_function(examples, max_target_length):
        model_inputs = tokenizer(
            examples["document"], max_length=data_args.max_source_length, padding=padding, truncation=True
        )
        labels = tokenizer(text_target=examples["summary"], max_length=max_target_length, truncation=True)
        model_inputs["labels"] = labels["input_ids"]
        model_inputs.pop("token_type_ids", None)
        return model_inputs

    columns = ["document", "summary"]
    with training_args.main_process_first(desc="dataset map pre-processing"):
        train_dataset = raw["train"].map(
            preprocess_function, batched=True, remove_columns=columns, fn_kwargs={"max_target_length": 16}
        )
        eval_len = data_args.val_max_target_length or data_args.max_target_length
        eval_dataset = raw["validation"].map(
            preprocess_function,
            batched=True,
            remove_columns=columns,
            fn_kwargs={"max_target_length": eval_len},
        )
        predict_dataset = raw["test"].map(
            preprocess_function,
            batched=True,
            remove_columns=columns,
            fn_kwargs={"max_target_length": eval_len},
        )
    data_collator = transformers.DataCollatorForSeq2Seq(
        tokenizer, model=model, label_pad_token_id=-100, pad_to_multiple_of=8 if training_args.fp16 else None
    )

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        if isinstance(preds, tuple):
            preds = preds[0]
        preds = np.where(preds != -100, preds, tokenizer.pad_token_id)
        decoded_preds = tokenizer.batch_decode(preds, skip_special_tokens=True)
        labels = np.where(labels != -100, labels, tokenizer.pad_token_id)
        decoded_labels = tokenizer.batch_decode(labels, skip_special_tokens=True)
        overlap = [  # unigram F1 (rouge1-like, computed here: nothing to download)
            _unigram_f1(p.split(), r.split()) for p, r in zip(decoded_preds, decoded_labels)
        ]
        gen_len = [np.count_nonzero(pred != tokenizer.pad_token_id) for pred in preds]
        return {
            "unigram_f1": round(100 * float(np.mean(overlap)), 4),
            "gen_len": round(float(np.mean(gen_len)), 4),
        }

    trainer = Seq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=data_collator,
        compute_metrics=compute_metrics if training_args.predict_with_generate else None,
    )
    results = {}
    if training_args.do_train:
        train_result = trainer.train(
            resume_from_checkpoint=training_args.resume_from_checkpoint or last_checkpoint
        )
        trainer.save_model()
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
        results["train"] = metrics
    max_length = training_args.generation_max_length or data_args.val_max_target_length
    num_beams = data_args.num_beams or training_args.generation_num_beams
    if training_args.do_eval:
        metrics = trainer.evaluate(metric_key_prefix="eval", max_length=max_length, num_beams=num_beams)
        metrics["eval_samples"] = len(eval_dataset)
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
        results["eval"] = metrics
    if training_args.do_predict:
        predict_results = trainer.predict(
            predict_dataset, metric_key_prefix="predict", max_length=max_length, num_beams=num_beams
        )
        metrics = predict_results.metrics
        metrics["predict_samples"] = len(predict_dataset)
        trainer.log_metrics("predict", metrics)
        trainer.save_metrics("predict", metrics)
        if trainer.is_world_process_zero() and training_args.predict_with_generate:
            predictions = np.where(
                predict_results.predictions != -100, predict_results.predictions, tokenizer.pad_token_id
            )
            decoded = tokenizer.batch_decode(
                predictions, skip_special_tokens=True, clean_up_tokenization_spaces=True
            )
            with open(os.path.join(training_args.output_dir, "generated_predictions.txt"), "w") as writer:
                writer.write("\n".join(p.strip().replace("\n", " ") for p in decoded))
        results["predict"] = predict_results
    trainer.create_model_card(finetuned_from=model_args.model_name_or_path, tasks="summarization")
    return {"trainer": trainer, "last_checkpoint": last_checkpoint, "max_length": max_length, **results}


def _unigram_f1(pred: list[str], ref: list[str]) -> float:
    common = sum(min(pred.count(w), ref.count(w)) for w in set(pred))
    if not pred or not ref or not common:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


# --------------------------------------------------------------------------- fixtures and checks
@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, tokenizer):
    """Local 'pretrained' folders (model + tokenizer) as the scripts' --model_name_or_path."""
    root = tmp_path_factory.mktemp("pretrained")
    paths = {}
    for name in ("gpt2", "bert-mlm", "bart"):
        path = str(root / name)
        build_model(name, tokenizer).save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths[name] = path
    return paths


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


# --------------------------------------------------------------------------- the tests
def test_causal_lm_like_run_clm(pretrained, tmp_path):
    out = str(tmp_path / "clm")
    argv = common_argv(pretrained["gpt2"], out, "--block_size", "32")
    result = run_clm(argv)
    n_train = len(result["trainer"].train_dataset)
    assert result["last_checkpoint"] is None
    assert_common_outcomes(result, out, pretrained["gpt2"], n_train, {"eval_accuracy", "perplexity"})
    eval_metrics = read_json(out, "eval_results.json")
    assert eval_metrics["perplexity"] == pytest.approx(math.exp(eval_metrics["eval_loss"]))
    assert 0.0 <= eval_metrics["eval_accuracy"] <= 1.0
    assert eval_metrics["eval_loss"] < math.log(len(result["trainer"].processing_class))  # beats uniform
    # the saved folder is a usable pretrained model
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert reloaded.config.n_embd == 32

    # the same command again, with one more epoch: the script resumes from the last checkpoint
    steps = result["trainer"].state.global_step
    newest = get_last_checkpoint(out)
    assert os.path.basename(newest) == f"checkpoint-{steps}"  # save_steps=5, and the end of training
    again = run_clm(common_argv(pretrained["gpt2"], out, "--block_size", "32", "--num_train_epochs", "3"))
    assert again["last_checkpoint"] == newest
    assert again["trainer"].state.global_step == steps * 3 // 2
    assert read_json(out, "train_results.json")["epoch"] == pytest.approx(3.0)


def test_masked_lm_like_run_mlm(pretrained, tmp_path):
    out = str(tmp_path / "mlm")
    result = run_mlm(
        common_argv(pretrained["bert-mlm"], out, "--max_seq_length", "32", "--mlm_probability", "0.3")
    )
    n_train = len(result["trainer"].train_dataset)
    assert_common_outcomes(result, out, pretrained["bert-mlm"], n_train, {"eval_accuracy", "perplexity"})
    eval_metrics = read_json(out, "eval_results.json")
    assert eval_metrics["eval_loss"] < math.log(len(result["trainer"].processing_class))  # beats uniform
    assert eval_metrics["perplexity"] == pytest.approx(math.exp(eval_metrics["eval_loss"]))


def test_sequence_classification_like_run_glue(pretrained, tmp_path):
    out = str(tmp_path / "glue")
    # (a tiny BERT plateaus for over an epoch on this task before it learns it)
    argv = common_argv(
        pretrained["bert-mlm"], out, "--do_predict", "--max_seq_length", "48", "--num_train_epochs", "3"
    )
    result = run_glue(argv)
    assert_common_outcomes(result, out, pretrained["bert-mlm"], 64, {"eval_accuracy"})
    assert read_json(out, "eval_results.json")["eval_accuracy"] >= 0.75  # it learned the marker
    predictions = result["predictions"]
    assert predictions.shape == (12, 2)  # one row of logits per test pair, no label needed
    with open(os.path.join(out, "predict_results_mrpc.txt")) as f:
        lines = f.read().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 13
    assert {line.split("\t")[1] for line in lines[1:]} <= {"0", "1"}
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(out)
    assert reloaded.config.num_labels == 2 and reloaded.config.id2label == {0: 0, 1: 1}


def test_token_classification_like_run_ner(pretrained, tmp_path, capsys):
    out = str(tmp_path / "ner")
    result = run_ner(common_argv(pretrained["bert-mlm"], out, "--do_predict", "--max_seq_length", "40"))
    printed = capsys.readouterr().out
    for split in ("train", "eval", "predict"):  # log_metrics' tables
        assert f"***** {split} metrics *****" in printed, split
    assert "  predict_accuracy " in printed and "  train_samples " in printed
    assert_common_outcomes(result, out, pretrained["bert-mlm"], 64, {"eval_accuracy"})
    predict = read_json(out, "predict_results.json")
    assert {"predict_loss", "predict_accuracy", "predict_runtime"} <= set(predict)
    with open(os.path.join(out, "predictions.txt")) as f:
        lines = f.read().splitlines()
    predict_dataset = result["predict_dataset"]
    assert len(lines) == len(predict_dataset) == 12
    for line, row in zip(lines, predict_dataset):  # one tag per word that carries a label
        assert len(line.split()) == sum(1 for lab in row["labels"] if lab != -100)
        assert set(line.split()) <= set(TAGS)
    labels = result["predict_labels"]
    assert labels.shape[0] == 12 and labels.shape[1] == max(len(r["input_ids"]) for r in predict_dataset)
    assert read_json(out, "config.json")["id2label"]["3"] == "B-LONG"


def test_summarization_like_run_summarization(pretrained, tmp_path):
    out = str(tmp_path / "summarization")
    argv = common_argv(
        pretrained["bart"],
        out,
        "--do_predict",
        "--predict_with_generate",
        "--generation_max_length",
        "12",
        "--generation_num_beams",
        "2",
        "--val_max_target_length",
        "12",
    )
    result = run_summarization(argv)
    assert_common_outcomes(result, out, pretrained["bart"], 64, {"eval_unigram_f1", "eval_gen_len"})
    predict = result["predict"]
    assert predict.predictions.shape[0] == 10
    assert predict.predictions.dtype.kind == "i"  # generated token ids, not logits
    assert predict.predictions.shape[1] <= 12
    assert predict.label_ids.shape[0] == 10
    assert {"predict_loss", "predict_unigram_f1", "predict_gen_len", "predict_samples"} <= set(
        predict.metrics
    )
    assert read_json(out, "predict_results.json")["predict_samples"] == 10
    with open(os.path.join(out, "generated_predictions.txt")) as f:
        assert len(f.read().split("\n")) == 10
    eval_metrics = read_json(out, "eval_results.json")
    assert 0 < eval_metrics["eval_gen_len"] <= 12
    reloaded = transformers.AutoModelForSeq2SeqLM.from_pretrained(out)
    assert reloaded.config.d_model == 32
