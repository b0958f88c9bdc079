"""TrainingArguments / Seq2SeqTrainingArguments: defaults, validation, old names, serialisation."""

import contextlib
import dataclasses
import enum
import json
import logging
import os
import signal
import warnings

import pytest
import torch
from kit import ROOT

import trainwright.args.aliases as aliases_mod
from trainwright.args.training_args import (
    V4_V5_CHOICES,
    Seq2SeqTrainingArguments,
    TrainingArguments,
)
from trainwright.core import runtime as runtime_module
from trainwright.core.enums import (
    DebugOption,
    FSDPOption,
    HubStrategy,
    IntervalStrategy,
    OptimizerNames,
    ParallelMode,
    SaveStrategy,
    SchedulerType,
)


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    # Old-name warnings are emitted once per process; give every test a fresh record.
    monkeypatch.setattr(aliases_mod, "_WARNED", set())


def make(**kwargs) -> TrainingArguments:
    kwargs.setdefault("output_dir", "out")
    return TrainingArguments(**kwargs)


def future_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, FutureWarning)]


# ------------------------------------------------------------------------------------ defaults


def test_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the defaults alone warn about nothing
        a = TrainingArguments()
    assert a.output_dir == "trainer_output"
    assert not (tmp_path / "trainer_output").exists()  # the dataclass creates no folder
    assert a.optim == "adamw_torch_fused" and isinstance(a.optim, OptimizerNames)
    assert a.report_to == []
    assert a.lr_scheduler_kwargs == {}
    assert a.eval_strategy == "no" and a.save_strategy == "steps" and a.logging_strategy == "steps"
    assert (a.logging_steps, a.save_steps, a.eval_steps) == (500, 500, None)
    assert a.lr_scheduler_type == "linear" and a.learning_rate == 5e-5
    assert (a.per_device_train_batch_size, a.per_device_eval_batch_size) == (8, 8)
    assert a.num_train_epochs == 3.0 and a.max_steps == -1
    assert a.ddp_timeout == 1800 and a.skip_memory_metrics is True
    assert a.average_tokens_across_devices is True and a.use_cache is False
    assert a.include_num_input_tokens_seen == "no"
    # trainwright keeps its save-on-preemption guarantee unless enable_jit_checkpoint=False is said
    assert a.preemption_signals == ["SIGTERM", "SIGUSR1", "SIGINT"] and a.enable_jit_checkpoint is None
    assert a.save_max_shard_size == "5GB"
    assert a.activation_checkpointing is False and a.gradient_checkpointing is False
    assert a.debug == [] and a.fsdp == [] and a.fsdp_config == {}
    assert a.accelerator_config["use_seedable_sampler"] is True
    assert a.do_eval is False and a.torch_compile is False
    assert a.metric_for_best_model is None and a.greater_is_better is None
    assert a.seed == 42 and a.data_seed is None
    assert a.dataloader_pin_memory is True
    assert a.save_safetensors is True
    assert a.warmup_steps == 0 and a.warmup_ratio == 0.0


