"""The checks and normalisations of `TrainingArguments.__post_init__`, in the order they run.

Each step takes the arguments object, reads and rewrites its fields in place (choice fields become
str enums, dict fields dicts, `accelerator_config` an `AcceleratorConfig`, ...) and raises a
`ValueError` naming the field for a value trainwright cannot honour. Old (v4) names are resolved by
`aliases.resolve_old_names` between the dict fields and the choices.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import signal
from collections.abc import Mapping
from enum import Enum
from typing import Any, cast

from trainwright.args import parallelism
from trainwright.args.accelerator_config import AcceleratorConfig
from trainwright.args.aliases import resolve_old_names, warn_once
from trainwright.args.checks import (
    DDP_BACKENDS,
    DEFAULT_PREEMPTION_SIGNALS,
    DICT_FIELDS,
    HALF_PRECISION_BACKENDS,
    LOG_LEVELS,
    METRIC_INPUTS,
    MP_CONTEXTS,
    SAMPLING_STRATEGIES,
    TOKENS_SEEN,
    check_int,
    choice,
    dict_from_string,
    feature,
    invalid,
    is_finite,
    is_int,
    is_number,
    one_of,
    words,
)
from trainwright.core.enums import (
    FSDP_SHARDING_STRATEGIES,
    DebugOption,
    FSDPOption,
    HubStrategy,
    IntervalStrategy,
    OptimizerNames,
    SaveStrategy,
    SchedulerType,
)
from trainwright.core.units import parse_size

logger = logging.getLogger(__name__)


def validate(args: Any) -> None:
    """Every check and normalisation of a `TrainingArguments`, in order (its `__post_init__`)."""
    _check_word_lists(args)
    _resolve_paths(args)
    _parse_dict_fields(args)
    resolve_old_names(args)
    _resolve_choices(args)
    _check_batches_and_length(args)
    _resolve_intervals(args)
    _resolve_best_model(args)
    _check_optimization(args)
    _resolve_precision_and_compile(args)
    _check_distributed(args)
    _resolve_reporting_and_io(args)


def validate_seq2seq(args: Any) -> None:
    """What `Seq2SeqTrainingArguments` adds, after `validate`."""
    if args.sortish_sampler:
        _sortish_is_group_by_length(args)
    check_int(args, "generation_max_length", 1, optional=True)
    check_int(args, "generation_num_beams", 1, optional=True)
    if isinstance(args.generation_config, os.PathLike):
        args.generation_config = os.fspath(args.generation_config)
    if isinstance(args.generation_config, str) and args.generation_config.strip().startswith("{"):
        args.generation_config = dict_from_string(args, "generation_config", args.generation_config)


_SAID: set[str] = set()


def _sortish_is_group_by_length(args: Any) -> None:
    """v4 scripts pass sortish_sampler=True (upstream now ignores it): give it its meaning, batches of
    similar lengths with randomness, which is the group_by_length sampler."""
    if args.train_sampling_strategy == "sequential":
        raise invalid(
            args,
            "sortish_sampler",
            "it shuffles batches of similar lengths, and train_sampling_strategy='sequential' keeps the "
            "dataset's order: give only one",
        )
    args.train_sampling_strategy, args.group_by_length = "group_by_length", True
    if "sortish_sampler" not in _SAID:
        _SAID.add("sortish_sampler")
        logger.warning(
            "sortish_sampler=True: training batches are drawn by length, similar lengths together with "
            "randomness (the sampler of train_sampling_strategy='group_by_length', lengths from "
            "length_column_name or input_ids). transformers 5 ignores sortish_sampler."
        )


# -- paths and dict-valued fields --------------------------------------------------------------

# fields given as words: a string ("a b"), a list or tuple of them, None (fsdp also True / False)
_WORD_LISTS = ("debug", "fsdp", "include_for_metrics", "label_names")


def _check_word_lists(args: Any) -> None:
    for name in _WORD_LISTS:
        value = getattr(args, name)
        if (
            value is None
            or isinstance(value, (str, list, tuple))
            or (name == "fsdp" and isinstance(value, bool))
        ):
            continue
        raise invalid(args, name, "expected a string of space-separated words or a list of them")


def _resolve_paths(args: Any) -> None:
    if args.output_dir is None:
        args.output_dir = "trainer_output"
    for name in ("output_dir", "logging_dir"):
        value = getattr(args, name)
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise invalid(args, name, "a folder path (a string)")
    # Expanding ~ here keeps os.makedirs from creating a literal "~" folder; nothing is created.
    args.output_dir = os.path.expanduser(os.fspath(args.output_dir))
    if args.logging_dir is not None:
        args.logging_dir = os.path.expanduser(os.fspath(args.logging_dir))
    if isinstance(args.resume_from_checkpoint, os.PathLike):
        args.resume_from_checkpoint = os.fspath(args.resume_from_checkpoint)


def _parse_dict_fields(args: Any) -> None:
    for name in DICT_FIELDS:
        value = getattr(args, name)
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if isinstance(value, str):
            value = dict_from_string(args, name, value)
        elif isinstance(value, Mapping):
            value = copy.deepcopy(dict(value))  # never mutate the caller's dict
        elif hasattr(value, "to_dict") and callable(value.to_dict):
            value = dict(value.to_dict())  # e.g. transformers' AcceleratorConfig
        elif value is not None:
            raise invalid(args, name, "expected a dict or a JSON object string")
        setattr(args, name, value)
    if args.lr_scheduler_kwargs is None:
        args.lr_scheduler_kwargs = {}
    if args.fsdp_config is None:
        args.fsdp_config = {}
    args.fsdp_config = {
        (k[5:] if k.startswith("fsdp_") else k): v
        for k, v in cast(dict[str, Any], args.fsdp_config).items()  # a dict since _parse_dict_fields
    }
    # An AcceleratorConfig (accelerator_config.py): read by attribute or as a dict; refused
    # settings raise here, gradient_accumulation_kwargs["num_steps"] sets the accumulation.
    # (the field is annotated with what the constructor and the command line take; from here on
    # it holds the AcceleratorConfig, which its annotation cannot say)
    accelerator_config = AcceleratorConfig.from_mapping(
        cast(Mapping[str, Any], args.accelerator_config or {}), type(args).__name__
    )
    args.accelerator_config = cast(Any, accelerator_config)
    steps = (accelerator_config.gradient_accumulation_kwargs or {}).get("num_steps")
    if steps is not None and steps != args.gradient_accumulation_steps:
        if args.gradient_accumulation_steps != 1:
            raise invalid(
                args,
                "gradient_accumulation_steps",
                f"accelerator_config's gradient_accumulation_kwargs num_steps={steps} also sets it; give one",
            )
        args.gradient_accumulation_steps = steps
    _check_data_settings(args, accelerator_config)


def _check_data_settings(args: Any, config: AcceleratorConfig) -> None:
    """accelerator_config's data settings that another argument would contradict."""
    if not config.use_seedable_sampler and args.data_seed is not None:
        raise invalid(
            args,
            "data_seed",
            "accelerator_config use_seedable_sampler=False draws the shuffling seed from torch's global RNG, "
            "so data_seed would not be used; leave one of them unset",
        )
    if not config.even_batches and (args.fsdp or args.deepspeed or args.parallelism_config is not None):
        raise ValueError(
            f"{type(args).__name__}: accelerator_config['even_batches']=False is not supported with fsdp, "
            "deepspeed or parallelism_config: a sharded model's forward is collective, so every process must "
            "run the same number "
            "of batches, which only even_batches=True guarantees"
        )


