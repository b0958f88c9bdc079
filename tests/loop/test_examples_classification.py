"""Classification example scenarios (run_glue.py, run_ner.py) run end to end with trainwright's Trainer.

run_glue predicts a label per sentence pair, run_ner a tag per word (labels aligned to sub-tokens),
both writing their predictions to a file. Shared steps and checks: example_kit.py.
"""

import os

import example_kit as example
import numpy as np
from kit import hf
from kit.hf import datasets, text_corpus, transformers

tokenizer, tokenizer_dir = hf.tokenizer, hf.tokenizer_dir  # session fixtures
pretrained, offline = example.pretrained, example.offline  # fixtures


# --------------------------------------------------------------------------- run_glue.py
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
    script = example.start(argv)
    model_args, data_args, training_args, last_checkpoint = script
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
    trainer, results = example.train_and_evaluate(
        script, model, tokenizer, train_dataset, eval_dataset, data_collator, compute_metrics
    )
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


# --------------------------------------------------------------------------- run_ner.py
TAGS = ["O", "B-SHORT", "I-SHORT", "B-LONG", "I-LONG"]


def ner_datasets() -> "datasets.DatasetDict":
    def split(n, seed):
        words = [t.split() for t in text_corpus(n, seed=seed)]
        tags = [[(1 if len(w) <= 3 else 3) if len(w) % 2 else 0 for w in ws] for ws in words]
        return datasets.Dataset.from_dict({"tokens": words, "ner_tags": tags})

    return datasets.DatasetDict({"train": split(64, 30), "validation": split(16, 31), "test": split(12, 32)})


def run_ner(argv: list[str]) -> dict:
    script = example.start(argv)
    model_args, data_args, training_args, last_checkpoint = script
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
        return {"accuracy": example.token_accuracy(predictions, p.label_ids)}

    data_collator = transformers.DataCollatorForTokenClassification(tokenizer)
    trainer, results = example.train_and_evaluate(
        script, model, tokenizer, train_dataset, eval_dataset, data_collator, compute_metrics
    )
    if training_args.do_predict:
        predictions, labels, metrics = example.predict_and_log(trainer, predict_dataset)
        predictions = np.argmax(predictions, axis=2)
        true_predictions = [
            [label_list[p] for (p, lab) in zip(prediction, label) if lab != -100]
            for prediction, label in zip(predictions, labels)
        ]
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


# --------------------------------------------------------------------------- the tests
def test_sequence_classification_like_run_glue(pretrained, tmp_path):
    out = str(tmp_path / "glue")
    # (a tiny BERT plateaus for over an epoch on this task before it learns it)
    argv = example.common_argv(
        pretrained["bert-mlm"], out, "--do_predict", "--max_seq_length", "48", "--num_train_epochs", "3"
    )
    result = run_glue(argv)
    example.assert_common_outcomes(result, out, pretrained["bert-mlm"], 64, {"eval_accuracy"})
    assert example.read_json(out, "eval_results.json")["eval_accuracy"] >= 0.75  # it learned the marker
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
    result = run_ner(
        example.common_argv(pretrained["bert-mlm"], out, "--do_predict", "--max_seq_length", "40")
    )
    printed = capsys.readouterr().out
    for split in ("train", "eval", "predict"):  # log_metrics' tables
        assert f"***** {split} metrics *****" in printed, split
    assert "  predict_accuracy " in printed and "  train_samples " in printed
    example.assert_common_outcomes(result, out, pretrained["bert-mlm"], 64, {"eval_accuracy"})
    predict = example.read_json(out, "predict_results.json")
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
    assert example.read_json(out, "config.json")["id2label"]["3"] == "B-LONG"
