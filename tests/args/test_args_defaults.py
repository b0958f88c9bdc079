"""TrainingArguments defaults, and how given values are normalised: enums, step values, metrics,
warmup, report_to, preemption signals, debug / fsdp lists."""

import json
import logging
import os
import signal
import warnings

import pytest
from args_kit import (
    fresh_old_name_warnings,  # noqa: F401  (autouse)
    make,
)

from trainwright.args.training_args import TrainingArguments
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

# ------------------------------------------------------------------------------------- defaults


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
    assert not hasattr(a, "save_safetensors")  # removed in v5: getattr(args, "save_safetensors", d) is d
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


# ---------------------------------------------------------------------------------------- enums


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


# ------------------------------------------------------------------------------- derived values


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


# --------------------------------------------------------------------------------------- warmup


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
    # unset, as a library's subclass declares it (sentence-transformers: transformers 5 has no field)
    unset = make(warmup_ratio=None, warmup_steps=0.2)
    assert unset.warmup_ratio is None and unset.get_warmup_steps(10) == 2
    assert make(warmup_ratio=None).get_warmup_steps(10) == 0


# ------------------------------------------------------------------------------------ report_to


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


# --------------------------------------------------------------------------- signals and shards


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