# -- choice-valued fields --------------------------------------------------------------------


def _resolve_choices(args: Any) -> None:
    args.eval_strategy = choice(args, "eval_strategy", IntervalStrategy)
    args.logging_strategy = choice(args, "logging_strategy", IntervalStrategy)
    args.save_strategy = choice(args, "save_strategy", SaveStrategy)
    args.hub_strategy = choice(args, "hub_strategy", HubStrategy)
    args.lr_scheduler_type = choice(args, "lr_scheduler_type", SchedulerType)
    if isinstance(args.optim, Enum):  # ours or transformers' OptimizerNames: str() is not the value
        args.optim = args.optim.value
    if args.optim == OptimizerNames.ADAMW_HF:
        warn_once("adamw_hf", 'optim="adamw_hf" is the old name of "adamw_torch"; using "adamw_torch".')
        args.optim = "adamw_torch"
    if str(args.optim) not in OptimizerNames.values():
        allowed = [v for v in OptimizerNames.values() if v != "adamw_hf"]
        raise invalid(args, "optim", f"not an optimizer trainwright provides; choose one of {allowed}")
    args.optim = OptimizerNames(args.optim)
    args.debug = [choice(args, "debug", DebugOption, w) for w in words(args.debug)]
    _resolve_fsdp(args)
    if isinstance(args.include_num_input_tokens_seen, bool):
        args.include_num_input_tokens_seen = "all" if args.include_num_input_tokens_seen else "no"
    one_of(args, "include_num_input_tokens_seen", TOKENS_SEEN)
    one_of(args, "train_sampling_strategy", SAMPLING_STRATEGIES)
    args.group_by_length = args.train_sampling_strategy == "group_by_length"  # the v4 name reads it back
    if isinstance(args.include_for_metrics, str):
        args.include_for_metrics = [args.include_for_metrics]
    args.include_for_metrics = list(dict.fromkeys(args.include_for_metrics or []))
    bad = [m for m in args.include_for_metrics if m not in METRIC_INPUTS]
    if bad:
        raise invalid(args, "include_for_metrics", f"unknown entries {bad}; allowed: {METRIC_INPUTS}")
    if isinstance(args.label_names, str):
        args.label_names = [args.label_names]
    one_of(args, "log_level", list(LOG_LEVELS))
    one_of(args, "log_level_replica", list(LOG_LEVELS))
    one_of(args, "half_precision_backend", HALF_PRECISION_BACKENDS)
    if args.half_precision_backend == "apex":
        raise invalid(
            args,
            "half_precision_backend",
            "apex is not used: mixed precision is torch.amp ('auto' or 'cpu_amp')",
        )
    one_of(args, "ddp_backend", DDP_BACKENDS, optional=True)
    one_of(args, "dataloader_multiprocessing_context", MP_CONTEXTS, optional=True)