def test_output_dir_user_expanded_and_not_created(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    a = TrainingArguments(output_dir="~/runs/x", logging_dir="~/tb")
    assert a.output_dir == os.path.join(str(tmp_path), "runs", "x")
    assert a.logging_dir == os.path.join(str(tmp_path), "tb")
    assert not (tmp_path / "runs").exists()


def test_disable_tqdm_follows_trainwright_log_level():
    log = logging.getLogger("trainwright")
    old = log.level
    try:
        log.setLevel(logging.ERROR)
        assert make().disable_tqdm is True
        log.setLevel(logging.INFO)
        assert make().disable_tqdm is False
        assert make(disable_tqdm=True).disable_tqdm is True
    finally:
        log.setLevel(old)


def test_v4_v5_choices_documents_the_disagreements():
    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert set(V4_V5_CHOICES) <= names
    for key in (
        "report_to",
        "optim",
        "lr_scheduler_kwargs",
        "warmup_steps",
        "logging_dir",
        "activation_checkpointing",
    ):
        assert V4_V5_CHOICES[key]


# ------------------------------------------------------------------------------------ enums


def test_enums_are_strings():
    a = make(eval_strategy="steps", save_strategy="best", metric_for_best_model="acc", logging_steps=5)
    assert a.eval_strategy == "steps" and a.eval_strategy == IntervalStrategy.STEPS
    assert isinstance(a.eval_strategy, IntervalStrategy) and isinstance(a.eval_strategy, str)
    assert a.save_strategy == "best" and isinstance(a.save_strategy, SaveStrategy)
    assert f"{a.eval_strategy}" == "steps" and str(a.save_strategy) == "best"
    assert json.dumps({"s": a.eval_strategy}) == '{"s": "steps"}'
    assert SaveStrategy.STEPS == IntervalStrategy.STEPS  # both are the string "steps"
    assert a.hub_strategy == HubStrategy.EVERY_SAVE
    assert make(lr_scheduler_type=SchedulerType.COSINE).lr_scheduler_type == "cosine"
    assert ParallelMode("distributed") is ParallelMode.DISTRIBUTED


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


def test_scheduler_names():
    assert SchedulerType.values() == [
        "linear",
        "cosine",
        "cosine_with_restarts",
        "polynomial",
        "constant",
        "constant_with_warmup",
        "inverse_sqrt",
        "reduce_lr_on_plateau",
        "cosine_with_min_lr",
        "cosine_warmup_with_min_lr",
        "warmup_stable_decay",
        "greedy",
    ]
    greedy = make(lr_scheduler_type="greedy", eval_strategy="epoch")
    assert (greedy.lr_scheduler_type, greedy.metric_for_best_model, greedy.greater_is_better) == (
        "greedy",
        "loss",
        False,
    )
    with pytest.raises(ValueError, match="lr_scheduler_type greedy requires an eval strategy"):
        make(lr_scheduler_type="greedy")


def test_optimizer_names():
    for name in ("adamw_torch", "adamw_torch_fused", "adafactor", "sgd", "adagrad", "rmsprop"):
        assert make(optim=name).optim == name
    assert make(optim="adamw_bnb_8bit").optim == "adamw_bnb_8bit"  # built by trainwright.optim.extra
    with pytest.raises(ValueError, match="optim='adamw_quantum'.*adamw_torch_fused"):
        make(optim="adamw_quantum")


def test_adamw_hf_is_adamw_torch_and_warns_once():
    with pytest.warns(FutureWarning, match="adamw_hf"):
        a = make(optim="adamw_hf")
    assert a.optim == OptimizerNames.ADAMW_TORCH
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        make(optim="adamw_hf")
    assert future_warnings(record) == []


# ------------------------------------------------------------------------------- validation

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


def test_do_eval_and_eval_steps_fall_back():
    a = make(eval_strategy="steps", logging_steps=10)
    assert a.do_eval is True and a.eval_steps == 10
    b = make(eval_strategy="epoch")
    assert b.do_eval is True
    assert make(eval_strategy="steps", eval_steps=0, logging_steps=7).eval_steps == 7
    assert make(eval_strategy="steps", eval_steps=25).eval_steps == 25


def test_step_values_ratio_and_integer():
    a = make(logging_steps=0.5, save_steps=0.25, eval_strategy="steps", eval_steps=0.1)
    assert (a.logging_steps, a.save_steps, a.eval_steps) == (0.5, 0.25, 0.1)
    b = make(logging_steps=10.0, save_steps=20.0, eval_strategy="steps", eval_steps=5.0)
    assert (b.logging_steps, b.save_steps, b.eval_steps) == (10, 20, 5)
    assert all(isinstance(v, int) for v in (b.logging_steps, b.save_steps, b.eval_steps))


def test_metric_defaults():
    a = make(load_best_model_at_end=True, eval_strategy="steps", save_steps=500, eval_steps=100)
    assert (a.metric_for_best_model, a.greater_is_better) == ("loss", False)
    assert make(metric_for_best_model="eval_loss").greater_is_better is False
    assert make(metric_for_best_model="accuracy").greater_is_better is True
    assert make(metric_for_best_model="accuracy", greater_is_better=False).greater_is_better is False
    plateau = make(lr_scheduler_type="reduce_lr_on_plateau", eval_strategy="epoch", save_strategy="epoch")
    assert (plateau.metric_for_best_model, plateau.greater_is_better) == ("loss", False)
    best = make(save_strategy="best", metric_for_best_model="f1")
    assert best.save_strategy == "best" and best.greater_is_better is True


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


def test_torch_compile_auto_enabled_with_inductor_default():
    assert make(torch_compile=True).torch_compile_backend == "inductor"
    a = make(torch_compile_mode="reduce-overhead")
    assert a.torch_compile is True and a.torch_compile_backend == "inductor"
    b = make(torch_compile_backend="aot_eager")
    assert b.torch_compile is True and b.torch_compile_backend == "aot_eager"
    assert make().torch_compile_backend is None


def test_include_num_input_tokens_seen_coerces_bools():
    assert make(include_num_input_tokens_seen=True).include_num_input_tokens_seen == "all"
    assert make(include_num_input_tokens_seen=False).include_num_input_tokens_seen == "no"
    assert make(include_num_input_tokens_seen="non_padding").include_num_input_tokens_seen == "non_padding"


def test_use_cpu_disables_pin_memory():
    assert make(use_cpu=True).dataloader_pin_memory is False
    assert make().dataloader_pin_memory is True


def test_debug_and_fsdp_are_parsed():
    assert make(debug="underflow_overflow tpu_metrics_debug").debug == [
        DebugOption.UNDERFLOW_OVERFLOW,
        DebugOption.TPU_METRICS_DEBUG,
    ]
    assert make(debug=None).debug == []
    assert make(fsdp="full_shard auto_wrap").fsdp == [FSDPOption.FULL_SHARD, FSDPOption.AUTO_WRAP]
    assert make(fsdp=["shard_grad_op", "offload"]).fsdp == ["shard_grad_op", "offload"]
    assert make(fsdp=True).fsdp == ["full_shard"]
    assert make(fsdp="offload").fsdp == ["full_shard", "offload"]
    assert make(fsdp=False).fsdp == [] and make(fsdp="").fsdp == []


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


# ----------------------------------------------------------------------------------- old names


def test_evaluation_strategy_maps_and_warns_once():
    with pytest.warns(FutureWarning, match="evaluation_strategy.*eval_strategy") as record:
        a = make(evaluation_strategy="steps", logging_steps=10)
    assert a.eval_strategy == "steps" and a.evaluation_strategy == "steps" and a.do_eval  # read back as set
    assert any(w.filename == __file__ for w in record)  # points at the caller, not at args.py
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        b = make(evaluation_strategy="epoch")
    assert b.eval_strategy == "epoch"
    assert future_warnings(again) == []
    with pytest.raises(ValueError, match="evaluation_strategy.*eval_strategy"):
        make(evaluation_strategy="epoch", eval_strategy="steps")
    with pytest.raises(ValueError, match="evaluation_strategy='sometimes'"):
        make(evaluation_strategy="sometimes")


@pytest.mark.parametrize(
    "old, new_value",
    [
        ({"per_gpu_train_batch_size": 4}, {"per_device_train_batch_size": 4}),
        ({"per_gpu_eval_batch_size": 16}, {"per_device_eval_batch_size": 16}),
        ({"no_cuda": True}, {"use_cpu": True, "dataloader_pin_memory": False}),
        ({"adafactor": True}, {"optim": "adafactor"}),
        ({"group_by_length": True}, {"train_sampling_strategy": "group_by_length"}),
        ({"include_inputs_for_metrics": True}, {"include_for_metrics": ["inputs"]}),
        ({"tpu_metrics_debug": True}, {"debug": ["tpu_metrics_debug"]}),
        ({"torchdynamo": "eager"}, {"torch_compile_backend": "eager", "torch_compile": True}),
        ({"fp16_backend": "cpu_amp"}, {"half_precision_backend": "cpu_amp"}),
        ({"push_to_hub_token": "secret"}, {"hub_token": "secret"}),
        ({"push_to_hub_model_id": "m", "push_to_hub_organization": "org"}, {"hub_model_id": "org/m"}),
        ({"fsdp_min_num_params": 1000}, {"fsdp_config": {"min_num_params": 1000}}),
        (
            {"fsdp_transformer_layer_cls_to_wrap": "Block"},
            {"fsdp_config": {"transformer_layer_cls_to_wrap": ["Block"]}},
        ),
        ({"gradient_checkpointing": True}, {"activation_checkpointing": True}),
        (
            {"gradient_checkpointing_kwargs": {"use_reentrant": False}},
            {"activation_checkpointing_kwargs": {"use_reentrant": False}},
        ),
    ],
)
def test_old_names_map_onto_new_fields_with_a_warning(old, new_value):
    (old_name, old_value), *_ = old.items()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        a = make(**old)
    assert any(old_name in message for message in future_warnings(record))
    for name, value in new_value.items():
        assert getattr(a, name) == value, name
    # The old field reads back what was set (v4 code reads args.no_cuda), and a rebuild agrees.
    assert getattr(a, old_name) == old_value
    rebuilt = type(a).from_dict(a.to_dict())
    for name, value in new_value.items():  # tokens are redacted by to_dict
        assert getattr(rebuilt, name) == (None if name.endswith("_token") else value), name


def test_old_names_at_their_v4_default_are_silent():
    v4_defaults = dict(
        no_cuda=False,
        adafactor=False,
        group_by_length=False,
        include_inputs_for_metrics=False,
        fp16_backend="auto",
        fp16_opt_level="O1",
        jit_mode_eval=False,
        use_legacy_prediction_loop=False,
        tpu_metrics_debug=False,
        mp_parameters="",
        fsdp_min_num_params=0,
        gradient_checkpointing=False,
        save_safetensors=True,
        warmup_ratio=0.0,
        evaluation_strategy="no",
        per_gpu_train_batch_size=None,
        use_mps_device=False,
    )
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        make(**v4_defaults)
    assert future_warnings(record) == []


def test_old_name_conflicting_with_new_name_is_an_error():
    with pytest.raises(ValueError, match="per_gpu_train_batch_size=4.*per_device_train_batch_size=16"):
        with pytest.warns(FutureWarning):
            make(per_gpu_train_batch_size=4, per_device_train_batch_size=16)
    with pytest.raises(ValueError, match="adafactor.*optim"):
        with pytest.warns(FutureWarning):
            make(adafactor=True, optim="sgd")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"jit_mode_eval": True},
        {"use_legacy_prediction_loop": True},
        {"fp16_opt_level": "O2"},
        {"tpu_num_cores": 8},
        {"mp_parameters": "x"},
        {"half_precision_backend": "apex"},
        {"save_safetensors": False},
        {"liger_kernel_config": {"rope": True}},
    ],
)
def test_options_trainwright_cannot_honour_are_refused(kwargs):
    with pytest.raises(ValueError, match=f"{next(iter(kwargs))}=.*is invalid"):
        make(**kwargs)


