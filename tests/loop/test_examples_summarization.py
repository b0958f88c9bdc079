"""Sequence-to-sequence example scenario (run_summarization.py) run end to end with trainwright's
Seq2SeqTrainer: generation at evaluate / predict, generated predictions written out.

Shared steps and checks: example_kit.py.
"""

import os

import example_kit as example
import numpy as np
from kit import hf
from kit.hf import datasets, text_corpus, transformers

from trainwright import Seq2SeqTrainer, Seq2SeqTrainingArguments

tokenizer, tokenizer_dir = hf.tokenizer, hf.tokenizer_dir  # session fixtures
pretrained, offline = example.pretrained, example.offline  # fixtures


def summarization_datasets() -> "datasets.DatasetDict":
    def split(n, seed):
        docs = text_corpus(n, seed=seed, min_words=4, max_words=14)
        return datasets.Dataset.from_dict(
            {"document": docs, "summary": [" ".join(d.split()[:3]) for d in docs]}
        )

    return datasets.DatasetDict({"train": split(64, 40), "validation": split(12, 41), "test": split(10, 42)})


def _unigram_f1(pred: list[str], ref: list[str]) -> float:
    common = sum(min(pred.count(w), ref.count(w)) for w in set(pred))
    if not pred or not ref or not common:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def run_summarization(argv: list[str]) -> dict:
    script = example.start(argv, Seq2SeqTrainingArguments)
    model_args, data_args, training_args, last_checkpoint = script
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

    eval_len = data_args.val_max_target_length or data_args.max_target_length
    with training_args.main_process_first(desc="dataset map pre-processing"):
        train_dataset, eval_dataset, predict_dataset = (
            raw[split].map(
                preprocess_function,
                batched=True,
                remove_columns=["document", "summary"],
                fn_kwargs={"max_target_length": target_length},
            )
            for split, target_length in (("train", 16), ("validation", eval_len), ("test", eval_len))
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

    max_length = training_args.generation_max_length or data_args.val_max_target_length
    num_beams = data_args.num_beams or training_args.generation_num_beams
    generation = {"max_length": max_length, "num_beams": num_beams}
    trainer, results = example.train_and_evaluate(
        script,
        model,
        tokenizer,
        train_dataset,
        eval_dataset,
        data_collator,
        compute_metrics if training_args.predict_with_generate else None,
        trainer_class=Seq2SeqTrainer,
        eval_kwargs={"metric_key_prefix": "eval", **generation},
    )
    if training_args.do_predict:
        predict_results = example.predict_and_log(trainer, predict_dataset, **generation)
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


def test_summarization_like_run_summarization(pretrained, tmp_path):
    out = str(tmp_path / "summarization")
    argv = example.common_argv(
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
    example.assert_common_outcomes(result, out, pretrained["bart"], 64, {"eval_unigram_f1", "eval_gen_len"})
    predict = result["predict"]
    assert predict.predictions.shape[0] == 10
    assert predict.predictions.dtype.kind == "i"  # generated token ids, not logits
    assert predict.predictions.shape[1] <= 12
    assert predict.label_ids.shape[0] == 10
    assert {"predict_loss", "predict_unigram_f1", "predict_gen_len", "predict_samples"} <= set(
        predict.metrics
    )
    assert example.read_json(out, "predict_results.json")["predict_samples"] == 10
    with open(os.path.join(out, "generated_predictions.txt")) as f:
        assert len(f.read().split("\n")) == 10
    eval_metrics = example.read_json(out, "eval_results.json")
    assert 0 < eval_metrics["eval_gen_len"] <= 12
    reloaded = transformers.AutoModelForSeq2SeqLM.from_pretrained(out)
    assert reloaded.config.d_model == 32