def _resolve_fsdp(args: Any) -> None:
    value = args.fsdp
    given = [FSDPOption.FULL_SHARD] if value is True else [] if value is False else words(value)
    options = list(dict.fromkeys(choice(args, "fsdp", FSDPOption, w) for w in given))
    strategies = [o.value for o in options if o in FSDP_SHARDING_STRATEGIES]
    if len(strategies) > 1:
        raise invalid(args, "fsdp", f"names several sharding strategies {strategies}; give one")
    if options and not strategies:
        options.insert(0, FSDPOption.FULL_SHARD)  # offload/auto_wrap alone mean full sharding
    args.fsdp = options
    fsdp_config = cast(dict[str, Any], args.fsdp_config)  # a dict since _parse_dict_fields
    wrap = fsdp_config.get("transformer_layer_cls_to_wrap")
    if isinstance(wrap, str):
        fsdp_config["transformer_layer_cls_to_wrap"] = [wrap]


# -- batches, length of training, seeds --------------------------------------------------------


def _check_batches_and_length(args: Any) -> None:
    for name in (
        "per_device_train_batch_size",
        "per_device_eval_batch_size",
        "gradient_accumulation_steps",
    ):
        check_int(args, name, 1)
    check_int(args, "eval_accumulation_steps", 1, optional=True)
    check_int(args, "dataloader_num_workers", 0)
    if args.dataloader_prefetch_factor is not None and args.dataloader_num_workers == 0:
        raise invalid(args, "dataloader_prefetch_factor", "only valid with dataloader_num_workers > 0")
    check_int(args, "dataloader_prefetch_factor", 1, optional=True)
    if not is_finite(args.dataloader_timeout) or args.dataloader_timeout < 0:
        raise invalid(args, "dataloader_timeout", "expected a number of seconds >= 0 (0: wait forever)")
    if args.dataloader_timeout > 0 and args.dataloader_num_workers == 0:
        raise invalid(args, "dataloader_timeout", "only applies with dataloader_num_workers > 0")
    if args.dataloader_multiprocessing_context is not None and args.dataloader_num_workers == 0:
        raise invalid(
            args, "dataloader_multiprocessing_context", "only applies with dataloader_num_workers > 0"
        )
    if args.dataloader_in_order is False and args.dataloader_num_workers > 0:
        logger.warning(
            "dataloader_in_order=False: workers return batches as they finish, so a checkpoint's "
            "position may not match the batches seen so far; a resume can repeat or skip those few batches."
        )
    if is_number(args.max_steps) and float(args.max_steps).is_integer():
        args.max_steps = int(args.max_steps)
    if not is_int(args.max_steps):
        raise invalid(args, "max_steps", "expected an integer (-1: use num_train_epochs)")
    if not is_finite(args.num_train_epochs) or (args.max_steps <= 0 and args.num_train_epochs <= 0):
        raise invalid(args, "num_train_epochs", "expected a finite number > 0 (or max_steps > 0)")
    check_int(args, "torch_empty_cache_steps", 1, optional=True)
    check_int(args, "past_index", -1)
    _check_model_path(args)
    check_int(args, "save_total_limit", 1, optional=True)
    check_int(args, "ddp_timeout", 1)
    for name in ("seed", "data_seed"):
        value = getattr(args, name)
        if (value is not None or name == "seed") and (not is_int(value) or not 0 <= value < 2**32):
            raise invalid(args, name, "expected an integer in [0, 2**32)")


