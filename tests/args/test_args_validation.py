"""TrainingArguments validation: bad values and combinations are refused with the field named and
what is expected; the edge values that are valid are accepted."""

import warnings

import pytest
from args_kit import (
    fresh_old_name_warnings,  # noqa: F401  (autouse)
    make,
)

from trainwright.core.enums import IntervalStrategy, SchedulerType

# -------------------------------------------------------------------------------------- choices


def test_enum_rejects_unknown_value_listing_valid_ones():
    with pytest.raises(
        ValueError, match=r"'often' is not a valid IntervalStrategy; choose one of \['no', 'steps', 'epoch'\]"
    ):
        IntervalStrategy("often")


@pytest.mark.parametrize(
    "field_name, valid",
    [
        ("eval_strategy", ["no", "steps", "epoch"]),
        ("logging_strategy", ["no", "steps", "epoch"]),
        ("save_strategy", ["no", "steps", "epoch", "best"]),
        ("hub_strategy", ["end", "every_save", "checkpoint", "all_checkpoints"]),
        ("lr_scheduler_type", SchedulerType.values()),
    ],
)
def test_invalid_choice_names_field_and_values(field_name, valid):
    with pytest.raises(ValueError) as info:
        make(**{field_name: "bogus"})
    message = str(info.value)
    assert f"{field_name}='bogus'" in message
    assert all(v in message for v in valid)


# ----------------------------------------------------------------------------------- bad values


BAD_ARGUMENTS = [
    ({"per_device_train_batch_size": 0}, "per_device_train_batch_size"),
    ({"per_device_eval_batch_size": -1}, "per_device_eval_batch_size"),
    ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
    ({"eval_accumulation_steps": 0}, "eval_accumulation_steps"),
    ({"fp16": True, "bf16": True}, "fp16"),
    ({"fp16_full_eval": True, "bf16_full_eval": True}, "fp16_full_eval"),
    ({"logging_steps": 10.5}, "logging_steps"),
    ({"eval_strategy": "steps", "eval_steps": 10.5}, "eval_steps"),
    ({"save_steps": 10.5}, "save_steps"),
    ({"logging_steps": 0}, "logging_steps"),
    ({"save_steps": 0}, "save_steps"),
    ({"logging_steps": -3}, "logging_steps"),
    ({"eval_strategy": "steps", "logging_steps": 0}, "eval_steps"),
    ({"lr_scheduler_type": "reduce_lr_on_plateau"}, "lr_scheduler_type"),
    ({"warmup_steps": -1}, "warmup_steps"),
    ({"warmup_steps": 10.5}, "warmup_steps"),
    ({"warmup_ratio": 1.5}, "warmup_ratio"),
    ({"warmup_ratio": -0.1}, "warmup_ratio"),
    ({"dataloader_prefetch_factor": 2}, "dataloader_prefetch_factor"),
    ({"dataloader_num_workers": 2, "dataloader_prefetch_factor": 0}, "dataloader_prefetch_factor"),
    ({"dataloader_num_workers": -1}, "dataloader_num_workers"),
    ({"torch_empty_cache_steps": 1.0}, "torch_empty_cache_steps"),
    ({"torch_empty_cache_steps": "none"}, "torch_empty_cache_steps"),
    ({"torch_empty_cache_steps": -1}, "torch_empty_cache_steps"),
    ({"torch_empty_cache_steps": 0}, "torch_empty_cache_steps"),
    ({"save_strategy": "best"}, "save_strategy"),
    ({"eval_delay": -1}, "eval_delay"),
    ({"num_train_epochs": 0}, "num_train_epochs"),
    ({"max_steps": 10.5}, "max_steps"),
    ({"max_steps": "10"}, "max_steps"),
    ({"save_total_limit": 0}, "save_total_limit"),
    ({"seed": -1}, "seed"),
    ({"data_seed": 2**32}, "data_seed"),
    ({"learning_rate": -1e-3}, "learning_rate"),
    ({"label_smoothing_factor": 1.0}, "label_smoothing_factor"),
    ({"include_num_input_tokens_seen": "some"}, "include_num_input_tokens_seen"),
    ({"train_sampling_strategy": "batch_rebalance"}, "train_sampling_strategy"),
    ({"include_for_metrics": ["inputs", "logits"]}, "include_for_metrics"),
    ({"log_level": "loud"}, "log_level"),
    ({"log_level_replica": "loud"}, "log_level_replica"),
    ({"ddp_backend": "smoke"}, "ddp_backend"),
    ({"ddp_timeout": 0}, "ddp_timeout"),
    ({"dataloader_multiprocessing_context": "thread"}, "dataloader_multiprocessing_context"),
    ({"debug": "verbose"}, "debug"),
    ({"fsdp": "full_shard shard_grad_op"}, "fsdp"),
    ({"fsdp": "everything"}, "fsdp"),
    ({"fsdp": "full_shard", "deepspeed": {"zero_optimization": {}}}, "deepspeed"),
    ({"parallelism_config": object()}, "parallelism_config"),
    ({"preemption_signals": ["SIGNOPE"]}, "preemption_signals"),
    ({"preemption_signals": ["SIGKILL"]}, "preemption_signals"),
    ({"save_max_shard_size": "5XB"}, "save_max_shard_size"),
    ({"save_max_shard_size": 0}, "save_max_shard_size"),
    ({"half_precision_backend": "magic"}, "half_precision_backend"),
    ({"lr_scheduler_kwargs": "not json"}, "lr_scheduler_kwargs"),
    ({"lr_scheduler_kwargs": '{"broken": '}, "lr_scheduler_kwargs"),
    ({"lr_scheduler_kwargs": 3}, "lr_scheduler_kwargs"),
    ({"gradient_checkpointing_kwargs": "[1, 2]"}, "gradient_checkpointing_kwargs"),
    ({"accelerator_config": {"split_batches": True, "bogus_key": 1}}, "accelerator_config"),
    ({"deepspeed": "/no/such/ds_config.json"}, "deepspeed"),
    ({"fsdp_config": "/no/such/fsdp.json"}, "fsdp_config"),
]


