"""Language-model example scenarios (run_clm.py, run_mlm.py) run end to end with trainwright's Trainer.

Text is tokenized and grouped into blocks; evaluation reports token accuracy and perplexity, and the
causal LM run is repeated to resume from its last checkpoint. Shared steps and checks: example_kit.py.
"""

import math
import os
from itertools import chain

import example_kit as example
import pytest
from kit import hf
from kit.hf import datasets, text_corpus, transformers

from trainwright import get_last_checkpoint

tokenizer, tokenizer_dir = hf.tokenizer, hf.tokenizer_dir  # session fixtures
pretrained, offline = example.pretrained, example.offline  # fixtures


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


# --------------------------------------------------------------------------- the scripts
def run_clm(argv: list[str]) -> dict:
    script = example.start(argv)
    model_args, data_args, training_args, last_checkpoint = script
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

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        return {"accuracy": example.token_accuracy(preds[:, :-1], labels[:, 1:])}

    collator = transformers.default_data_collator
    trainer, results = example.train_and_evaluate(
        script, model, tokenizer, train_dataset, eval_dataset, collator, compute_metrics, language_model=True
    )
    kwargs = {"finetuned_from": model_args.model_name_or_path, "tasks": "text-generation"}
    trainer.create_model_card(**kwargs)
    return {"trainer": trainer, "last_checkpoint": last_checkpoint, "block_size": block_size, **results}


def run_mlm(argv: list[str]) -> dict:
    script = example.start(argv)
    model_args, data_args, training_args, last_checkpoint = script
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

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        return {"accuracy": example.token_accuracy(preds, labels)}

    collator = transformers.DataCollatorForLanguageModeling(
        tokenizer=tokenizer, mlm_probability=data_args.mlm_probability
    )
    trainer, results = example.train_and_evaluate(
        script, model, tokenizer, train_dataset, eval_dataset, collator, compute_metrics, language_model=True
    )
    trainer.create_model_card(finetuned_from=model_args.model_name_or_path, tasks="fill-mask")
    return {"trainer": trainer, "last_checkpoint": last_checkpoint, **results}


# --------------------------------------------------------------------------- the tests
def test_causal_lm_like_run_clm(pretrained, tmp_path):
    out = str(tmp_path / "clm")
    argv = example.common_argv(pretrained["gpt2"], out, "--block_size", "32")
    result = run_clm(argv)
    n_train = len(result["trainer"].train_dataset)
    assert result["last_checkpoint"] is None
    example.assert_common_outcomes(result, out, pretrained["gpt2"], n_train, {"eval_accuracy", "perplexity"})
    eval_metrics = example.read_json(out, "eval_results.json")
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
    again = run_clm(
        example.common_argv(pretrained["gpt2"], out, "--block_size", "32", "--num_train_epochs", "3")
    )
    assert again["last_checkpoint"] == newest
    assert again["trainer"].state.global_step == steps * 3 // 2
    assert example.read_json(out, "train_results.json")["epoch"] == pytest.approx(3.0)


def test_masked_lm_like_run_mlm(pretrained, tmp_path):
    out = str(tmp_path / "mlm")
    result = run_mlm(
        example.common_argv(pretrained["bert-mlm"], out, "--max_seq_length", "32", "--mlm_probability", "0.3")
    )
    n_train = len(result["trainer"].train_dataset)
    example.assert_common_outcomes(
        result, out, pretrained["bert-mlm"], n_train, {"eval_accuracy", "perplexity"}
    )
    eval_metrics = example.read_json(out, "eval_results.json")
    assert eval_metrics["eval_loss"] < math.log(len(result["trainer"].processing_class))  # beats uniform
    assert eval_metrics["perplexity"] == pytest.approx(math.exp(eval_metrics["eval_loss"]))