def _check_model_path(args: Any) -> None:
    """The arguments that change the model's forward: NEFTune, Liger, the fused loss, padding-free."""
    alpha = args.neftune_noise_alpha
    if alpha is not None and (not is_number(alpha) or alpha <= 0):
        raise invalid(args, "neftune_noise_alpha", "expected None or a number > 0 (the paper used 5 to 15)")
    if args.liger_kernel_config and not args.use_liger_kernel:
        raise invalid(args, "liger_kernel_config", "it is only used with use_liger_kernel=True: set that too")
    for name in ("fused_linear_cross_entropy", "padding_free", "lean_activations"):
        if not isinstance(getattr(args, name), bool):
            raise invalid(args, name, "expected True or False")
    if feature(args, "fused_linear_cross_entropy") and args.use_liger_kernel:
        raise invalid(
            args,
            "fused_linear_cross_entropy",
            "use_liger_kernel=True already fuses the head's loss with Liger's kernel: set one of the two",
        )


# -- logging / evaluation / save intervals ---------------------------------------------------


def _resolve_intervals(args: Any) -> None:
    if args.eval_strategy != IntervalStrategy.NO:
        args.do_eval = True
    if args.eval_strategy == IntervalStrategy.STEPS and not args.eval_steps:
        if not args.logging_steps or args.logging_steps <= 0:
            raise invalid(
                args,
                "eval_steps",
                "eval_strategy='steps' needs eval_steps > 0 (or logging_steps > 0 to fall back on)",
            )
        args.eval_steps = args.logging_steps
    _check_interval(
        args, "logging_steps", args.logging_strategy == IntervalStrategy.STEPS, "logging_strategy"
    )
    _check_interval(args, "eval_steps", args.eval_strategy == IntervalStrategy.STEPS, "eval_strategy")
    _check_interval(args, "save_steps", args.save_strategy == SaveStrategy.STEPS, "save_strategy")
    if not is_number(args.eval_delay) or args.eval_delay < 0:
        raise invalid(args, "eval_delay", "expected a number >= 0")


