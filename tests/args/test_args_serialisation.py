"""TrainingArguments / Seq2SeqTrainingArguments serialisation: dict fields given as JSON strings or
files, to_dict / from_dict / JSON files, str and redaction, dataclasses.replace."""

import dataclasses
import json

import pytest
import torch
from args_kit import (
    fresh_old_name_warnings,  # noqa: F401  (autouse)
    make,
)

from trainwright.args.training_args import Seq2SeqTrainingArguments, TrainingArguments
from trainwright.core.enums import IntervalStrategy

# --------------------------------------------------------------------------- dict-valued fields


def test_dict_fields_accept_json_strings():
    a = make(
        lr_scheduler_kwargs='{"num_cycles": 2, "min_lr": 1e-6}',
        activation_checkpointing_kwargs='{"use_reentrant": false}',
        accelerator_config='{"non_blocking": true}',
        fsdp_config='{"fsdp_min_num_params": 100, "transformer_layer_cls_to_wrap": "Block"}',
        liger_kernel_config='{"rope": true}',
        use_liger_kernel=True,
    )
    assert a.lr_scheduler_kwargs == {"num_cycles": 2, "min_lr": 1e-6}
    assert a.activation_checkpointing_kwargs == {"use_reentrant": False}
    assert a.gradient_checkpointing_kwargs == {"use_reentrant": False}  # the old name mirrors the new one
    assert a.accelerator_config["non_blocking"] is True and a.accelerator_config["even_batches"] is True
    assert a.accelerator_config.non_blocking is True  # upstream's AcceleratorConfig attributes
    assert a.fsdp_config == {"min_num_params": 100, "transformer_layer_cls_to_wrap": ["Block"]}
    assert a.liger_kernel_config == {"rope": True}


def test_dict_fields_read_json_files(tmp_path):
    fsdp = tmp_path / "fsdp.json"
    fsdp.write_text(json.dumps({"fsdp_reshard_after_forward": False}))
    accel = tmp_path / "accel.json"
    accel.write_text(json.dumps({"gradient_accumulation_kwargs": {"sync_each_batch": True}}))
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": "auto"}))
    a = make(fsdp_config=str(fsdp), accelerator_config=accel, deepspeed=str(ds))
    assert a.fsdp_config == {"reshard_after_forward": False}
    assert a.accelerator_config["gradient_accumulation_kwargs"] == {"sync_each_batch": True}
    assert a.deepspeed == str(ds)  # DeepSpeed reads its own file
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="fsdp_config.*must hold a JSON object"):
        make(fsdp_config=str(bad))


def test_callers_dicts_are_not_mutated():
    given = {"fsdp_min_num_params": 5, "transformer_layer_cls_to_wrap": "Block"}
    make(fsdp="full_shard", fsdp_config=given)
    assert given == {"fsdp_min_num_params": 5, "transformer_layer_cls_to_wrap": "Block"}


# -------------------------------------------------------------------------------- serialisation


def test_to_dict_round_trip(tmp_path):
    a = make(
        eval_strategy="steps",
        logging_steps=0.1,
        save_strategy="best",
        metric_for_best_model="acc",
        lr_scheduler_type="cosine",
        report_to=["tensorboard"],
        hub_token="secret-token",
        fsdp="full_shard auto_wrap",
        fsdp_config={"mixed_precision_dtype": torch.bfloat16},
        debug="underflow_overflow",
        warmup_steps=0.05,
        preemption_signals=["SIGINT"],
    )
    d = a.to_dict()
    assert d["eval_strategy"] == "steps" and type(d["eval_strategy"]) is str
    assert d["save_strategy"] == "best" and d["optim"] == "adamw_torch_fused"
    assert d["fsdp"] == ["full_shard", "auto_wrap"] and type(d["fsdp"][0]) is str
    assert d["debug"] == ["underflow_overflow"]
    assert d["fsdp_config"] == {"mixed_precision_dtype": "bfloat16"}
    assert d["hub_token"] == "<HUB_TOKEN>" and "secret-token" not in a.to_json_string()
    path = tmp_path / "training_args.json"
    a.to_json_file(path)
    b = TrainingArguments.from_json_file(path)
    assert b.hub_token is None  # the redacted placeholder is not taken for a token
    assert b.to_dict() == {**d, "hub_token": None}
    assert b.eval_strategy is IntervalStrategy.STEPS
    assert json.loads(path.read_text()) == d


def test_from_dict_rejects_unknown_keys(tmp_path):
    d = make().to_dict()
    d.update(learnin_rate=0.1, zzz=1)
    with pytest.raises(ValueError, match=r"unknown keys \['learnin_rate', 'zzz'\]"):
        TrainingArguments.from_dict(d)
    bad = tmp_path / "args.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="args.json is not valid JSON"):
        TrainingArguments.from_json_file(bad)
    bad.write_text("[1]")
    with pytest.raises(ValueError, match="args.json must hold a JSON object, found list"):
        TrainingArguments.from_json_file(bad)


def test_to_sanitized_dict_has_only_plain_values():
    a = make(report_to="tensorboard", label_names=["labels"])
    d = a.to_sanitized_dict()
    assert d["train_batch_size"] == 8 and d["eval_batch_size"] == 8
    assert d["report_to"] == "['tensorboard']" and d["data_seed"] == "None"
    assert all(type(v) in (bool, int, float, str) for v in d.values())


def test_str_is_readable_and_redacts_tokens():
    a = make(hub_token="abc123")
    text = str(a)
    assert text.startswith("TrainingArguments(\n") and "  learning_rate=5e-05,\n" in text
    assert "abc123" not in text and "<HUB_TOKEN>" in text
    assert repr(a) == text


def test_replace_and_rebuild_are_idempotent():
    a = make(
        eval_strategy="steps",
        logging_steps=10,
        load_best_model_at_end=True,
        save_steps=20,
        report_to="tensorboard",
        fsdp="full_shard",
        debug="underflow_overflow",
        warmup_steps=0.1,
        include_num_input_tokens_seen=True,
    )
    assert dataclasses.replace(a) == a
    assert dataclasses.replace(a, learning_rate=1e-3).learning_rate == 1e-3


# -------------------------------------------------------------------------------------- seq2seq


def test_seq2seq_fields():
    a = Seq2SeqTrainingArguments(output_dir="out")
    assert (a.sortish_sampler, a.predict_with_generate) == (False, False)
    assert (a.generation_max_length, a.generation_num_beams, a.generation_config) == (None, None, None)
    b = Seq2SeqTrainingArguments(
        output_dir="out",
        predict_with_generate=True,
        generation_max_length=32,
        generation_config='{"top_k": 5}',
    )
    assert b.generation_config == {"top_k": 5}
    c = Seq2SeqTrainingArguments.from_dict(b.to_dict())
    assert isinstance(c, Seq2SeqTrainingArguments) and c.to_dict() == b.to_dict()
    assert str(b).startswith("Seq2SeqTrainingArguments(")
    with pytest.raises(ValueError, match="generation_num_beams"):
        Seq2SeqTrainingArguments(output_dir="out", generation_num_beams=0)

    class FakeGenerationConfig:  # stands in for transformers.GenerationConfig
        def to_dict(self):
            return {"max_new_tokens": 4}

    d = Seq2SeqTrainingArguments(output_dir="out", generation_config=FakeGenerationConfig()).to_dict()
    assert d["generation_config"] == {"max_new_tokens": 4}