def test_options_that_change_nothing_here_are_accepted():
    assert make(half_precision_backend="cpu_amp").half_precision_backend == "cpu_amp"  # torch.amp is that
    import torch

    if torch.backends.mps.is_available():
        assert make(use_mps_device=True).use_mps_device is True
    else:  # the user asks for a device this machine does not have
        with pytest.raises(ValueError, match="use_mps_device"):
            make(use_mps_device=True)


def test_warmup_ratio_is_the_v4_name_and_warns():
    with pytest.warns(FutureWarning, match="warmup_ratio"):
        make(warmup_ratio=0.1)


def test_checkpointing_names_stay_in_sync():
    a = make(activation_checkpointing=True)
    assert a.gradient_checkpointing is True
    # The v5 name wins when both are given.
    b = make(activation_checkpointing=False, gradient_checkpointing=True)
    assert b.activation_checkpointing is False and b.gradient_checkpointing is False
    # A copy that changes the v5 name takes effect, and the v4 name follows.
    c = dataclasses.replace(a, activation_checkpointing=False)
    assert c.activation_checkpointing is False and c.gradient_checkpointing is False


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


# ---------------------------------------------------------------------------------- warmup


def test_get_warmup_steps():
    assert make(warmup_steps=10).get_warmup_steps(100) == 10
    assert make(warmup_steps=10.0).get_warmup_steps(100) == 10
    assert make(warmup_steps=0.1).get_warmup_steps(100) == 10
    assert make(warmup_steps=0.15).get_warmup_steps(99) == 15  # ceil(14.85)
    assert make(warmup_steps=0).get_warmup_steps(100) == 0
    assert make(warmup_steps=0.0).get_warmup_steps(100) == 0
    with pytest.warns(FutureWarning):
        assert make(warmup_ratio=0.25).get_warmup_steps(10) == 3  # ceil(2.5)
    assert make(warmup_ratio=0.25, warmup_steps=4).get_warmup_steps(10) == 4  # steps win (v4)
    with pytest.raises(ValueError, match="warmup_ratio.*warmup_steps"):
        make(warmup_ratio=0.25, warmup_steps=0.5)
    with pytest.raises(ValueError, match="num_training_steps"):
        make().get_warmup_steps(-1)