def _check_interval(args: Any, name: str, used: bool, strategy: str) -> None:
    value = getattr(args, name)
    if value is None:
        return
    if not is_finite(value):
        raise invalid(
            args, name, "expected a finite number: an integer step count, or a fraction < 1 of the run"
        )
    if used and value <= 0:
        raise invalid(args, name, f"{strategy}='steps' needs {name} > 0 (or set {strategy}='no')")
    if value > 1 and not float(value).is_integer():
        raise invalid(
            args, name, "a value above 1 must be a whole number of steps (below 1 it is a fraction)"
        )
    if value >= 1:
        setattr(args, name, int(value))


# -- best model ------------------------------------------------------------------------------------


def _resolve_best_model(args: Any) -> None:
    plateau = args.lr_scheduler_type in (SchedulerType.REDUCE_ON_PLATEAU, SchedulerType.GREEDY)
    if (args.load_best_model_at_end or plateau) and args.metric_for_best_model is None:
        args.metric_for_best_model = "loss"
    if args.greater_is_better is None and args.metric_for_best_model is not None:
        args.greater_is_better = not args.metric_for_best_model.endswith("loss")
    if args.save_strategy == SaveStrategy.BEST and args.metric_for_best_model is None:
        raise invalid(  # upstream's sentence, which scripts and tests look for
            args,
            "save_strategy",
            "`args.metric_for_best_model` must be provided when using 'best' save_strategy or if "
            "`args.load_best_model_at_end` is set to `True` (the metric to compare).",
            args.save_strategy.value,
        )
    if plateau and args.eval_strategy == IntervalStrategy.NO:
        raise invalid(  # upstream's sentence: "lr_scheduler_type greedy requires an eval strategy"
            args,
            "lr_scheduler_type",
            f"lr_scheduler_type {args.lr_scheduler_type.value} requires an eval strategy (eval_strategy "
            "other than 'no'): it is stepped with the evaluation metric",
            args.lr_scheduler_type.value,
        )
    if args.load_best_model_at_end and args.save_strategy != SaveStrategy.BEST:
        _check_best_model_schedule(args)


def _check_best_model_schedule(args: Any) -> None:
    if args.eval_strategy != args.save_strategy:
        raise ValueError(
            f"{type(args).__name__}: load_best_model_at_end needs eval_strategy and save_strategy to match "
            f"(or save_strategy='best'); got eval_strategy={cast(Enum, args.eval_strategy).value!r}, "
            f"save_strategy={cast(Enum, args.save_strategy).value!r}"
        )
    if args.eval_strategy != IntervalStrategy.STEPS:
        return
    save, every = args.save_steps, args.eval_steps
    assert every is not None  # _resolve_intervals set it (to logging_steps when None)
    if (save < 1) != (every < 1):
        raise ValueError(
            f"{type(args).__name__}: load_best_model_at_end needs save_steps to be a multiple of eval_steps, "
            f"which cannot be guaranteed when one is a fraction: save_steps={save}, eval_steps={every}"
        )
    # Fractions are compared in millionths so that 0.2 vs 0.1 does not fail on float rounding.
    scale = 1 if save >= 1 else 1_000_000
    if round(save * scale) % round(every * scale) != 0:
        raise ValueError(
            f"{type(args).__name__}: load_best_model_at_end needs save_steps to be a multiple of eval_steps; "
            f"got save_steps={save}, eval_steps={every}"
        )


# -- optimization ----------------------------------------------------------------------------------