@pytest.mark.parametrize(
    "kwargs, field_name", BAD_ARGUMENTS, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD_ARGUMENTS)]
)
def test_bad_arguments_raise_naming_the_field(kwargs, field_name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(ValueError) as info:
            make(**kwargs)
    assert field_name in str(info.value)


def test_validation_messages_say_what_is_expected():
    with pytest.raises(
        ValueError, match=r"per_device_train_batch_size=0 is invalid: expected an integer >= 1"
    ):
        make(per_device_train_batch_size=0)
    with pytest.raises(ValueError, match="at most one of fp16 and bf16"):
        make(fp16=True, bf16=True)
    with pytest.raises(ValueError, match="lr_scheduler_type reduce_lr_on_plateau requires an eval strategy"):
        make(lr_scheduler_type="reduce_lr_on_plateau")
    with pytest.raises(ValueError, match="only valid with dataloader_num_workers > 0"):
        make(dataloader_prefetch_factor=2)
    with pytest.raises(ValueError, match=r"eval_strategy='epoch'.*save_strategy='steps'"):
        make(load_best_model_at_end=True, eval_strategy="epoch")


def test_accepted_edge_values():
    assert make(torch_empty_cache_steps=3).torch_empty_cache_steps == 3
    assert make(dataloader_num_workers=2, dataloader_prefetch_factor=4).dataloader_prefetch_factor == 4
    assert make(max_steps=10.0).max_steps == 10 and isinstance(make(max_steps=10.0).max_steps, int)
    assert make(num_train_epochs=0, max_steps=5).max_steps == 5
    assert make(logging_steps=0, logging_strategy="no").logging_steps == 0
    assert make(save_steps=0, save_strategy="no").save_steps == 0
    assert make(save_total_limit=1).save_total_limit == 1
    assert make(seed=0).seed == 0
    assert make(num_train_epochs=0.5).num_train_epochs == 0.5


# ----------------------------------------------------------------------- load_best_model_at_end


@pytest.mark.parametrize(
    "save_steps, eval_steps, ok",
    [
        (20, 10, True),
        (15, 10, False),
        (10, 10, True),
        (0.2, 0.1, True),
        (0.3, 0.1, True),
        (0.25, 0.1, False),
        (0.5, 10, False),
        (20, 0.1, False),
    ],
)
def test_load_best_model_needs_save_multiple_of_eval(save_steps, eval_steps, ok):
    kwargs = dict(
        load_best_model_at_end=True, eval_strategy="steps", save_steps=save_steps, eval_steps=eval_steps
    )
    if ok:
        assert make(**kwargs).load_best_model_at_end
    else:
        with pytest.raises(ValueError, match="save_steps.*eval_steps"):
            make(**kwargs)


def test_load_best_model_strategies():
    with pytest.raises(ValueError, match="load_best_model_at_end"):
        make(load_best_model_at_end=True, eval_strategy="steps", save_strategy="epoch")
    # "best" saves whenever the metric improves: any eval schedule is fine.
    a = make(load_best_model_at_end=True, eval_strategy="steps", eval_steps=7, save_strategy="best")
    assert a.metric_for_best_model == "loss"
    assert make(
        load_best_model_at_end=True, eval_strategy="epoch", save_strategy="epoch"
    ).load_best_model_at_end