# ----------------------------------------------------------------------------------- report_to


@pytest.mark.parametrize(
    "given, expected",
    [
        ("none", []),
        (["none"], []),
        (None, []),
        ("tensorboard", ["tensorboard"]),
        (["tensorboard", "wandb"], ["tensorboard", "wandb"]),
        ("tensorboard,wandb", ["tensorboard", "wandb"]),
        (["tensorboard", "tensorboard"], ["tensorboard"]),
        ("all", ["all"]),
        (["all"], ["all"]),
    ],
)
def test_report_to_normalisation(given, expected):
    assert make(report_to=given).report_to == expected


# ------------------------------------------------------------------------------------ signals


def test_preemption_signals():
    assert make(preemption_signals=["term", "SIGUSR2", "SIGTERM"]).preemption_signals == [
        "SIGTERM",
        "SIGUSR2",
    ]
    assert make(preemption_signals="SIGINT,SIGTERM").preemption_signals == ["SIGINT", "SIGTERM"]
    assert make(preemption_signals=[int(signal.SIGTERM)]).preemption_signals == ["SIGTERM"]
    assert make(preemption_signals=[]).preemption_signals == []
    with pytest.raises(ValueError, match="SIGSTOP cannot be caught"):
        make(preemption_signals=["STOP"])