def _check_optimization(args: Any) -> None:
    if not is_finite(args.learning_rate) or args.learning_rate < 0:
        raise invalid(args, "learning_rate", "expected a finite number >= 0")
    if not is_finite(args.weight_decay):
        raise invalid(args, "weight_decay", "expected a finite number")
    if args.max_grad_norm is not None and (not is_finite(args.max_grad_norm) or args.max_grad_norm < 0):
        raise invalid(args, "max_grad_norm", "expected a finite number >= 0 (0 or None: no clipping)")
    for beta in ("adam_beta1", "adam_beta2"):
        if not is_finite(getattr(args, beta)) or not 0 <= getattr(args, beta) < 1:
            raise invalid(args, beta, "expected a number in [0, 1)")
    if not is_finite(args.adam_epsilon) or args.adam_epsilon < 0:
        raise invalid(args, "adam_epsilon", "expected a finite number >= 0")
    _resolve_warmup(args)
    if not is_number(args.label_smoothing_factor) or not 0 <= args.label_smoothing_factor < 1:
        raise invalid(args, "label_smoothing_factor", "expected a number in [0, 1)")


def _resolve_warmup(args: Any) -> None:
    """warmup_steps: a step count, or a fraction < 1 of the run; warmup_ratio: v4's fraction."""
    if not is_finite(args.warmup_steps) or args.warmup_steps < 0:
        raise invalid(args, "warmup_steps", "expected >= 0: a step count, or a fraction < 1 of the run")
    if args.warmup_steps >= 1:
        if not float(args.warmup_steps).is_integer():
            raise invalid(args, "warmup_steps", "a value of 1 or more must be a whole number of steps")
        args.warmup_steps = int(args.warmup_steps)
    elif args.warmup_steps == 0:
        args.warmup_steps = 0
    if args.warmup_ratio is None:  # unset (a library's subclass declares it so, as v5 has no field)
        return
    if not is_number(args.warmup_ratio) or not 0 <= args.warmup_ratio <= 1:
        raise invalid(args, "warmup_ratio", "expected a fraction in [0, 1] (or None: unset)")
    if args.warmup_ratio > 0:
        warn_once(
            "warmup_ratio", "warmup_ratio is the v4 name; v5 takes a fraction in warmup_steps (e.g. 0.1)."
        )
        if isinstance(args.warmup_steps, float):
            raise ValueError(
                f"{type(args).__name__}: warmup_ratio={args.warmup_ratio} and the fraction "
                f"warmup_steps={args.warmup_steps} both set the warmup; give only warmup_steps"
            )
        if args.warmup_steps > 0:
            logger.warning("warmup_steps=%s overrides warmup_ratio=%s", args.warmup_steps, args.warmup_ratio)


# -- precision and compilation -------------------------------------------------------------------


def _resolve_precision_and_compile(args: Any) -> None:
    if args.fp16 and args.bf16:
        raise ValueError(
            f"{type(args).__name__}: fp16=True and bf16=True; at most one of fp16 and bf16 may be set"
        )
    if args.fp16_full_eval and args.bf16_full_eval:
        raise ValueError(
            f"{type(args).__name__}: fp16_full_eval=True and bf16_full_eval=True; at most one may be set"
        )
    if args.torch_compile_backend is not None or args.torch_compile_mode is not None:
        args.torch_compile = True
    if args.torch_compile and args.torch_compile_backend is None:
        args.torch_compile_backend = "inductor"


# -- distributed -----------------------------------------------------------------------------------


