"""Every field of `TrainingArguments` / `Seq2SeqTrainingArguments` is either exercised by a behaviour
test (BEHAVIOUR_TESTS: field -> "tests/file.py::test_name", a test that sets the field and checks what
a run does with it) or refused (REFUSED: a non-default value that validation must reject, naming the
field). A field in neither is accepted and silently ignored, which this test reports.

The registry was built by grepping the suite for each field and reading the tests found; a field is
only listed where a test really sets it and checks its effect. NO_EFFECT_WARNED are v4 options that
are accepted with a warning saying they have no effect (their test checks that warning).
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import pytest
from kit import ROOT

from trainwright.args.aliases import REMOVED_V4_ARGS
from trainwright.args.training_args import Seq2SeqTrainingArguments, TrainingArguments

_DEFAULTS = "tests/args/test_args_defaults.py"
_OLD = "tests/args/test_args_old_names.py"
_RUNTIME = "tests/args/test_args_runtime.py"
_FIELDS = "tests/args/test_args_fields.py"
_MEMORY = "tests/args/test_args_loop_memory.py"
_HOOKS = "tests/args/test_args_loop_model_hooks.py"
_OUTPUTS = "tests/args/test_args_loop_outputs.py"
_DIST = "tests/distributed/test_distributed.py"
_HUB = "tests/loop/hub/test_hub.py"
_OLD_NAMES = f"{_OLD}::test_old_names_map_onto_new_fields_with_a_warning"

BEHAVIOUR_TESTS: dict[str, str] = {
    "sortish_sampler": "tests/loop/test_upstream_contract.py::test_sortish_sampler_is_the_group_by_length_sampler",
    "ray_scope": "tests/loop/search/test_hpo_ray.py::test_ray_scope_picks_the_best_trial_by_that_scope",
    # output and phases
    "output_dir": f"{_FIELDS}::test_resume_from_checkpoint_argument_is_what_train_resumes_from",
    "overwrite_output_dir": f"{_FIELDS}::test_script_only_fields_read_back_and_do_not_change_training",
    "do_train": f"{_FIELDS}::test_script_only_fields_read_back_and_do_not_change_training",
    "do_eval": f"{_DEFAULTS}::test_do_eval_and_eval_steps_fall_back",
    "do_predict": f"{_FIELDS}::test_script_only_fields_read_back_and_do_not_change_training",
    "resume_from_checkpoint": f"{_FIELDS}::test_resume_from_checkpoint_argument_is_what_train_resumes_from",
    "parallelism_config": "tests/distributed/test_parallelism.py::test_four_process_layouts_match_one_process",
    # batches and length
    "per_device_train_batch_size": f"{_DIST}::test_ddp_two_processes_match_one_process_with_the_same_global_batch",
    "per_device_eval_batch_size": "tests/loop/eval/test_trainer_eval.py::test_predictions_of_different_lengths_are_padded",
    "gradient_accumulation_steps": "tests/loop/test_trainer_loop.py::test_accumulation_equals_full_batch_with_uneven_tokens",
    "eval_accumulation_steps": "tests/loop/eval/test_trainer_eval.py::test_predictions_of_different_lengths_are_padded",
    "auto_find_batch_size": f"{_MEMORY}::test_auto_find_batch_size_shrinks_records_and_resumes_with_the_found_size",
    "num_train_epochs": "tests/loop/test_trainer_loop.py::test_fractional_epochs_and_state_epoch",
    "max_steps": "tests/callbacks/test_callbacks_core.py::test_stop_at_max_steps_mid_epoch",
    # optimizer and schedule
    "learning_rate": "tests/loop/test_trainer_loop.py::test_last_partial_logging_window_is_logged_and_lr_is_the_applied_one",
    "weight_decay": "tests/loop/test_trainer_loop.py::test_weight_decay_skips_biases_and_norms",
    "adam_beta1": "tests/optim/test_optim.py::test_adamw_kwargs_and_alias",
    "adam_beta2": "tests/optim/test_optim.py::test_adamw_kwargs_and_alias",
    "adam_epsilon": "tests/optim/test_optim.py::test_adamw_kwargs_and_alias",
    "max_grad_norm": f"{_FIELDS}::test_max_grad_norm_clips_the_update",
    "optim": "tests/optim/test_optim.py::test_optimizer_names_map_to_classes",
    "optim_args": "tests/optim/test_optim.py::test_optim_args_reach_the_optimizer",
    "optim_target_modules": "tests/optim/test_optim_low_rank.py::test_layerwise_steps_in_the_backward_and_follows_the_schedule",
    "lr_scheduler_type": "tests/loop/test_trainer_loop.py::test_last_partial_logging_window_is_logged_and_lr_is_the_applied_one",
    "lr_scheduler_kwargs": f"{_FIELDS}::test_lr_scheduler_kwargs_reach_the_schedule",
    "warmup_steps": "tests/loop/test_trainer_loop.py::test_last_partial_logging_window_is_logged_and_lr_is_the_applied_one",
    "warmup_ratio": f"{_DEFAULTS}::test_get_warmup_steps",
    "label_smoothing_factor": "tests/loop/test_trainer_loop.py::test_label_smoothing_changes_the_loss",
    "average_tokens_across_devices": f"{_DIST}::test_ddp_token_weighted_accumulation_equals_the_full_batch_update",
    "neftune_noise_alpha": f"{_HOOKS}::test_neftune_changes_training_and_seeded_runs_repeat",
    # precision, memory, compilation
    "bf16": f"{_DIST}::test_fsdp_bf16_computes_in_bfloat16",
    "fp16": "tests/loop/test_trainer_loop.py::test_fp16_skipped_step_is_attempted_not_applied",
    "bf16_full_eval": f"{_FIELDS}::test_full_eval_evaluates_in_half_precision_and_trains_in_fp32",
    "fp16_full_eval": f"{_FIELDS}::test_full_eval_evaluates_in_half_precision_and_trains_in_fp32",
    "tf32": f"{_FIELDS}::test_tf32_sets_torchs_matmul_and_cudnn_flags",
    "activation_checkpointing": f"{_FIELDS}::test_activation_checkpointing_and_its_kwargs_reach_the_model",
    "activation_checkpointing_kwargs": f"{_FIELDS}::test_activation_checkpointing_and_its_kwargs_reach_the_model",
    "gradient_checkpointing": "tests/loop/test_trainer_hf.py::test_gradient_checkpointing_and_num_input_tokens",
    "gradient_checkpointing_kwargs": _OLD_NAMES,
    "torch_compile": f"{_FIELDS}::test_torch_compile_backend_and_mode_reach_torch_compile",
    "torch_compile_backend": f"{_FIELDS}::test_torch_compile_backend_and_mode_reach_torch_compile",
    "torch_compile_mode": f"{_FIELDS}::test_torch_compile_backend_and_mode_reach_torch_compile",
    "torch_empty_cache_steps": f"{_MEMORY}::test_torch_empty_cache_steps_empties_the_cache_on_schedule",
    "use_liger_kernel": f"{_HOOKS}::test_use_liger_kernel_patches_a_llama_and_trains",
    "liger_kernel_config": f"{_HOOKS}::test_use_liger_kernel_patches_a_llama_and_trains",
    "use_cache": f"{_FIELDS}::test_use_cache_is_written_to_the_model_config",
    "fused_linear_cross_entropy": "tests/modeling/test_model_path_trainer.py::"
    "test_fused_training_equals_the_models_own_and_never_computes_logits",
    "lean_activations": "tests/modeling/test_lean_activations.py::test_lean_activations_train_like_the_model_and_give_it_back",
    # logging
    "logging_strategy": "tests/callbacks/test_callbacks_core.py::test_no_logging_strategy_logs_nothing",
    "logging_steps": "tests/callbacks/test_callbacks_core.py::test_logging_steps_and_final_partial_window",
    "logging_first_step": "tests/callbacks/test_callbacks_core.py::test_logging_first_step",
    "logging_nan_inf_filter": "tests/loop/test_nothing_silent.py::test_a_window_of_only_nan_steps_is_nan_or_filtered_never_zero",
    "logging_dir": "tests/reporters/test_reporters_tensorboard.py::test_logging_dir_argument_and_trial_subfolders",
    "log_on_each_node": f"{_DIST}::test_two_nodes_over_loopback_train_like_one_node",
    "log_level": f"{_FIELDS}::test_log_level_sets_trainwright_and_transformers_levels",
    "log_level_replica": f"{_RUNTIME}::test_process_log_level",
    "disable_tqdm": f"{_FIELDS}::test_disable_tqdm_picks_the_printer_or_the_progress_bars",
    "include_num_input_tokens_seen": "tests/loop/test_trainer_hf.py::test_gradient_checkpointing_and_num_input_tokens",
    "include_tokens_per_second": f"{_OUTPUTS}::test_include_tokens_per_second_is_tokens_over_runtime",
    "skip_memory_metrics": "tests/observe/test_trainer_observability.py::test_memory_report_catches_a_temporary_peak_and_ignores_nested_eval",
    "report_to": "tests/reporters/test_reporters_trainer.py::test_jsonl_rows_match_log_history_and_resume_does_not_duplicate",
    "run_name": "tests/reporters/test_reporters_wandb.py::test_offline_run_config_history_and_summary",
    # evaluation
    "eval_strategy": "tests/callbacks/test_callbacks_core.py::test_eval_steps_with_delay_and_final_step_eval",
    "eval_steps": "tests/callbacks/test_callbacks_core.py::test_eval_steps_with_delay_and_final_step_eval",
    "eval_delay": "tests/callbacks/test_callbacks_core.py::test_eval_steps_with_delay_and_final_step_eval",
    "eval_on_start": f"{_FIELDS}::test_eval_on_start_evaluates_before_the_first_step",
    "prediction_loss_only": "tests/loop/eval/test_trainer_eval.py::test_eval_during_training_and_prediction_loss_only",
    "eval_do_concat_batches": f"{_FIELDS}::test_eval_do_concat_batches_false_returns_the_batches",
    "eval_use_gather_object": "tests/args/test_accelerator_config.py::"
    "test_sync_each_batch_num_steps_eval_use_gather_object_find_unused_with_two_processes",
    "include_for_metrics": f"{_FIELDS}::test_include_for_metrics_passes_inputs_and_losses_to_compute_metrics",
    "batch_eval_metrics": "tests/loop/eval/test_trainer_eval.py::test_preprocess_logits_and_batch_eval_metrics",
    "label_names": "tests/loop/eval/test_trainer_eval.py::test_predict_outputs_and_labels",
    "past_index": f"{_OUTPUTS}::test_past_index_feeds_outputs_back_as_mems_and_resets",
    # checkpoints
    "save_strategy": "tests/callbacks/test_callbacks_core.py::test_save_steps_and_save_at_end",
    "save_steps": "tests/callbacks/test_callbacks_core.py::test_save_steps_and_save_at_end",
    "save_total_limit": "tests/checkpoint/test_resume.py::test_rotation_keeps_best_and_newest_and_load_best_model_at_end",
    "save_on_each_node": f"{_DIST}::test_two_nodes_over_loopback_train_like_one_node",
    "save_only_model": "tests/checkpoint/test_resume_rules.py::test_a_checkpoint_without_optimizer_is_refused_unless_opted_in",
    "save_max_shard_size": f"{_HUB}::test_sharded_checkpoint_pushes_its_index_and_every_shard",
    "async_save": "tests/checkpoint/test_checkpoint_async_trainer.py::test_on_save_fires_once_per_checkpoint_when_it_is_durable",
    "preemption_signals": f"{_FIELDS}::test_without_enable_jit_checkpoint_sigterm_is_not_handled",
    "enable_jit_checkpoint": f"{_FIELDS}::test_enable_jit_checkpoint_saves_on_sigterm_and_stops",
    "restore_callback_states_from_checkpoint": f"{_FIELDS}::"
    "test_restore_callback_states_from_checkpoint_restores_constructor_args",
    "load_best_model_at_end": "tests/checkpoint/test_resume.py::test_rotation_keeps_best_and_newest_and_load_best_model_at_end",
    "metric_for_best_model": "tests/callbacks/test_callbacks_core.py::test_early_stopping_greater_is_better",
    "greater_is_better": "tests/callbacks/test_callbacks_core.py::test_early_stopping_greater_is_better",
    "ignore_data_skip": "tests/checkpoint/test_resume.py::test_resume_with_other_batch_geometry_continues_or_restarts_the_epoch",
    # reproducibility
    "seed": "tests/data/test_data_samplers.py::test_order_depends_only_on_seed_and_epoch",
    "data_seed": "tests/data/test_data_samplers.py::test_build_sampler_chooses_by_strategy",
    "full_determinism": f"{_FIELDS}::test_full_determinism_turns_on_deterministic_algorithms",
    # data loading
    "dataloader_drop_last": "tests/loop/test_nothing_silent.py::test_an_empty_training_set_is_refused_before_training",
    "dataloader_num_workers": "tests/data/test_data_loaders.py::test_resume_loads_only_remaining_samples",
    "dataloader_prefetch_factor": "tests/data/test_data_loaders.py::test_make_dataloader_settings",
    "dataloader_pin_memory": "tests/data/test_data_loaders.py::test_make_dataloader_settings",
    "dataloader_persistent_workers": "tests/data/test_data_loaders.py::test_make_dataloader_settings",
    "dataloader_multiprocessing_context": f"{_FIELDS}::test_dataloader_multiprocessing_context_reaches_the_workers",
    "dataloader_in_order": f"{_FIELDS}::test_dataloader_in_order_false_reaches_the_loader_with_a_warning",
    "dataloader_timeout": "tests/loop/test_faults_runtime.py::test_dataloader_timeout_argument",
    "remove_unused_columns": "tests/data/test_collators_real.py::test_evaluate_and_predict_take_the_collators_batches_like_dicts",
    "train_sampling_strategy": "tests/data/test_data_samplers.py::test_build_sampler_chooses_by_strategy",
    "group_by_length": "tests/loop/test_trainer_hf.py::test_group_by_length_trains_on_variable_lengths",
    "padding_free": "tests/modeling/test_model_path_trainer.py::test_padding_free_training_equals_padded_and_counts_real_tokens",
    "length_column_name": f"{_FIELDS}::test_length_column_name_is_the_column_length_grouping_reads",
    # devices and distributed
    "use_cpu": "tests/loop/test_upstream_behaviours.py::test_use_cpu_is_honoured_by_a_later_trainer_in_the_same_process",
    "local_rank": f"{_FIELDS}::test_local_rank_must_agree_with_LOCAL_RANK",
    "ddp_backend": f"{_RUNTIME}::test_runtime_is_asked_lazily_with_the_arguments",
    "ddp_timeout": f"{_DIST}::test_a_stuck_rank_fails_the_job_after_ddp_timeout",
    "ddp_bucket_cap_mb": f"{_DIST}::test_ddp_arguments_reach_distributed_data_parallel",
    "ddp_broadcast_buffers": f"{_DIST}::test_ddp_arguments_reach_distributed_data_parallel",
    "ddp_static_graph": f"{_DIST}::test_ddp_arguments_reach_distributed_data_parallel",
    "ddp_find_unused_parameters": "tests/args/test_accelerator_config.py::"
    "test_sync_each_batch_num_steps_eval_use_gather_object_find_unused_with_two_processes",
    "fsdp": f"{_DIST}::test_fsdp_full_shard_auto_wrap_matches_ddp_and_one_process",
    "fsdp_config": f"{_DIST}::test_fsdp_full_shard_auto_wrap_matches_ddp_and_one_process",
    "deepspeed": "tests/distributed/test_deepspeed.py::test_one_process_without_a_launcher",
    "accelerator_config": "tests/args/test_accelerator_config.py::"
    "test_sync_each_batch_num_steps_eval_use_gather_object_find_unused_with_two_processes",
    "debug": f"{_HOOKS}::test_underflow_overflow_reports_the_first_module_with_inf",
    # Hub
    "push_to_hub": f"{_HUB}::test_repo_created_at_construction",
    "hub_model_id": f"{_HUB}::test_repo_created_at_construction",
    "hub_strategy": f"{_HUB}::test_end_strategy_pushes_only_when_asked",
    "hub_token": f"{_HUB}::test_every_save_pushes_output_dir_in_the_background",
    "hub_private_repo": f"{_HUB}::test_repo_created_at_construction",
    "hub_always_push": f"{_HUB}::test_hub_always_push_pushes_every_save",
    "hub_revision": f"{_HUB}::test_every_save_pushes_output_dir_in_the_background",
    # old (v4) names: their behaviour is the new field's value they set
    "evaluation_strategy": f"{_OLD}::test_evaluation_strategy_maps_and_warns_once",
    "per_gpu_train_batch_size": _OLD_NAMES,
    "per_gpu_eval_batch_size": _OLD_NAMES,
    "no_cuda": _OLD_NAMES,
    "adafactor": _OLD_NAMES,
    "fp16_backend": _OLD_NAMES,
    "include_inputs_for_metrics": _OLD_NAMES,
    "torchdynamo": _OLD_NAMES,
    "push_to_hub_model_id": _OLD_NAMES,
    "push_to_hub_organization": _OLD_NAMES,
    "push_to_hub_token": _OLD_NAMES,
    "fsdp_min_num_params": _OLD_NAMES,
    "fsdp_transformer_layer_cls_to_wrap": _OLD_NAMES,
    "tpu_metrics_debug": f"{_HOOKS}::test_tpu_metrics_debug_is_refused",
    # Seq2SeqTrainingArguments
    "predict_with_generate": "tests/loop/test_trainer_hf.py::test_seq2seq_predict_with_generate",
    "generation_max_length": "tests/loop/test_trainer_hf.py::test_seq2seq_predict_with_generate",
    "generation_num_beams": "tests/loop/test_examples_summarization.py::test_summarization_like_run_summarization",
    "generation_config": "tests/loop/test_upstream_behaviours.py::test_generation_config_as_dict_folder_file_or_object",
}

# Accepted values that change nothing here (each value that would matter is refused, in REFUSED).
NO_EFFECT_WARNED: dict[str, str] = {
    "use_mps_device": f"{_OLD}::test_options_that_change_nothing_here_are_accepted",
}

# field -> a non-default value that building the arguments must refuse, naming the field.
REFUSED: dict[str, object] = {
    "sharded_ddp": "zero_dp_2",
    "project": "my-project",
    "trackio_space_id": "user/space",
    "trackio_bucket_id": "user/bucket",
    "trackio_static_space_id": "user/static-space",
    "half_precision_backend": "apex",
    "save_safetensors": False,
    "fp16_opt_level": "O2",
    "jit_mode_eval": True,
    "use_legacy_prediction_loop": True,
    "tpu_num_cores": 8,
    "mp_parameters": "x",
}


def _fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init]


# what the constructors take: the fields, and the removed v4 arguments taken at their one honoured value
ALL_FIELDS = list(
    dict.fromkeys(_fields(TrainingArguments) + _fields(Seq2SeqTrainingArguments) + list(REMOVED_V4_ARGS))
)


def _test_functions(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")
    }


def test_every_field_has_a_behaviour_test_or_is_refused():
    covered = set(BEHAVIOUR_TESTS) | set(NO_EFFECT_WARNED) | set(REFUSED)
    uncovered = [name for name in ALL_FIELDS if name not in covered]
    assert not uncovered, (
        f"{len(uncovered)} field(s) accepted without a behaviour test or a refusal: {uncovered}. "
        "Write a test that sets the field and checks its effect (tests/args/test_args_fields.py) and name it in "
        "BEHAVIOUR_TESTS, or refuse the field in validation and list it in REFUSED."
    )


def test_registry_names_only_real_fields_once():
    listed = [*BEHAVIOUR_TESTS, *NO_EFFECT_WARNED, *REFUSED]
    assert sorted(set(listed) - set(ALL_FIELDS)) == []
    assert len(listed) == len(set(listed)), "a field is listed twice"


@pytest.mark.parametrize("field_name", sorted({**BEHAVIOUR_TESTS, **NO_EFFECT_WARNED}))
def test_registered_test_exists(field_name):
    target = {**BEHAVIOUR_TESTS, **NO_EFFECT_WARNED}[field_name]
    file, _, function = target.partition("::")
    path = ROOT / file
    assert path.is_file(), f"{field_name}: {file} does not exist"
    assert function in _test_functions(path), f"{field_name}: {file} has no test function {function}"


@pytest.mark.parametrize("field_name", sorted(REFUSED))
def test_refused_field_raises_naming_it(field_name):
    defaults = {f.name: f.default for f in dataclasses.fields(Seq2SeqTrainingArguments)}
    defaults |= {name: honoured for name, (honoured, _) in REMOVED_V4_ARGS.items()}
    assert REFUSED[field_name] != defaults[field_name]
    cls = TrainingArguments if field_name in _fields(TrainingArguments) else Seq2SeqTrainingArguments
    with pytest.raises(ValueError, match=field_name):
        cls(output_dir="out", **{field_name: REFUSED[field_name]})