def test_save_max_shard_size():
    assert make(save_max_shard_size="200MiB").save_max_shard_size == "200MiB"
    assert make(save_max_shard_size=10**9).save_max_shard_size == 10**9
    with pytest.raises(ValueError, match="save_max_shard_size='lots'"):
        make(save_max_shard_size="lots")


# ------------------------------------------------------------------------------- serialisation


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


# ------------------------------------------------------------------------------------ seq2seq


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


# ------------------------------------------------------------------ every transformers name


def _transformers_defaults(cls) -> dict:
    out = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        out[f.name] = value.value if isinstance(value, enum.Enum) else value
    return out


def test_every_transformers_argument_name_is_accepted():
    transformers = pytest.importorskip("transformers")
    ours = {f.name for f in dataclasses.fields(Seq2SeqTrainingArguments) if f.init}
    theirs = _transformers_defaults(transformers.Seq2SeqTrainingArguments)
    missing = sorted(set(theirs) - ours)
    assert not missing, f"transformers {transformers.__version__} arguments not accepted: {missing}"
    # Built with transformers' own defaults, nothing warns and the result round-trips.
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        a = Seq2SeqTrainingArguments(**theirs)
    assert Seq2SeqTrainingArguments.from_dict(a.to_dict()) == a


# --------------------------------------------------------------------- runtime (lazy, delegated)