def _check_distributed(args: Any) -> None:
    if args.fsdp and args.deepspeed:
        raise ValueError(f"{type(args).__name__}: fsdp and deepspeed are both set; choose one of them")
    if args.auto_find_batch_size and (args.fsdp or args.deepspeed):
        raise invalid(
            args,
            "auto_find_batch_size",
            "not supported with fsdp or deepspeed: a retry after an out-of-memory error would shard or "
            "re-initialise a model the failed try already sharded. Set per_device_train_batch_size instead",
        )
    parallelism.check(args)
    if args.sharded_ddp:
        raise invalid(
            args,
            "sharded_ddp",
            "FairScale's sharded DDP (transformers < 4.35) is not provided; use fsdp "
            '(e.g. fsdp="full_shard" for zero_dp_3, fsdp="shard_grad_op" for zero_dp_2)',
        )
    env_local_rank = os.environ.get("LOCAL_RANK")
    if args.local_rank != -1:
        check_int(args, "local_rank", 0)
        if args.local_rank != (int(env_local_rank) if env_local_rank not in (None, "") else 0):
            raise invalid(
                args,
                "local_rank",
                f"this process's LOCAL_RANK is {env_local_rank!r} (what the runtime uses); launch with "
                "torchrun, which sets LOCAL_RANK, and leave local_rank at -1",
            )
    if args.project != "huggingface":
        raise invalid(
            args,
            "project",
            "upstream only the trackio reporter reads it, and trainwright has no trackio reporter; "
            "name the project through the reporter's own setting (WANDB_PROJECT, COMET_PROJECT_NAME, ...)",
        )
    for name, accepted in (
        ("trackio_space_id", (None, "trackio")),  # "trackio": v4's default, in v4 training_args.json
        ("trackio_bucket_id", (None,)),
        ("trackio_static_space_id", (None, False)),
    ):
        if getattr(args, name) not in accepted:
            raise invalid(
                args,
                name,
                "only the trackio reporter reads it upstream, and trainwright has no trackio reporter",
            )
    # Ray Tune's scopes for picking the best trial (hyperparameter_search(backend="ray"))
    if args.ray_scope is not None and not re.fullmatch(r"all|last|avg|last-\d+-avg", args.ray_scope):
        raise invalid(args, "ray_scope", 'one of Ray Tune\'s scopes: "last", "all", "avg", "last-<n>-avg"')


# -- reporting, output and signals -----------------------------------------------------------


def _resolve_reporting_and_io(args: Any) -> None:
    if args.report_to is not None and not (
        isinstance(args.report_to, str)
        or (isinstance(args.report_to, (list, tuple)) and all(isinstance(n, str) for n in args.report_to))
    ):
        raise invalid(args, "report_to", 'a name ("tensorboard"), a list of names, "all" or "none"')
    args.report_to = _normalise_report_to(args.report_to)
    if args.disable_tqdm is None:
        args.disable_tqdm = logging.getLogger("trainwright").getEffectiveLevel() > logging.WARNING
    if args.use_cpu:
        args.dataloader_pin_memory = False
    elif cast(AcceleratorConfig, args.accelerator_config).non_blocking and not args.dataloader_pin_memory:
        logger.warning(
            "accelerator_config non_blocking=True but dataloader_pin_memory=False: copies from pageable "
            "memory are not asynchronous; enable both for the best performance."
        )
    try:
        parse_size(args.save_max_shard_size)  # the parser the checkpoint writer uses
    except ValueError as e:
        raise invalid(args, "save_max_shard_size", str(e)) from None
    if args.preemption_signals is None:  # not given: an explicit enable_jit_checkpoint=False turns it off
        off = args.enable_jit_checkpoint is False
        args.preemption_signals = [] if off else list(DEFAULT_PREEMPTION_SIGNALS)
    args.preemption_signals = _normalise_signals(args, args.preemption_signals)


def _normalise_report_to(value: Any) -> list[str]:
    if value is None:
        return []
    names = value.split(",") if isinstance(value, str) else list(value)
    names = [str(n).strip() for n in names if str(n).strip()]
    return list(dict.fromkeys(n for n in names if n != "none"))


def _normalise_signals(args: Any, value: Any) -> list[str]:
    if value is None:
        return []
    items = value.replace(",", " ").split() if isinstance(value, str) else list(value)
    names = []
    for item in items:
        if is_int(item):
            try:
                name = signal.Signals(int(item)).name
            except ValueError:
                raise invalid(args, "preemption_signals", f"{item} is not a signal number here") from None
        else:
            name = str(item).strip().upper()
            name = name if name.startswith("SIG") else "SIG" + name
        if name not in signal.Signals.__members__:
            raise invalid(args, "preemption_signals", f"{item!r} is not a signal name on this platform")
        if name in ("SIGKILL", "SIGSTOP"):
            raise invalid(args, "preemption_signals", f"{name} cannot be caught")
        names.append(name)
    return list(dict.fromkeys(names))
