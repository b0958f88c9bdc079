"""Trainer: the transformers.Trainer API on a loop you can read top to bottom.

One training step (``_run_epoch``): fetch the step's micro-batches, count their items, then per
micro-batch forward under autocast + backward (no gradient sync but on the last); clip, optimizer
step, scheduler step, zero grad; advance the cursor; fire events; maybe log / evaluate / save.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import os
import time
import warnings
from collections.abc import Callable, Mapping
from itertools import islice
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset

from trainwright import data as data_utils
from trainwright.args.accelerator_config import AcceleratorConfig
from trainwright.args.training_args import TrainingArguments
from trainwright.callbacks import DEFAULT_CALLBACKS, PrinterCallback, ProgressCallback
from trainwright.checkpoint.output_lock import claim_output_dir, create_output_dir
from trainwright.core.enums import DebugOption
from trainwright.core.events import CallbackHandler, TrainerCallback
from trainwright.core.seed import enable_full_determinism, set_seed
from trainwright.core.state import LoopCursor, TrainerControl, TrainerState, metric_improves
from trainwright.distributed import device_cache
from trainwright.distributed.engine import Engine, build_engine
from trainwright.distributed.preemption import PreemptionGuard
from trainwright.distributed.runtime import get_runtime
from trainwright.loop import batch_size_finder, dataloaders, hub, optimization, prediction, resume
from trainwright.loop import checkpointing as training_checkpoint
from trainwright.modeling import debug_underflow, liger, neftune
from trainwright.modeling.loss import (
    LabelSmoother,
    LossWindow,
    batch_size,
    items_in_batch,
    label_shift_for,
    loss_honours_num_items,
)
from trainwright.modeling.loss import model_accepts_loss_kwargs as _detect_loss_kwargs
from trainwright.modeling.past_state import PastState
from trainwright.observe.flops import FlopsEstimator, non_embedding_parameters
from trainwright.observe.memory import TrainerMemoryTracker
from trainwright.observe.metrics import (
    EvalLoopOutput,
    PredictionOutput,
    TrainOutput,
    speed_metrics,
)
from trainwright.observe.metrics import log_metrics as _log_metrics
from trainwright.observe.metrics import metrics_format as _metrics_format
from trainwright.observe.metrics import save_metrics as _save_metrics
from trainwright.optim.optimizers import get_optimizer_cls_and_kwargs as _get_optimizer_cls_and_kwargs
from trainwright.optim.schedules import get_learning_rates
from trainwright.reporters import get_reporting_integration_callbacks

if TYPE_CHECKING:
    from trainwright.loop.hpo import _Search

logger = logging.getLogger(__name__)

_NO_CONTEXT = contextlib.nullcontext()  # reusable: nullcontext keeps no state
_MAX_UNLOGGED_STEPS = 4096  # step losses kept for the next log row before they are folded into train_loss


# a batch rebuilt as its own mapping type (BatchEncoding, UserDict, ...), else a dict
_same_mapping = prediction.same_mapping
_EvaluationPreempted = prediction.EvaluationPreempted


class Trainer:
    """Train, evaluate and predict with a PyTorch model; the API of ``transformers.Trainer``."""

    loss_is_scaled_for_ga: bool | None = None

    def __init__(
        self,
        model: nn.Module | None = None,
        args: TrainingArguments | None = None,
        data_collator: Callable | None = None,
        train_dataset: Dataset | IterableDataset | None = None,
        eval_dataset: Dataset | dict[str, Dataset] | None = None,
        processing_class: Any = None,
        model_init: Callable[..., nn.Module] | None = None,
        compute_loss_func: Callable | None = None,
        compute_metrics: Callable[..., dict] | None = None,  # (EvalPrediction[, compute_result=])
        callbacks: list[TrainerCallback | type[TrainerCallback]] | None = None,
        optimizers: tuple[torch.optim.Optimizer | None, Any] = (None, None),
        optimizer_cls_and_kwargs: tuple[type, dict] | None = None,
        preprocess_logits_for_metrics: Callable | None = None,
        tokenizer: Any = None,
    ):
        if args is None:
            args = TrainingArguments(output_dir="tmp_trainer")
        self.args = args
        if tokenizer is not None:
            warnings.warn("`tokenizer` is deprecated: pass `processing_class`.", FutureWarning, stacklevel=2)
            processing_class = processing_class if processing_class is not None else tokenizer
        self.runtime = get_runtime(use_cpu=args.use_cpu, backend=args.ddp_backend, timeout_s=args.ddp_timeout)
        if (args.log_level if args.should_log else args.log_level_replica) != "passive":
            level = args.get_process_log_level()  # replicas: warning
            logging.getLogger("trainwright").setLevel(level)
            if importlib.util.find_spec("transformers") is not None:  # as upstream's Trainer does
                import transformers.utils.logging as hf_logging

                hf_logging.set_verbosity(level)
        if DebugOption.TPU_METRICS_DEBUG in args.debug:
            raise ValueError(
                'debug="tpu_metrics_debug" (tpu_metrics_debug=True) prints the TPU metrics report of torch_xla, '
                "and trainwright does not run on TPUs: remove it from `debug`."
            )
        if args.full_determinism:
            enable_full_determinism(args.seed)
        else:
            set_seed(args.seed)
        self.runtime.set_tf32(args.tf32)
        self._memory_tracker = TrainerMemoryTracker(args.skip_memory_metrics, self.runtime.device)
        self._memory_tracker.start("init")

        if model is not None and model_init is not None:
            raise ValueError("Trainer takes `model` or `model_init`, not both.")
        if model is None and model_init is None:
            raise RuntimeError("Trainer needs a `model` or a `model_init`.")
        if model_init is not None and optimizers != (None, None):
            raise ValueError("`optimizers` cannot be used with `model_init`: each trial builds its own.")
        if args.fsdp and optimizers[0] is not None:
            raise ValueError(
                "`optimizers` cannot be used with `fsdp`: sharding replaces the model's parameters, so the "
                "optimizer must be built afterwards. Pass `optimizer_cls_and_kwargs` instead."
            )
        if optimizers != (None, None) and optimizer_cls_and_kwargs is not None:
            raise ValueError("Pass `optimizers` or `optimizer_cls_and_kwargs`, not both.")
        self.model_init = model_init
        if model is None:
            model = self.call_model_init()
        self.model = self._place(model)
        self.model_wrapped = self.model
        self.processing_class = processing_class
        self.compute_loss_func = compute_loss_func
        self.compute_metrics = compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.optimizer, self.lr_scheduler = optimizers
        self.optimizer_cls_and_kwargs = optimizer_cls_and_kwargs
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        if data_collator is None:
            data_collator = (
                data_utils.PaddingCollator(processing_class)
                if hasattr(processing_class, "pad")
                else data_utils.default_data_collator
            )
        self.data_collator = data_collator
        self._configure_model_facts()
        self._validate_data()

        default = DEFAULT_CALLBACKS + get_reporting_integration_callbacks(args.report_to)
        callbacks = default + list(callbacks or [])
        callbacks.append(PrinterCallback if args.disable_tqdm else ProgressCallback)
        self.callback_handler = CallbackHandler(
            callbacks, self.model, self.processing_class, self.optimizer, self.lr_scheduler
        )
        self.hub_model_id: str | None = None  # the Hub repository, once init_hf_repo() has made it
        self.push_in_progress: hub.PushInProgress | None = None  # the last checkpoint push's uploads
        if args.push_to_hub:
            self.init_hf_repo()
        if args.should_save:
            create_output_dir(args.output_dir)  # as upstream; an empty path, a file, no permission: named
        self.state = TrainerState(
            is_local_process_zero=self.is_local_process_zero(),
            is_world_process_zero=self.is_world_process_zero(),
        )
        self.control = TrainerControl()
        self.cursor = LoopCursor()
        self.scaler: torch.amp.GradScaler | None = None
        self.is_in_train = False
        self.hp_search_backend: str | None = None
        self.neftune_noise_alpha = args.neftune_noise_alpha
        self._flops: FlopsEstimator | None = None
        self._trial = None
        self.control = self.callback_handler.on_init_end(args, self.state, self.control)
        self._memory_tracker.stop_and_update_metrics("init")

    # ------------------------------------------------------------------ set-up helpers
    def _place(self, model: nn.Module) -> nn.Module:
        device_map = getattr(model, "hf_device_map", None)
        if isinstance(device_map, dict) and len(set(device_map.values())) > 1:
            return model  # model parallel: the user placed it
        if self.args.fp16_full_eval or self.args.bf16_full_eval:
            return model  # cast and placed when evaluating
        return model.to(self.runtime.device)

    def _configure_model_facts(self) -> None:
        model = self.model
        detected = _detect_loss_kwargs(model)
        self._accepts_loss_kwargs = detected is not False  # upstream's reading of **kwargs until measured
        self._probe_loss_kwargs = detected is None
        self.label_names = (
            list(self.args.label_names) if self.args.label_names is not None else self._find_labels(model)
        )
        self.can_return_loss = "return_loss" in _forward_params(model)
        self._label_shift = label_shift_for(model)
        eps = self.args.label_smoothing_factor
        self.label_smoother = LabelSmoother(epsilon=eps) if eps != 0 else None
        if (
            eps != 0
            and getattr(getattr(model, "config", None), "problem_type", None) == "multi_label_classification"
        ):
            warnings.warn(  # as upstream: smoothing one-hot targets makes no sense for independent labels
                "label_smoothing_factor is not used with multi-label classification (problem_type="
                "'multi_label_classification'): training without label smoothing.",
                UserWarning,
                stacklevel=3,
            )
            self.label_smoother = None
        if getattr(model, "config", None) is not None and hasattr(model.config, "use_cache"):
            model.config.use_cache = self.args.use_cache

    @staticmethod
    def _find_labels(model: nn.Module) -> list[str]:
        name = type(model).__name__
        params = _forward_params(model)
        if "QuestionAnswering" in name:
            return [p for p in params if "label" in p or p in ("start_positions", "end_positions")]
        return [p for p in params if "label" in p]

    def _validate_data(self) -> None:
        args = self.args
        if self.train_dataset is not None and not data_utils.has_length(self.train_dataset):
            if args.max_steps <= 0:
                raise ValueError(
                    "train_dataset has no length (an IterableDataset): set `max_steps` to say how long to train."
                )

    def call_model_init(self, trial: Any = None) -> nn.Module:
        """Build a fresh model with `model_init` (which may take the HP-search trial)."""
        if self.model_init is None:
            raise RuntimeError("call_model_init needs a `model_init`: pass Trainer(model_init=...).")
        n_args = len([p for p in _signature_params(self.model_init) if p.default is p.empty])
        model = self.model_init() if n_args == 0 else self.model_init(trial)
        if model is None:
            raise RuntimeError("model_init returned None: it must return a torch.nn.Module.")
        return model

    # ------------------------------------------------------------------ callbacks
    def add_callback(self, callback: TrainerCallback | type[TrainerCallback]) -> None:
        self.callback_handler.add_callback(callback)

    def pop_callback(self, callback: TrainerCallback | type[TrainerCallback]) -> TrainerCallback | None:
        return self.callback_handler.pop_callback(callback)

    def remove_callback(self, callback: TrainerCallback | type[TrainerCallback]) -> None:
        self.callback_handler.remove_callback(callback)

    def is_local_process_zero(self) -> bool:
        return self.runtime.is_local_main_process

    def is_world_process_zero(self) -> bool:
        return self.runtime.is_main_process

    # ------------------------------------------------------------------ upstream's public facts
    is_fsdp_xla_enabled = is_fsdp_xla_v1_enabled = is_fsdp_xla_v2_enabled = False  # no TPU/XLA engine
    is_distributed_loading_by_transformers = False
    hp_name: Callable | None = None

    @property
    def tokenizer(self) -> Any:
        """Deprecated name of `processing_class` (v4)."""
        warnings.warn(
            "Trainer.tokenizer is deprecated: use Trainer.processing_class.", FutureWarning, stacklevel=2
        )
        return self.processing_class

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        warnings.warn(
            "Trainer.tokenizer is deprecated: use Trainer.processing_class.", FutureWarning, stacklevel=2
        )
        self.processing_class = value

    @property
    def accelerator(self) -> Any:
        """Process facts and collectives under accelerate's names (see accelerator_facade.py)."""
        from trainwright.loop.accelerator_facade import RuntimeAccelerator

        return RuntimeAccelerator(self.runtime)

    @property
    def gather_function(self) -> Callable:
        return self.accelerator.gather

    @property
    def is_deepspeed_enabled(self) -> bool:
        return bool(self.args.deepspeed)

    @property
    def is_fsdp_enabled(self) -> bool:
        return bool(self.args.fsdp)

    @property
    def deepspeed(self) -> Any:
        """The DeepSpeed engine while a `deepspeed` run trains, else None."""
        return self._engine.deepspeed if self._engine is not None else None

    @property
    def is_model_parallel(self) -> bool:
        """Whether the model is spread over several devices by a `device_map`."""
        device_map = getattr(self.model, "hf_device_map", None)
        return isinstance(device_map, dict) and len(set(device_map.values())) > 1

    @property
    def place_model_on_device(self) -> bool:
        return not self.is_model_parallel and not (self.args.fp16_full_eval or self.args.bf16_full_eval)

    @property
    def current_flos(self) -> float:
        """FLOPs this process has trained on so far (total_flos is summed over processes)."""
        return self.cursor.flops_seen

    def get_tp_size(self) -> int:
        return 1  # no tensor parallelism

    def get_cp_size(self) -> int:
        return 1  # no context parallelism

    def get_sp_size(self) -> int:
        return 1  # no sequence parallelism

    def end(self) -> None:
        """Destroy the process group, once everything that needs the other processes is done."""
        self.runtime.shutdown()

    # ------------------------------------------------------------------ data
    def _set_signature_columns_if_needed(self) -> None:
        """The batch keys the model takes: its forward's named arguments and the label names."""
        if self._signature_columns is None:
            keep = data_utils.forward_arg_names(self.model) | set(self.label_names)
            self._signature_columns = sorted(keep)

    def _remove_unused_columns(self, dataset: Any, description: str | None = None) -> Any:
        """A `datasets.Dataset` without the columns the model does not take (others unchanged)."""
        if not self.args.remove_unused_columns or not dataloaders.is_hf_dataset(dataset):
            return dataset
        self._set_signature_columns_if_needed()
        assert self._signature_columns is not None  # set just above
        return data_utils.remove_unused_columns(dataset, set(self._signature_columns), description)

    def _get_collator_with_removed_columns(self, data_collator: Callable, description: str | None = None):
        """The collator behind a filter that drops the keys the model does not take."""
        if not self.args.remove_unused_columns:
            return data_collator
        self._set_signature_columns_if_needed()
        assert self._signature_columns is not None  # set just above
        return data_utils.RemoveColumnsCollator(
            data_collator, set(self._signature_columns), description=description
        )

    def _get_train_sampler(self, train_dataset: Any = None) -> torch.utils.data.Sampler | None:
        """The training sampler: resumable (seen samples are skipped, never loaded), by (seed, epoch)."""
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        bs = self.args.per_device_train_batch_size
        return data_utils.build_sampler(dataset, self.args, self.runtime, train=True, batch_size=bs)

    def _get_eval_sampler(self, eval_dataset: Any) -> torch.utils.data.Sampler | None:
        """The evaluation sampler: dataset order, dealt across processes."""
        bs = self.args.per_device_eval_batch_size
        return data_utils.build_sampler(eval_dataset, self.args, self.runtime, train=False, batch_size=bs)

    def get_train_dataloader(self) -> torch.utils.data.DataLoader:
        """Training dataloader: resumable sampler, worker seeds fixed by (seed, epoch)."""
        return dataloaders.train_dataloader(self)

    def get_eval_dataloader(self, eval_dataset: str | Dataset | None = None) -> torch.utils.data.DataLoader:
        """Evaluation dataloader (a name selects one of a dict of eval datasets)."""
        dataset = dataloaders.eval_dataset_of(self, eval_dataset)
        return dataloaders.inference_dataloader(self, dataset, "evaluation")

    def get_test_dataloader(self, test_dataset: Dataset) -> torch.utils.data.DataLoader:
        return dataloaders.inference_dataloader(self, test_dataset, "test")

    def num_examples(self, dataloader: torch.utils.data.DataLoader) -> int:
        """Samples in the dataloader's dataset; else batches x batch size (the loader's, else the
        argument's), for a loader without `.dataset` or `.batch_size`."""
        return dataloaders.num_examples(dataloader, self.args.per_device_train_batch_size)

    def _prepare_inputs(self, inputs: Any) -> Any:
        device = self.runtime.device
        if device.type == "cpu":
            return inputs  # batches are made on the CPU
        non_blocking = (  # accelerator_config: an AcceleratorConfig after TrainingArguments.__post_init__
            device.type == "cuda" and cast(AcceleratorConfig, self.args.accelerator_config).non_blocking
        )
        if isinstance(inputs, Mapping):
            return _same_mapping(inputs, {k: self._prepare_inputs(v) for k, v in inputs.items()})
        if isinstance(inputs, (list, tuple)):
            return type(inputs)(self._prepare_inputs(v) for v in inputs)
        if isinstance(inputs, torch.Tensor):
            return inputs.to(device, non_blocking=non_blocking)
        return inputs

    # ------------------------------------------------------------------ optimizer / schedule
    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        self.create_optimizer()
        self.create_scheduler(num_training_steps, self.optimizer)

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        """AdamW (fused where supported) with no weight decay on biases and norm weights."""
        if self.optimizer is None:
            self.optimizer = optimization.make_optimizer(
                model or self.model,
                self.args,
                self.optimizer_cls_and_kwargs,
                self.get_optimizer_cls_and_kwargs,
            )
        return self.optimizer

    @staticmethod
    def get_optimizer_cls_and_kwargs(
        args: TrainingArguments, model: nn.Module | None = None
    ) -> tuple[Any, Any]:
        """The optimizer class for `args.optim` and its kwargs (all but the parameters), as upstream.

        `model` is needed by GaLore, APOLLO and LOMO (and picks the fused AdamW kernel). kwargs may
        hold `params`, `model` or `optimizer_dict`, which replace the decay param groups.
        """
        return _get_optimizer_cls_and_kwargs(args, model)

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        if self.lr_scheduler is None:
            optimizer = optimizer or self.optimizer
            if optimizer is None:
                raise RuntimeError("create_scheduler needs an optimizer: call create_optimizer() first.")
            self.lr_scheduler = optimization.make_scheduler(self.args, optimizer, num_training_steps)
            self._created_scheduler = True
        return self.lr_scheduler

    def get_learning_rates(self) -> list[float]:
        if self.optimizer is None:
            raise ValueError("The optimizer has not been created yet.")
        return get_learning_rates(self.optimizer)

    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        """Names of the parameters that get weight decay (all but biases and norm weights)."""
        from trainwright.optim.optimizers import get_decay_parameter_names

        return get_decay_parameter_names(model)

    def get_optimizer_group(self, param: Any = None) -> Any:
        """The optimizer's parameter group holding `param`, or every group's parameters."""
        return optimization.optimizer_group(self.optimizer, param)

    def get_num_trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def _amp_dtype(self, evaluating: bool = False) -> torch.dtype | None:
        if evaluating and (self.args.bf16_full_eval or self.args.fp16_full_eval):
            return None  # the model itself is cast
        if self.args.bf16:
            return torch.bfloat16
        if self.args.fp16:
            return torch.float16
        return None

    def compute_loss_context_manager(self) -> contextlib.AbstractContextManager:
        """The context of every forward that computes a loss (training and prediction steps)."""
        return self.autocast_smart_context_manager()

    def autocast_smart_context_manager(self, cache_enabled: bool | None = True):
        """Autocast to bf16/fp16 when mixed precision is on (not over a model cast for full eval)."""
        if not (self.args.bf16 or self.args.fp16):
            return _NO_CONTEXT  # the common case, on every micro-batch: decided without a call
        dtype = self._amp_dtype(evaluating=not self.model.training)
        if dtype is None:
            return _NO_CONTEXT
        return self.runtime.autocast(dtype, cache_enabled=cache_enabled)

    # ------------------------------------------------------------------ train
    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
        **kwargs: Any,
    ) -> TrainOutput:
        """Run the training loop; `resume_from_checkpoint=True` takes the newest complete checkpoint."""
        if kwargs:
            raise TypeError(f"train() got unexpected keyword arguments: {sorted(kwargs)}")
        if resume_from_checkpoint is False:
            resume_from_checkpoint = None
        self.is_in_train = True
        self._memory_tracker.start("train")
        args = self.args
        self._trial = trial
        if self.model_init is not None:
            set_seed(args.seed)
            self.model = self._place(self.call_model_init(trial))
            self.model_wrapped = self.model
            self._configure_model_facts()
            self.optimizer, self.lr_scheduler = None, None
        if getattr(self, "_created_scheduler", False):
            self.lr_scheduler = None  # a scheduler the Trainer made is re-made for each train()
        if args.eval_strategy != "no" and self.eval_dataset is None:
            raise ValueError(
                f"eval_strategy={args.eval_strategy.value if hasattr(args.eval_strategy, 'value') else args.eval_strategy!r}"
                " needs an eval_dataset: pass one to the Trainer or set eval_strategy='no'."
            )
        resume_path = resume.resolve_resume_path(self, resume_from_checkpoint)
        inner_training_loop = batch_size_finder.inner_loop(self, resume_path)  # auto_find_batch_size
        lock = None
        try:
            # writable, and no other run writing it (a search trial: its run folder)
            lock = claim_output_dir(self, training_checkpoint.run_dir(self))
            self._start_train_hooks()  # inside the try: a refused hook still ends the call cleanly
            with (
                PreemptionGuard(args.preemption_signals) as self._preemption,
                hub.quiet_progress_bars(args.push_to_hub),
            ):
                output = inner_training_loop(
                    args=args,
                    resume_from_checkpoint=resume_path,
                    trial=trial,
                    ignore_keys_for_eval=ignore_keys_for_eval,
                )
            if self._preemption.requested is not None:
                logger.warning(
                    "Preempted by %s: checkpoint written, exiting.", self._preemption.requested.name
                )
                raise SystemExit(0)
            return output
        finally:
            if self._neftune_hook is not None:  # NEFTune perturbs this call's training only
                self._neftune_hook.remove()
                self._neftune_hook = None
            self.is_in_train = False
            self._memory_tracker.stop("train")  # no-op when already stopped by a finished run
            if lock is not None:
                lock.release()

    def _start_train_hooks(self) -> None:
        """Patches and hooks the arguments ask for on the model being trained: Liger kernels, the
        inf/nan detector (kept afterwards, as upstream's) and NEFTune (removed when train() ends)."""
        args = self.args
        if args.use_liger_kernel:
            liger.apply(self.model, args.liger_kernel_config, self.runtime.device)
        if DebugOption.UNDERFLOW_OVERFLOW in args.debug:
            self._overflow_detector = debug_underflow.watch(self.model, self._overflow_detector)
        if args.neftune_noise_alpha is not None:
            self._neftune_hook = neftune.activate(self.model, args.neftune_noise_alpha)

    def get_total_train_batch_size(self, args: TrainingArguments) -> int:
        """Samples per optimizer step over every process: batch x accumulation x processes."""
        return args.per_device_train_batch_size * args.gradient_accumulation_steps * self.runtime.world_size

    def set_initial_training_values(
        self, args: TrainingArguments, dataloader: Any
    ) -> tuple[int, int, int, int, int, int, int]:
        """(num_train_epochs, update steps per epoch, examples, train samples, total batch size,
        micro-batches per epoch, max_steps), as upstream computes them."""
        total_batch = self.get_total_train_batch_size(args)
        ga = args.gradient_accumulation_steps
        if data_utils.has_length(dataloader):
            batches = len(dataloader)
            if batches == 0:
                raise ValueError(self._empty_training_message(dataloader))
            updates_per_epoch = max(math.ceil(batches / ga), 1)
            examples = self.num_examples(dataloader)
            if args.max_steps > 0:
                max_steps = args.max_steps
                epochs = math.ceil(max_steps / updates_per_epoch)
                samples = max_steps * total_batch
            else:
                max_steps = math.ceil(args.num_train_epochs * updates_per_epoch)
                epochs = math.ceil(args.num_train_epochs)
                samples = math.ceil(examples * args.num_train_epochs)
            return epochs, updates_per_epoch, examples, samples, total_batch, batches, max_steps
        if args.max_steps <= 0:
            raise ValueError(
                "max_steps must be set to a positive value when the training dataloader has no length "
                f"(got {args.max_steps})."
            )
        samples = args.max_steps * total_batch
        # steps_in_epoch 0: the epoch has no known end, it runs until max_steps
        return 2**62, args.max_steps, samples, samples, total_batch, 0, args.max_steps

    def _empty_training_message(self, dataloader: Any) -> str:
        dataset: Any = getattr(dataloader, "dataset", None)
        size = len(dataset) if data_utils.has_length(dataset) else "?"
        args = self.args
        return (
            f"The training data gives no batch: train_dataset ({type(dataset).__name__}) has {size} samples, "
            f"per_device_train_batch_size={args.per_device_train_batch_size}, processes={self.runtime.world_size}, "
            f"dataloader_drop_last={args.dataloader_drop_last}. Give it more samples, a smaller batch, or "
            "dataloader_drop_last=False."
        )

    def _inner_training_loop(
        self,
        batch_size: int | None = None,
        args: TrainingArguments | None = None,
        resume_from_checkpoint: str | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
    ) -> TrainOutput:
        """Set up the run (data, wrapping, optimizer, schedule, resume), then loop over epochs."""
        args = args if args is not None else self.args
        runtime, resume_path = self.runtime, resume_from_checkpoint
        train_dataloader = self.get_train_dataloader()
        num_train_epochs, _, num_examples, _, _, steps_in_epoch, max_steps = self.set_initial_training_values(
            args, train_dataloader
        )
        self._epoch_geometry = data_utils.sampler_geometry(train_dataloader)

        self.state = TrainerState(
            is_local_process_zero=self.is_local_process_zero(),
            is_world_process_zero=self.is_world_process_zero(),
            train_batch_size=args.per_device_train_batch_size,
            stateful_callbacks=training_checkpoint.callback_states(self),
        )
        self.state.is_hyper_param_search = trial is not None
        self.state.compute_steps(args, max_steps)
        self.state.init_training_references(self, max_steps, num_train_epochs, trial)
        self.cursor = LoopCursor(steps_in_epoch=steps_in_epoch)

        if args.gradient_checkpointing:
            # a dict or None since TrainingArguments.__post_init__
            _enable_activation_checkpointing(
                self.model, cast("dict[str, Any] | None", args.gradient_checkpointing_kwargs)
            )
        self.model_wrapped = self._wrap_model(self.model)
        engine = build_engine(args, runtime, self.model, self.model_wrapped)  # plain/DDP, FSDP2, DeepSpeed
        if engine.owns_optimizer:  # DeepSpeed: its engine wraps the model and our (or its config's) optimizer
            self.model_wrapped, self.optimizer = engine.start(self.optimizer, self.create_optimizer)
            self.create_scheduler(max_steps, self.optimizer)
        else:  # after wrapping: FSDP2 replaces the parameters with sharded ones
            self.create_optimizer_and_scheduler(num_training_steps=max_steps)
        if args.torch_compile:
            assert args.torch_compile_backend is not None  # __post_init__ sets "inductor" with torch_compile
            # torch.compile of a module returns a module (OptimizedModule); torch types it as any callable
            self.model_wrapped = cast(
                nn.Module,
                torch.compile(
                    self.model_wrapped, backend=args.torch_compile_backend, mode=args.torch_compile_mode
                ),
            )
        if self.optimizer is None:
            raise RuntimeError("create_optimizer_and_scheduler() did not create Trainer.optimizer.")
        engine.attach(self.model_wrapped, self.optimizer)
        self._engine, self.scaler = engine, engine.scaler  # fp16 grad scaler (DeepSpeed scales itself)
        if resume_path is not None:
            self._iterable_restored = training_checkpoint.restore(self, resume_path, train_dataloader)
        self._plateau = self._scheduler_is_plateau()  # checked once, not every step
        self.cursor.first_step_of_call = self.cursor.steps_applied
        self._samples_at_start = self.cursor.samples_seen
        self._tokens_at_start = self.cursor.tokens_seen
        self._input_tokens_seen_at_start = self.state.num_input_tokens_seen
        self._empty_cache = (
            device_cache.EmptyCacheEvery(args.torch_empty_cache_steps, runtime.device)
            if args.torch_empty_cache_steps
            else None
        )
        self._past_state = PastState(args.past_index) if args.past_index >= 0 else None

        handler = self.callback_handler
        handler.model, handler.optimizer, handler.lr_scheduler = self.model, self.optimizer, self.lr_scheduler
        handler.train_dataloader, handler.cursor = train_dataloader, self.cursor
        self._losses = LossWindow(runtime.device)
        self._losses.load(self.cursor.loss_window)
        self._grad_norm: torch.Tensor | float | None = None
        self._last_lr: float | None = None
        self._custom_lse = self._overrides("_maybe_log_save_evaluate")
        # an overridden floating_point_ops is called every micro-batch, as upstream
        self._log_flops_and_tokens = self._wants_flops() or self._overrides("floating_point_ops")
        self._flops_per_token = 6 * non_embedding_parameters(self.model)
        logger.info(
            "***** Running training *****  examples/epoch=%s  epochs=%s  batch/device=%s  accumulation=%s  "
            "processes=%s  optimizer steps=%s  trainable parameters=%s",
            num_examples if steps_in_epoch else "?",
            num_train_epochs,
            args.per_device_train_batch_size,
            args.gradient_accumulation_steps,
            runtime.world_size,
            max_steps,
            self.get_num_trainable_parameters(),
        )
        self.optimizer.zero_grad(set_to_none=True)
        start_time = self._start_time = time.time()
        self.control = handler.on_train_begin(args, self.state, self.control)
        if args.eval_on_start and resume_path is None:
            self._determine_best_metric(
                self._evaluate(trial, ignore_keys_for_eval, skip_scheduler=True), trial
            )

        for epoch in range(self.cursor.epoch, num_train_epochs):
            if self.state.global_step >= max_steps:
                break
            self._run_epoch(train_dataloader, epoch, max_steps, trial, ignore_keys_for_eval)
            if self.control.should_training_stop:
                break
        return self._finalize_training(start_time)

    def _run_epoch(self, dataloader, epoch: int, max_steps: int, trial, ignore_keys_for_eval) -> None:
        args, cursor, handler = self.args, self.cursor, self.callback_handler
        assert self.optimizer is not None  # created by _inner_training_loop before the first epoch
        ga = args.gradient_accumulation_steps
        assert self._engine is not None  # set up by _inner_training_loop
        accumulate, clip, step = self._engine.accumulate, self._engine.clip, self._engine.step
        plain_boundary = self._engine.plain_boundary
        batches = self._epoch_batches(dataloader, epoch)
        if self._past_state is not None:  # past_index: the memory starts empty each epoch (v4)
            self._past_state.reset()
        self.control = handler.on_epoch_begin(args, self.state, self.control)
        ran_any = exhausted = False
        while True:
            micro_batches, num_items = self.get_batch_samples(batches, ga, self.runtime.device)
            if not micro_batches:
                exhausted = True
                break
            ran_any = True
            if self._probe_loss_kwargs and num_items is not None:
                self._measure_loss_kwargs(micro_batches, num_items)
            self.control = handler.on_step_begin(args, self.state, self.control)
            last = len(micro_batches) - 1
            for i, inputs in enumerate(micro_batches):
                self._advance_cursor(inputs)
                if i == last and plain_boundary:  # nothing to tell the engine: no context (~1 us)
                    step_loss = self.training_step(self.model_wrapped, inputs, num_items)
                else:
                    with accumulate(i < last):  # no gradient sync but on the last micro-batch
                        step_loss = self.training_step(self.model_wrapped, inputs, num_items)
                self._losses.add(cursor.steps_since_log, step_loss)
                if i < last:
                    self.control = handler.on_substep_end(args, self.state, self.control)
            del micro_batches
            self._grad_norm = clip()
            self.control = handler.on_pre_optimizer_step(args, self.state, self.control)
            applied, self._grad_norm = step(self._grad_norm)  # DeepSpeed reports the norm it clipped
            self.control = handler.on_optimizer_step(args, self.state, self.control)
            self._last_lr = self.optimizer.param_groups[0]["lr"]  # the rate this step applied
            if applied and not self._plateau:
                self.lr_scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            cursor.steps_attempted += 1
            cursor.steps_applied += int(applied)
            cursor.steps_since_log += 1
            self._sync_state()
            self.control = handler.on_step_end(args, self.state, self.control)
            control = self.control
            if self._preempted():
                control.should_save = control.should_training_stop = True
            if (  # an overriding subclass sees every step, as upstream calls it every step
                self._custom_lse
                or control.should_log
                or control.should_evaluate
                or control.should_save
                or cursor.steps_since_log >= _MAX_UNLOGGED_STEPS
            ):
                self._maybe_log_save_evaluate(
                    *self._log_save_evaluate_args(trial, epoch, ignore_keys_for_eval)
                )
            if self.control.should_epoch_stop or self.control.should_training_stop:
                break
            if self.state.global_step >= max_steps:
                self.control.should_training_stop = True
                break
        if not ran_any and cursor.batch_in_epoch == 0:
            if cursor.steps_attempted == 0:  # not one batch in the whole run: refuse, never "succeed"
                raise ValueError(self._empty_training_message(dataloader))
            logger.warning(  # as upstream: an iterable that ran dry before max_steps
                "Epoch %d produced no batch: stopping training at step %d of max_steps=%d.",
                epoch,
                self.state.global_step,
                max_steps,
            )
            self.control.should_training_stop = True
        # A run stopped mid-epoch keeps its position there, so a resume continues the same epoch.
        if exhausted or self.control.should_epoch_stop or _epoch_done(cursor):
            cursor.epoch, cursor.batch_in_epoch, cursor.samples_in_epoch = epoch + 1, 0, 0
        self._sync_state()
        self.control = handler.on_epoch_end(args, self.state, self.control)
        self._maybe_log_save_evaluate(*self._log_save_evaluate_args(trial, epoch, ignore_keys_for_eval))

    def _epoch_batches(self, dataloader, epoch: int):
        """This epoch's batches, starting after those a resumed run already consumed."""
        sampler: Any = getattr(dataloader, "sampler", None)
        dataset = getattr(dataloader, "dataset", None)
        obj: Any
        for obj in (dataloader, sampler, getattr(dataloader, "batch_sampler", None), dataset):
            if hasattr(obj, "set_epoch"):
                obj.set_epoch(epoch)
        done = self.cursor.samples_in_epoch
        if hasattr(sampler, "set_start"):
            sampler.set_start(done)
            return iter(dataloader)
        skip = 0 if self._iterable_restored else self.cursor.batch_in_epoch
        self._iterable_restored = False
        return data_utils.skip_iterable(dataloader, skip) if skip else iter(dataloader)

    def _preempted(self) -> bool:
        guard = self._preemption
        requested = guard is not None and guard.requested is not None
        return self.runtime.any_process(requested) if self.runtime.distributed else requested

    def get_batch_samples(
        self, epoch_iterator: Any, num_batches: int, device: torch.device | None = None
    ) -> tuple[list, torch.Tensor | None]:
        """The next optimizer step's micro-batches (up to `num_batches`, on the CPU) and the items
        they hold over every process (None when the step is one micro-batch on one process)."""
        micro_batches = list(islice(epoch_iterator, num_batches))
        return micro_batches, self._items_in_step(micro_batches) if micro_batches else None

    def _items_in_step(self, micro_batches: list) -> torch.Tensor | None:
        """Items (label targets, else samples) in this optimizer step over every process; None when
        the step is one micro-batch on one process, where no reweighting is needed."""
        distributed = self.runtime.distributed and self.args.average_tokens_across_devices
        if len(micro_batches) == 1 and not distributed:
            return None
        # a tensor: micro_batches is not empty (sum's type also allows its start, 0)
        total = cast(torch.Tensor, sum(items_in_batch(b, self._label_shift) for b in micro_batches))
        if distributed:
            total = self.runtime.all_reduce(total.to(self.runtime.device))
        return total

    def _measure_loss_kwargs(self, micro_batches: list, num_items: torch.Tensor) -> None:
        """Settle, once per run, whether a `**kwargs` forward really divides by `num_items_in_batch`
        (measured on a micro-batch with label targets: one without any says nothing)."""
        if self.compute_loss_func is not None or self.label_smoother is not None:
            self._probe_loss_kwargs = False
            return  # the model is not given num_items_in_batch then
        inputs = next((b for b in micro_batches if _has_targets(b, self._label_shift)), None)
        if inputs is None:
            if not any(
                isinstance(b, Mapping) and isinstance(b.get("labels"), torch.Tensor) for b in micro_batches
            ):
                self._probe_loss_kwargs = False  # no labels at all: nothing to measure, ever
            return  # this step's labels are all ignored: measure on a later step
        self._probe_loss_kwargs = False
        with self.compute_loss_context_manager():
            honoured = loss_honours_num_items(
                self.model, self._prepare_inputs(inputs), num_items.to(self.runtime.device)
            )
        if self.runtime.distributed:  # every process must take the same path
            honoured = not self.runtime.any_process(not honoured)
        self._accepts_loss_kwargs = honoured
        logger.info(
            "%s %s num_items_in_batch: %s.",
            type(self.model).__name__,
            "divides its loss by" if honoured else "ignores",
            "passing it" if honoured else "its mean loss is weighted by each micro-batch's share",
        )

    @property
    def model_accepts_loss_kwargs(self) -> bool:
        """Whether the model's loss uses `num_items_in_batch` (upstream's attribute; may be set)."""
        return self._accepts_loss_kwargs

    @model_accepts_loss_kwargs.setter
    def model_accepts_loss_kwargs(self, value: bool) -> None:
        self._accepts_loss_kwargs = bool(value)
        self._probe_loss_kwargs = False  # the user's word wins over a measurement

    def _advance_cursor(self, inputs: Any) -> None:
        cursor = self.cursor
        geometry = self._epoch_geometry  # batches cut in order from a sampler: sizes known exactly
        n = min(geometry[0], geometry[1] - cursor.samples_in_epoch) if geometry else batch_size(inputs)
        cursor.batch_in_epoch += 1
        cursor.samples_in_epoch += n
        cursor.samples_seen += n
        is_mapping = isinstance(inputs, Mapping)
        ids = inputs.get("input_ids") if is_mapping else None
        tokens = ids.numel() if isinstance(ids, torch.Tensor) else 0
        cursor.tokens_seen += tokens
        if self._log_flops_and_tokens:
            cursor.flops_seen += self.floating_point_ops(inputs)
        else:  # upstream's total_flos estimate: 6 x non-embedding parameters x tokens
            cursor.flops_seen += self._flops_per_token * (tokens or n)
        mode = self.args.include_num_input_tokens_seen
        if mode != "no" and is_mapping:
            mask = inputs.get("attention_mask")
            ids = inputs.get("input_ids")
            if mode == "non_padding" and isinstance(mask, torch.Tensor):
                self.state.num_input_tokens_seen += int(mask.sum())
            elif isinstance(ids, torch.Tensor):
                self.state.num_input_tokens_seen += ids.numel()

    def _sync_state(self) -> None:
        self.state.global_step = self.cursor.steps_applied
        self.state.optimizer_step_attempts = self.cursor.steps_attempted
        self.state.epoch = self.cursor.fractional_epoch
        self.state.total_flos = self.cursor.flops_seen * self.runtime.world_size

    def _scheduler_is_plateau(self) -> bool:
        return isinstance(self.lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)

    def training_step(
        self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns the detached loss that was backpropagated."""
        if not model.training:  # after an evaluation; calling train() every step costs ~50 us
            model.train()
        optimizer_train = getattr(self.optimizer, "train", None)
        if callable(optimizer_train):  # schedule-free: back to the training weights (a no-op if there)
            optimizer_train()
        micro_items = items_in_batch(inputs, self._label_shift) if num_items_in_batch is not None else None
        inputs = self._prepare_inputs(inputs)
        if self._past_state is not None:
            inputs = self._past_state.feed(inputs)
        with self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        del inputs
        if self._empty_cache is not None:  # after the forward, before the backward, as upstream
            self._empty_cache(self.state.global_step)
        if num_items_in_batch is not None:
            loss = self._scale_for_accumulation(loss, micro_items, num_items_in_batch)
        if self._engine is not None:  # DeepSpeed's, the fp16 scaler's, LOMO's fused backward, or plain
            self._engine.backward(loss)
        else:  # called outside train()
            loss.backward()
        return loss.detach()

    def _scale_for_accumulation(self, loss, micro_items, num_items_in_batch) -> torch.Tensor:
        if num_items_in_batch is None:
            return loss
        scaled = self.loss_is_scaled_for_ga
        if scaled is None:
            labels = micro_items is not None
            scaled = labels and (self.model_accepts_loss_kwargs or self.compute_loss_func is not None)
            scaled = scaled and self._passes_num_items
        if not scaled:
            if micro_items.device.type == "cpu" and not micro_items:
                # no target in this micro-batch: a mean loss is 0/0 = NaN, and its weight is 0; its
                # gradient is zero either way, so it must not turn the step's logged loss into NaN
                loss = torch.nan_to_num(loss, nan=0.0)
            loss = loss * (micro_items.to(loss.device) / num_items_in_batch.to(loss.device))
        if self.runtime.distributed and self.args.average_tokens_across_devices:
            loss = loss * self.runtime.world_size  # DDP averages gradients over processes
        return loss

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | None = None,
    ):
        """The model's loss (or `compute_loss_func`'s, or label smoothing's) for one batch."""
        labels = None
        custom = self.label_smoother is not None or self.compute_loss_func is not None
        if custom and "labels" in inputs:
            inputs = dict(inputs)
            labels = inputs.pop("labels")
        passes = (
            not custom
            and num_items_in_batch is not None
            and self.model_accepts_loss_kwargs
            and "labels" in inputs
        )
        self._passes_num_items = passes or custom
        if passes:
            assert num_items_in_batch is not None  # passes checks it
            inputs = {**inputs, "num_items_in_batch": num_items_in_batch.to(self.runtime.device)}
        outputs = model(**inputs)
        if self._past_state is not None:
            self._past_state.keep(outputs)
        if labels is not None:
            if self.compute_loss_func is not None:
                loss = self.compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch)
            else:
                assert self.label_smoother is not None  # labels were popped for it
                loss = self.label_smoother(
                    outputs, labels, shift_labels=self._label_shift, num_items_in_batch=num_items_in_batch
                )
        elif isinstance(outputs, dict):
            if outputs.get("loss") is None:
                raise ValueError(
                    "The model did not return a loss from the inputs it got. It returned the keys "
                    f"{sorted(outputs.keys())}; the inputs had the keys {sorted(inputs.keys())}. "
                    "Pass `labels` (or set `label_names`) or compute the loss in `compute_loss_func`."
                )
            loss = outputs["loss"]
        else:
            loss = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
        return (loss, outputs) if return_outputs else loss

    _passes_num_items = False
    _accepts_loss_kwargs = False
    _probe_loss_kwargs = False
    _epoch_geometry: tuple[int, int] | None = None
    _signature_columns: list[str] | None = None
    _hp_search: _Search | None  # hpo's search while one runs (hyperparameter_search sets it)
    _start_time: float | None = None
    _preemption: PreemptionGuard | None = None
    _eval_stops_on_preemption = False  # True while the loop's own evaluation runs (stops on preemption)
    _iterable_restored = False
    _engine: Engine | None = None  # the backend's engine of the current train() call
    _train_batch_size: int | None = None  # auto_find_batch_size: the per-device size that fitted
    _neftune_hook: Any = None  # NEFTune's forward hook while train() runs
    _overflow_detector: Any = None  # debug="underflow_overflow": a debug_underflow.DebugUnderflowOverflow
    _empty_cache: device_cache.EmptyCacheEvery | None = None  # torch_empty_cache_steps
    _past_state: PastState | None = None  # past_index >= 0: the memory fed back as `mems`
    _tokens_at_start = 0  # cursor.tokens_seen when this train() call began (include_tokens_per_second)
    _input_tokens_seen_at_start = 0  # state.num_input_tokens_seen then (per-row train_tokens_per_second)

    # ------------------------------------------------------------------ log / evaluate / save
    def _log_save_evaluate_args(self, trial: Any, epoch: int, ignore_keys_for_eval: Any) -> tuple:
        # tr_loss is only materialised for a subclass that overrides the method (it costs a stack)
        tr_loss = self._losses.window_sum(self.cursor.steps_since_log) if self._custom_lse else None
        return (
            tr_loss,
            self._grad_norm,
            self.model_wrapped,
            trial,
            epoch,
            ignore_keys_for_eval,
            self._start_time,
            self._last_lr,
        )

    def _maybe_log_save_evaluate(
        self,
        tr_loss: torch.Tensor | None,
        grad_norm: torch.Tensor | float | None,
        model: nn.Module,
        trial: Any,
        epoch: float,
        ignore_keys_for_eval: list[str] | None,
        start_time: float,
        learning_rate: float | None = None,
    ) -> None:
        """Log the training window, evaluate and save when `control` says so (upstream's signature;
        the window's losses are read from the Trainer's own loss window, `tr_loss` is informative)."""
        if self.control.should_log and self.cursor.steps_since_log > 0:
            self._log_training_window(grad_norm, learning_rate, start_time)
        elif self.cursor.steps_since_log >= _MAX_UNLOGGED_STEPS:
            self._fold_loss_window()  # bounded window and data_state.json without logging
        if self.control.should_evaluate:
            self._eval_stops_on_preemption = True  # a preemption stops it at its next batch
            try:
                metrics = self._evaluate(trial, ignore_keys_for_eval)
            except _EvaluationPreempted as stopped:
                metrics = None
                logger.warning("%s: no evaluation metrics for step %d.", stopped, self.state.global_step)
            finally:
                self._eval_stops_on_preemption = False
            if metrics is not None:
                is_new_best = self._determine_best_metric(metrics=metrics, trial=trial)
                if self.args.save_strategy == "best":
                    self.control.should_save = is_new_best
            if self._preempted():  # arrived during the evaluation: save and stop all the same
                self.control.should_save = self.control.should_training_stop = True
        if self.control.should_save:
            self._save_checkpoint(model, trial)
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def _log_training_window(
        self, grad_norm: Any = None, learning_rate: float | None = None, start_time: float | None = None
    ) -> None:
        cursor = self.cursor
        loss_sum, nonfinite = self._read_loss_window()
        logs: dict[str, float] = {"loss": loss_sum / cursor.steps_since_log}
        if nonfinite:
            logs["nonfinite_steps"] = nonfinite
        if grad_norm is not None:
            logs["grad_norm"] = grad_norm.item() if isinstance(grad_norm, torch.Tensor) else float(grad_norm)
        if learning_rate is not None:
            logs["learning_rate"] = float(learning_rate)
        cursor.loss_logged_total += loss_sum
        cursor.steps_since_log = 0
        self.log(logs, start_time)

    def _fold_loss_window(self) -> None:
        cursor = self.cursor
        cursor.loss_logged_total += self._read_loss_window()[0]
        cursor.steps_since_log = 0

    def _read_loss_window(self) -> tuple[float, int]:
        """The unlogged steps' summed loss and how many were not finite (warned about, by step)."""
        cursor = self.cursor
        loss_sum, nonfinite = self._losses.step_sum(
            cursor.steps_since_log, self.runtime, self.args.logging_nan_inf_filter
        )
        if nonfinite:
            first = self.state.global_step - cursor.steps_since_log + 1
            logger.warning(
                "Non-finite training loss in %d of the steps %d-%d%s.",
                nonfinite,
                first,
                self.state.global_step,
                " (every one: the logged loss is NaN)"
                if not math.isfinite(loss_sum)
                else " (left out of the logged mean: logging_nan_inf_filter)",
            )
        return loss_sum, nonfinite

    def _wants_flops(self) -> bool:
        return any(getattr(cb, "needs_flops", False) for cb in self.callback_handler.callbacks)

    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        """FLOPs of one forward+backward on `inputs` (see flops.py for the sources, cached per shape)."""
        if self._flops is None or self._flops.model is not self.model:
            self._flops = FlopsEstimator(self.model)
        return int(self._flops(inputs))

    def store_flos(self) -> None:
        self.state.total_flos = self.cursor.flops_seen * self.runtime.world_size

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Record a row in log_history and send it to every callback's `on_log`."""
        if self.state.epoch is not None:
            logs["epoch"] = self.state.epoch
        if self.args.include_num_input_tokens_seen != "no":
            logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen
            if start_time is not None:  # v5: this train() call's tokens over its time so far
                tokens = self.state.num_input_tokens_seen - self._input_tokens_seen_at_start
                logs.update(speed_metrics("train", start_time, num_tokens=tokens))
        self.control = self.callback_handler.on_pre_log(self.args, self.state, self.control, logs=logs)
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.callback_handler.on_log(self.args, self.state, self.control, logs=logs)

    def _evaluate(
        self, trial: Any, ignore_keys_for_eval: Any, skip_scheduler: bool = False
    ) -> dict[str, float]:
        """Evaluate, report to the HP search, step a ReduceLROnPlateau scheduler; the metrics."""
        oom_guard = (
            batch_size_finder.evaluation_oom_is_an_error() if self.args.auto_find_batch_size else _NO_CONTEXT
        )
        with oom_guard:
            metrics = self.evaluate(ignore_keys=ignore_keys_for_eval)
        if trial is not None and self.hp_search_backend is not None:
            from trainwright.loop.hpo import report_to_hp_search

            report_to_hp_search(self, trial, metrics)
        if self._scheduler_is_plateau() and not skip_scheduler:
            self.lr_scheduler.step(metrics[self._metric_key()])
        return metrics

    def _hp_trial_record(self, trial: Any) -> tuple[str, dict[str, Any]]:
        """The trial's run name and parameters for `TrainerState` (the search layer knows both)."""
        from trainwright.loop.hpo import trial_params, trial_run_name

        return trial_run_name(self, trial), trial_params(trial)

    def _metric_key(self) -> str:
        name = self.args.metric_for_best_model or "loss"
        return name if name.startswith("eval_") else f"eval_{name}"

    def _determine_best_metric(self, metrics: dict[str, float], trial: Any = None) -> bool:
        """Record `metrics` in best_metric / best_global_step when they beat it; True when new best."""
        if self.args.metric_for_best_model is None:
            return False
        key = self._metric_key()
        if key not in metrics:
            raise KeyError(
                f"metric_for_best_model={self.args.metric_for_best_model!r} gives the key {key!r}, which "
                f"the evaluation did not return. It returned: {sorted(metrics)}."
            )
        value = metrics[key]
        if metric_improves(value, self.state.best_metric, bool(self.args.greater_is_better)):
            self.state.best_metric = value
            if self.args.save_strategy != "no":
                self.state.best_global_step = self.state.global_step
            return True
        return False

    def _save_checkpoint(self, model: nn.Module | None = None, trial: Any = None) -> None:
        path = training_checkpoint.save(self)
        if self.args.push_to_hub:
            self._push_from_checkpoint(path)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Write the model (safetensors), the processing class and training_args.json.

        Every process calls it (a sharded model is gathered first); the writing process calls
        `_save`. Checkpoints write their weights through it too (`_internal_call=True`)."""
        output_dir = output_dir or self.args.output_dir
        assert output_dir is not None  # TrainingArguments.__post_init__ fills output_dir in
        training_checkpoint.save_model(self, output_dir)
        if self.args.push_to_hub and not _internal_call:  # documented: a user's save_model pushes
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Write weights (`state_dict`, else the model's), processing class and training_args.json."""
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        assert output_dir is not None  # TrainingArguments.__post_init__ fills output_dir in
        os.makedirs(output_dir, exist_ok=True)
        training_checkpoint.write_model(self, output_dir, state_dict=state_dict)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        """Load a checkpoint's weights into `model` (default: the Trainer's)."""
        training_checkpoint.load_weights(
            self, resume_from_checkpoint, model if model is not None else self.model
        )

    def _load_rng_state(self, checkpoint: str | None) -> None:
        """Restore this process's random generators from a checkpoint folder (a missing file warns,
        a damaged one is an error)."""
        if checkpoint is not None:
            training_checkpoint.load_rng_state(self, checkpoint)

    def _load_best_model(self) -> None:
        """Load the weights of `state.best_model_checkpoint` (load_best_model_at_end)."""
        best = self.state.best_model_checkpoint
        logger.info("Loading the best model from %s (score: %s).", best, self.state.best_metric)
        assert best is not None  # called only when there is a best checkpoint
        self._load_from_checkpoint(best)

    def _overrides(self, name: str) -> bool:
        """Whether a subclass overrides the Trainer method `name` (then it is called as upstream does)."""
        return getattr(type(self), name) is not getattr(Trainer, name)

    def _wrap_model(self, model: nn.Module, training: bool = True, dataloader: Any = None) -> nn.Module:
        """The model as training runs it: DDP or FSDP2 over several processes, else itself."""
        return self.runtime.wrap_model(model, self.args) if training else model

    def save_state(self) -> None:
        """Write trainer_state.json to output_dir (main process only)."""
        if self.is_world_process_zero():
            assert self.args.output_dir is not None  # TrainingArguments.__post_init__ fills it in
            self.state.save_to_json(os.path.join(self.args.output_dir, "trainer_state.json"))

    def log_metrics(self, split: str, metrics: dict[str, float]) -> None:
        """Print metrics in upstream's table format (main process only)."""
        _log_metrics(split, metrics, is_world_process_zero=self.is_world_process_zero())

    def save_metrics(self, split: str, metrics: dict[str, float], combined: bool = True) -> None:
        """Write `<split>_results.json`, merged into `all_results.json` when combined."""
        assert self.args.output_dir is not None  # TrainingArguments.__post_init__ fills it in
        _save_metrics(
            self.args.output_dir, split, metrics, combined, is_world_process_zero=self.is_world_process_zero()
        )

    def metrics_format(self, metrics: dict[str, float]) -> dict[str, Any]:
        return _metrics_format(metrics)

    # ------------------------------------------------------------------ Hub and model card
    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """Create the Hub repository `args.hub_model_id` (default: output_dir's name) if it does not
        exist and keep its id in `self.hub_model_id` (main process only)."""
        hub.init_repo(self, token=token, private=private)

    def create_model_card(
        self,
        language: str | None = None,
        license: str | None = None,
        tags: str | list[str] | None = None,
        model_name: str | None = None,
        finetuned_from: str | None = None,
        tasks: str | list[str] | None = None,
        dataset_tags: str | list[str] | None = None,
        dataset: str | list[str] | None = None,
        dataset_args: str | list[str] | None = None,
    ) -> None:
        """Write `output_dir/README.md`: metadata, hyperparameters and the results of
        `state.log_history` (main process only; see `model_card.py`)."""
        from trainwright.loop.model_card import write_model_card

        write_model_card(
            self,
            language=language,
            license=license,
            tags=tags,
            model_name=model_name,
            finetuned_from=finetuned_from,
            tasks=tasks,
            dataset_tags=dataset_tags,
            dataset=dataset,
            dataset_args=dataset_args,
        )

    def push_to_hub(
        self,
        commit_message: str | None = "End of training",
        blocking: bool = True,
        token: str | None = None,
        revision: str | None = None,
        private: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """Save the model, write its card (`kwargs` go to `create_model_card`) and upload output_dir
        to `hub_model_id`. Returns the commit info, or a Future of it when not `blocking`."""
        return hub.push_to_hub(self, commit_message, blocking, token, revision, private, **kwargs)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """Push a checkpoint just saved in the background, as `hub_strategy` says."""
        hub.push_from_checkpoint(self, checkpoint_folder)

    def _finish_current_push(self) -> None:
        """Wait for the background push of the last checkpoint."""
        hub.finish_current_push(self)

    def _finalize_training(self, start_time: float) -> TrainOutput:
        cursor, args = self.cursor, self.args
        if cursor.steps_since_log > 0 and args.logging_strategy != "no":
            self._log_training_window(self._grad_norm, self._last_lr, start_time)  # the last partial window
        elif cursor.steps_since_log > 0:  # unlogged steps still count in train_loss
            self._fold_loss_window()
        train_loss = cursor.loss_logged_total / max(cursor.steps_attempted, 1)
        steps_run = cursor.steps_applied - cursor.first_step_of_call
        samples_run = (cursor.samples_seen - self._samples_at_start) * self.runtime.world_size
        tokens_run = (cursor.tokens_seen - self._tokens_at_start) * self.runtime.world_size
        metrics = speed_metrics(
            "train",
            start_time,
            num_samples=samples_run,
            num_steps=steps_run,
            num_tokens=tokens_run if args.include_tokens_per_second else None,  # v4
        )
        self.store_flos()
        metrics["total_flos"] = self.state.total_flos
        metrics["train_loss"] = train_loss
        self._memory_tracker.stop_and_update_metrics("train", metrics)
        self.log(metrics)
        if args.load_best_model_at_end and self.state.best_model_checkpoint is not None:
            self._load_best_model()
        training_checkpoint.cleanup_after_training(self)
        self.control = self.callback_handler.on_train_end(args, self.state, self.control)
        self._finish_current_push()  # the last checkpoint's upload is done when train() returns
        return TrainOutput(self.state.global_step, train_loss, metrics)

    # ------------------------------------------------------------------ evaluate / predict
    def evaluate(
        self,
        eval_dataset: Dataset | dict[str, Dataset] | str | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> dict[str, float]:
        """Evaluate; with a dict of datasets, each one's metrics are prefixed `eval_<name>_`."""
        return prediction.evaluate(self, eval_dataset, ignore_keys, metric_key_prefix)

    def predict(
        self, test_dataset: Dataset, ignore_keys: list[str] | None = None, metric_key_prefix: str = "test"
    ) -> PredictionOutput:
        """Predictions (padded with -100 across batches), labels and metrics for a dataset."""
        return prediction.predict(self, test_dataset, ignore_keys, metric_key_prefix)

    def evaluation_loop(
        self,
        dataloader: torch.utils.data.DataLoader,
        description: str,
        prediction_loss_only: bool | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> EvalLoopOutput:
        """Run `prediction_step` over a dataloader, streaming results to the CPU."""
        return prediction.evaluation_loop(
            self, dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix
        )

    def prediction_step(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[torch.Tensor | None, Any, Any]:
        """(loss, logits, labels) for one batch, without gradients."""
        return prediction.prediction_step(self, model, inputs, prediction_loss_only, ignore_keys)

    # ------------------------------------------------------------------ hyperparameter search
    def hyperparameter_search(self, *args: Any, **kwargs: Any):
        """Search hyperparameters with optuna or Ray Tune (see `trainwright.loop.hpo`, `hpo_ray`)."""
        from trainwright.loop.hpo import run_hyperparameter_search

        return run_hyperparameter_search(self, *args, **kwargs)


def _signature_params(fn: Callable) -> list:
    import inspect

    return list(inspect.signature(fn).parameters.values())


def _forward_params(model: nn.Module) -> list[str]:
    import inspect

    return list(inspect.signature(model.forward).parameters)


def _has_targets(batch: Any, label_shift: bool) -> bool:
    """Whether a batch has labels with at least one target (a CPU count, no device sync)."""
    if not isinstance(batch, Mapping) or not isinstance(batch.get("labels"), torch.Tensor):
        return False
    return bool(items_in_batch(batch, label_shift))


def _enable_activation_checkpointing(model: nn.Module, kwargs: dict | None) -> None:
    """transformers >= 5.x names it `activation_checkpointing_enable` (the old name warns)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(model, "gradient_checkpointing_enable"):
        # transformers v4's name
        cast(Any, model).gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ValueError(
            f"gradient_checkpointing=True: {type(model).__name__} has no gradient_checkpointing_enable(); "
            "checkpoint its blocks with torch.utils.checkpoint yourself or set gradient_checkpointing=False."
        )


def _epoch_done(cursor: LoopCursor) -> bool:
    return cursor.steps_in_epoch > 0 and cursor.batch_in_epoch >= cursor.steps_in_epoch