class FakeRuntime(runtime_module.Runtime):
    def __init__(self, rank=0, local_rank=0, world_size=1):
        super().__init__(device=torch.device("cpu"), rank=rank, local_rank=local_rank, world_size=world_size)
        self.entered: list[bool] = []

    @contextlib.contextmanager
    def main_process_first(self, local=True):
        self.entered.append(local)
        yield


@pytest.fixture
def fake_runtime(monkeypatch):
    calls: list[dict] = []
    holder = {"rt": FakeRuntime()}

    def get_runtime(**kwargs):
        calls.append(kwargs)
        return holder["rt"]

    monkeypatch.setattr(runtime_module, "get_runtime", get_runtime)
    return calls, holder


def test_runtime_is_asked_lazily_with_the_arguments(fake_runtime):
    calls, _ = fake_runtime
    a = make(use_cpu=True, ddp_backend="gloo", ddp_timeout=60)
    _ = (a.train_batch_size, a.eval_batch_size, a.to_dict(), str(a))
    assert calls == []  # building and printing the arguments touches no device
    assert a.device == torch.device("cpu")
    assert calls == [{"use_cpu": True, "backend": "gloo", "timeout_s": 60}]
    assert a.n_gpu == 0 and a.world_size == 1 and a.process_index == 0 and a.local_process_index == 0
    assert a.parallel_mode is ParallelMode.NOT_PARALLEL


@pytest.mark.parametrize(
    "rank, local_rank, on_each_node, expected",
    [(0, 0, False, True), (1, 0, False, False), (1, 0, True, True), (1, 1, True, False), (0, 0, True, True)],
)
def test_should_save_and_should_log(fake_runtime, rank, local_rank, on_each_node, expected):
    _, holder = fake_runtime
    holder["rt"] = FakeRuntime(rank=rank, local_rank=local_rank, world_size=4)
    a = make(save_on_each_node=on_each_node, log_on_each_node=on_each_node)
    assert a.should_save is expected and a.should_log is expected
    assert a.world_size == 4 and a.parallel_mode is ParallelMode.DISTRIBUTED


def test_process_log_level(fake_runtime):
    _, holder = fake_runtime
    holder["rt"] = FakeRuntime(rank=1, local_rank=1, world_size=2)
    assert make(log_level="info", log_level_replica="error").get_process_log_level() == logging.ERROR
    holder["rt"] = FakeRuntime()
    assert make(log_level="info").get_process_log_level() == logging.INFO
    # "passive" gives transformers' verbosity, as upstream: INFO after a script's set_verbosity_info().
    hf_logging = pytest.importorskip("transformers.utils.logging")
    old = hf_logging.get_verbosity()
    try:
        hf_logging.set_verbosity_info()
        assert make().get_process_log_level() == logging.INFO
        hf_logging.set_verbosity_warning()
        assert make().get_process_log_level() == logging.WARNING
    finally:
        hf_logging.set_verbosity(old)


def test_main_process_first_delegates_to_runtime(fake_runtime):
    _, holder = fake_runtime
    a = make()
    with a.main_process_first(local=False, desc="tokenize"):
        pass
    with a.main_process_first():
        pass
    assert holder["rt"].entered == [False, True]


def test_main_process_first_with_the_real_single_process_runtime(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    runtime_module.reset_runtime()
    try:
        a = make(use_cpu=True)
        ran = []
        with a.main_process_first():
            ran.append(True)
        assert ran == [True] and a.world_size == 1 and a.should_save and a.device.type == "cpu"
    finally:
        runtime_module.reset_runtime()


def test_place_model_on_device():
    assert make().place_model_on_device is True
    assert make(deepspeed={"zero_optimization": {"stage": 2}}).place_model_on_device is False


def test_compatibility_doc_lists_every_v4_v5_choice():

    from trainwright.args.training_args import V4_V5_CHOICES

    doc = (ROOT / "docs" / "compatibility.md").read_text()
    missing = [k for k in V4_V5_CHOICES if f"| `{k}` |" not in doc]
    assert not missing, f"docs/compatibility.md lacks {missing}: regenerate its table from V4_V5_CHOICES"
