"""`TrainerSetup`: building a Trainer and sizing a run, before the loop.

Construction (`__init__`: arguments, runtime, seed, model, data, callbacks, state), the model facts
the loop relies on (label names, loss kwargs, label smoothing), `set_initial_training_values`, the
hooks patched onto the model for a train() call, and the once-per-run measurement of whether the
model's loss honours `num_items_in_batch`. `TrainerAPI` (trainer_api.py) and `Trainer`
(trainer.py) build on it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset

from trainwright import data as data_utils
from trainwright.args import foreign, process_state
from trainwright.args.training_args import TrainingArguments
from trainwright.callbacks import DEFAULT_CALLBACKS, PrinterCallback, ProgressCallback
from trainwright.callbacks.jit_checkpoint import JITCheckpointCallback
from trainwright.core.enums import DebugOption
from trainwright.core.events import CallbackHandler, TrainerCallback
from trainwright.core.modules import without_peft
from trainwright.core.output_lock import create_output_dir
from trainwright.core.runtime import Runtime, get_runtime
from trainwright.core.seed import enable_full_determinism, set_seed
from trainwright.core.state import TrainerControl, TrainerState
from trainwright.distributed import accelerate_state, context_parallel, parallelism
from trainwright.distributed.accelerator import RuntimeAccelerator
from trainwright.loop import dataloaders, plugins
from trainwright.loop.hub import push as hub
from trainwright.loop.run.training_run import TrainingRun, empty_training_message
from trainwright.modeling.loss import LabelSmoother, LossFacts
from trainwright.observe.flops import FlopsEstimator
from trainwright.observe.memory import TrainerMemoryTracker
from trainwright.reporters import get_reporting_integration_callbacks

if TYPE_CHECKING:
    from trainwright.loop.hub.model_card import CardSource
    from trainwright.loop.search.hpo import _Search

logger = logging.getLogger(__name__)


class TrainerSetup:
    """Construction and run sizing of the Trainer (upstream's signatures)."""

    # Set by __init__ (upstream's attributes, and `_run`: the current or last train() call's run);
    # declared here, where the methods of all three classes read them.
    args: TrainingArguments
    runtime: Runtime
    model: nn.Module
    model_wrapped: nn.Module
    model_init: Callable[..., nn.Module] | None
    processing_class: Any
    data_collator: Callable
    train_dataset: Any
    eval_dataset: Any
    compute_loss_func: Callable | None
    compute_metrics: Callable[..., dict] | None
    preprocess_logits_for_metrics: Callable | None
    optimizer: torch.optim.Optimizer | None
    lr_scheduler: Any
    optimizer_cls_and_kwargs: tuple[type, dict] | None
    callback_handler: CallbackHandler
    state: TrainerState
    control: TrainerControl
    scaler: torch.amp.GradScaler | None
    label_names: list[str]
    label_smoother: LabelSmoother | None
    can_return_loss: bool
    is_in_train: bool
    hp_search_backend: str | None
    hub_model_id: str | None
    push_in_progress: hub.PushInProgress | None
    neftune_noise_alpha: float | None
    _run: TrainingRun | None
    _accelerator: RuntimeAccelerator
    _loss_facts: LossFacts
    _memory_tracker: TrainerMemoryTracker
    _flops: FlopsEstimator | None
    _signature_columns: list[str] | None
    _created_lr_scheduler: bool
    _train_batch_size: int
    _hp_search: _Search | None  # hpo's search while one runs (hyperparameter_search sets it)
    _plugins: list[plugins.PlugIn]  # the optional features these arguments ask for (plugins.PLUGINS)
    _args_source: foreign.Source | None  # transformers' arguments object `args` was converted from

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
        # transformers' own arguments are converted (a library's subclass of them is refused); the
        # user's later changes to that object reach the conversion at train() / evaluate() / predict()
        args, self._args_source = (
            (TrainingArguments(output_dir="tmp_trainer"), None) if args is None else foreign.convert(args)
        )
        self.args = args
        if tokenizer is not None:
            warnings.warn("`tokenizer` is deprecated: pass `processing_class`.", FutureWarning, stacklevel=2)
            processing_class = processing_class if processing_class is not None else tokenizer
        self.runtime = get_runtime(use_cpu=args.use_cpu, backend=args.ddp_backend, timeout_s=args.ddp_timeout)
        process_state.configured_state_agrees(args, self.runtime)
        _check_bf16_device(args, self.runtime)
        accelerate_state.share_with_accelerate(args, self.runtime)  # for libraries that read it (TRL)
        # parallelism_config's DeviceMesh, or the layout of a model loaded already sharded: this Trainer's
        self.runtime = parallelism.with_layout(args, self.runtime, model)
        self._accelerator = RuntimeAccelerator(self.runtime, args)
        _set_log_level(args)
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

        _check_model_arguments(args, model, model_init, optimizers, optimizer_cls_and_kwargs)
        self.model_init = model_init
        if model is None:
            model = self.call_model_init()
        self.model = self._place(model)
        self.model_wrapped = self.model
        self._hand_accelerator()
        self.label_names, self.can_return_loss, self.label_smoother, self._loss_facts = self._model_facts()
        self.processing_class = processing_class
        self.compute_loss_func = compute_loss_func
        if self.runtime.parallel_size("cp") > 1:  # a shard's labels are not what a loss function expects
            context_parallel.check_loss_function(compute_loss_func)
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
        self._validate_data()

        default = DEFAULT_CALLBACKS + get_reporting_integration_callbacks(args.report_to)
        self._plugins = plugins.build(args, self.runtime, self.model)  # optional features: plugins.PLUGINS
        added = [callback for plugin in self._plugins for callback in plugin.callbacks()]
        for callback in added:
            if isinstance(callback, JITCheckpointCallback):
                callback.set_trainer(self)  # as upstream's Trainer sets itself on its JIT callback
        callbacks = default + added + list(callbacks or [])
        callbacks.append(PrinterCallback if args.disable_tqdm else ProgressCallback)
        self.callback_handler = CallbackHandler(
            callbacks, self.model, self.processing_class, self.optimizer, self.lr_scheduler
        )
        self.hub_model_id = None  # the Hub repository, once init_hf_repo() has made it
        self.push_in_progress = None  # the last checkpoint push's uploads
        if args.push_to_hub:
            self.init_hf_repo()
        if args.should_save:
            create_output_dir(args.output_dir)  # as upstream; an empty path, a file, no permission: named
        self.state = TrainerState(
            is_local_process_zero=self.is_local_process_zero(),
            is_world_process_zero=self.is_world_process_zero(),
        )
        self.control = TrainerControl()
        self.scaler = None
        self.is_in_train = False
        self.hp_search_backend = None
        self.neftune_noise_alpha = args.neftune_noise_alpha
        self._run = None
        self._flops = None
        self._signature_columns = None
        self._created_lr_scheduler = False
        self._train_batch_size = args.train_batch_size  # as upstream (auto_find_batch_size keeps its size)
        self._hp_search = None
        self._eval_dataloaders: dict[str, Any] = {}  # upstream's: kept eval loaders (persistent workers)
        self._eval_dataloader_datasets: dict[str, Any] = {}
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

    def _hand_accelerator(self, run: TrainingRun | None = None) -> None:
        """What `trainer.accelerator` answers from (it holds no Trainer): the arguments, the trained
        model and its wrapper, and the run while train() runs (None after)."""
        if isinstance(self._accelerator, RuntimeAccelerator):  # a library may put its own there
            self._accelerator.follow(self.args, run, (self.model, self.model_wrapped))

    def _model_facts(self) -> tuple[list[str], bool, LabelSmoother | None, LossFacts]:
        """(label_names, can_return_loss, label_smoother, loss facts) of `self.model`, as upstream
        derives them in `__init__` (once: a model `model_init` builds in `train()` gets only its
        loss facts and `use_cache`, `_model_loss_facts`)."""
        model, args = self.model, self.args
        label_names = list(args.label_names) if args.label_names is not None else self._find_labels(model)
        eps = args.label_smoothing_factor
        smoother = LabelSmoother(epsilon=eps) if eps != 0 else None
        if (
            eps != 0
            and getattr(getattr(model, "config", None), "problem_type", None) == "multi_label_classification"
        ):
            warnings.warn(  # as upstream: smoothing one-hot targets makes no sense for independent labels
                "Label smoothing is not compatible with multi-label classification. Disabling label "
                "smoothing for this training run (label_smoothing_factor, problem_type='multi_label_classification').",
                UserWarning,
                stacklevel=3,
            )
            smoother = None
        return label_names, "return_loss" in _forward_params(model), smoother, self._model_loss_facts()

    def _model_loss_facts(self) -> LossFacts:
        """What the accumulation needs of `self.model` (`LossFacts`); its config's `use_cache` set."""
        model = self.model
        if getattr(model, "config", None) is not None and hasattr(model.config, "use_cache"):
            model.config.use_cache = self.args.use_cache
        return LossFacts.of(model)

    @staticmethod
    def _find_labels(model: nn.Module) -> list[str]:
        name = type(without_peft(model)).__name__
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

    def _sync_args(self) -> None:
        """Changes made since to the transformers arguments object `args` was converted from, onto
        `self.args` (transformers' Trainer holds that object itself)."""
        if self._args_source is not None:
            self._args_source.sync(self.args)

    def call_model_init(self, trial: Any = None) -> nn.Module:
        """Build a fresh model with `model_init` (which may take the HP-search trial)."""
        if self.model_init is None:
            raise RuntimeError("call_model_init needs a `model_init`: pass Trainer(model_init=...).")
        n_args = len([p for p in _signature_params(self.model_init) if p.default is p.empty])
        model = self.model_init() if n_args == 0 else self.model_init(trial)
        if model is None:
            raise RuntimeError("model_init returned None: it must return a torch.nn.Module.")
        return model

    def _check_eval_dataset(self) -> None:
        args = self.args
        if args.eval_strategy != "no" and self.eval_dataset is None:
            strategy = getattr(args.eval_strategy, "value", args.eval_strategy)
            raise ValueError(
                f"eval_strategy={strategy!r} needs an eval_dataset: pass one to the Trainer or set eval_strategy='no'."
            )

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
                raise ValueError(empty_training_message(dataloader, args, self.runtime.world_size))
            if self.runtime.distributed:
                _check_same_batches(self.runtime, batches)
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

    def _plugins_on(self, module: nn.Module, state: TrainerState) -> contextlib.ExitStack:
        """The plug-ins' hooks around one run, on the module its engine trains (the run closes them)."""
        return plugins.around_run(self._plugins, module, state)

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """Create the Hub repository `args.hub_model_id` (default: output_dir's name) if it does not
        exist and keep its id in `self.hub_model_id` (main process only)."""
        self.hub_model_id = hub.init_repo(self.args, self.is_world_process_zero(), token, private)
        self.push_in_progress = None

    def _card_source(self) -> CardSource:
        """What the model card reads of this Trainer's run (`create_model_card`)."""
        from trainwright.loop.hub.model_card import CardSource

        runtime = self.runtime
        return CardSource(
            self.args, self.state, self.model, self.train_dataset, self.eval_dataset,
            runtime.world_size, runtime.device.type,
        )  # fmt: skip

    def _hub_push(self, token: str | None = None, private: bool | None = None) -> hub.HubPush:
        """What a push reads now, and the two hooks it calls back (bound here, never kept)."""

        def repo_id() -> str | None:
            if self.hub_model_id is None:  # push_to_hub turned on, or called, after __init__
                self.init_hf_repo(token=token, private=private)
            return self.hub_model_id

        args, state, control = self.args, self.state, self.control
        return hub.HubPush(
            args, state, self.is_world_process_zero(), self.model, self.processing_class,
            self.push_in_progress, repo_id, lambda: self.callback_handler.on_push_begin(args, state, control),
        )  # fmt: skip

    @property
    def model_accepts_loss_kwargs(self) -> bool:
        """Whether the model's loss uses `num_items_in_batch` (upstream's attribute; may be set)."""
        return self._loss_facts.accepts_loss_kwargs

    @model_accepts_loss_kwargs.setter
    def model_accepts_loss_kwargs(self, value: bool) -> None:
        self._loss_facts.accepts_loss_kwargs = bool(value)
        self._loss_facts.probe = False  # the user's word wins over a measurement

    def is_local_process_zero(self) -> bool:
        return self.runtime.is_local_main_process

    def is_world_process_zero(self) -> bool:
        return self.runtime.is_main_process

    def num_examples(self, dataloader: torch.utils.data.DataLoader) -> int:
        """Samples in the dataloader's dataset; else batches x batch size (the loader's, else the
        argument's), for a loader without `.dataset` or `.batch_size`."""
        return dataloaders.num_examples(dataloader, self.args.per_device_train_batch_size)

    def get_total_train_batch_size(self, args: TrainingArguments) -> int:
        """Samples per optimizer step: batch x accumulation x data-parallel ranks (processes)."""
        return (
            args.per_device_train_batch_size * args.gradient_accumulation_steps * self.runtime.data_world_size
        )

    # ------------------------------------------------------------------ data (upstream's loader hooks; run sizing reads the loaders)
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
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        size = self.args.per_device_train_batch_size
        return self._loaders().get(self.train_dataset, "training", size, self._get_train_sampler, True)

    def _loaders(self) -> dataloaders.Loaders:
        """What building a data loader reads of the Trainer, taken now; its hooks bound."""
        model, prepare = getattr(self, "model", None), self._accelerator.prepare_data_loader
        hooks = (self._remove_unused_columns, self._get_collator_with_removed_columns, self._get_eval_sampler)
        return dataloaders.Loaders(
            self.args, self.runtime, self.data_collator, model, *hooks, prepare, self._eval_dataloaders
        )

    def get_resumed_dataloader(self, dataloader: Any, num_batches: int) -> Any:
        """The training loader of a resumed epoch past its first `num_batches` batches (transformers
        5.25). trainwright's loader starts its sampler after them, loading none; another loader loads
        and drops them. A subclass's override is called where a resume skips, as upstream."""
        return dataloaders.resumed_dataloader(dataloader, num_batches)

    def get_eval_dataloader(self, eval_dataset: str | Dataset | None = None) -> torch.utils.data.DataLoader:
        """Evaluation dataloader (a name selects one of a dict of eval datasets)."""
        sources, log = self._eval_dataloader_datasets, self.state.log_history
        return self._loaders().evaluation(self.eval_dataset, eval_dataset, sources, log)

    def _get_dataloader(
        self,
        dataset: Dataset,
        description: str,
        batch_size: int,
        sampler_fn: Callable[[Dataset], torch.utils.data.Sampler] | None = None,
        is_training: bool = False,
        dataloader_key: str | None = None,
    ) -> torch.utils.data.DataLoader:
        """A data loader of `dataset` as the Trainer builds its own (upstream's helper, which
        subclasses such as TRL's GRPOTrainer call with their own batch size and sampler)."""
        loaders = self._loaders()
        return loaders.get(dataset, description, batch_size, sampler_fn, is_training, dataloader_key)

    def get_test_dataloader(self, test_dataset: Dataset) -> torch.utils.data.DataLoader:
        return self._loaders().inference(test_dataset, "test")


def _set_log_level(args: TrainingArguments) -> None:
    """This process's log level for trainwright (and transformers, as upstream's Trainer sets it)."""
    if (args.log_level if args.should_log else args.log_level_replica) == "passive":
        return
    level = args.get_process_log_level()  # replicas: warning
    logging.getLogger("trainwright").setLevel(level)
    if importlib.util.find_spec("transformers") is not None:
        import transformers.utils.logging as hf_logging

        hf_logging.set_verbosity(level)


def _check_bf16_device(args: TrainingArguments, runtime: Runtime) -> None:
    """bf16 on a device without it is refused, as transformers refuses it: on the CPU only with
    `use_cpu=True` (torch's CPU autocast in bfloat16), on a GPU only where it has bfloat16."""
    if not (args.bf16 or args.bf16_full_eval):
        return
    field = "bf16" if args.bf16 else "bf16_full_eval"
    if runtime.device.type == "cpu" and not args.use_cpu:
        raise ValueError(
            f"{field}=True, and this machine has no GPU with bfloat16: on the CPU, bf16 needs use_cpu=True "
            f"(as transformers requires), or set {field}=False"
        )
    if not runtime.bf16_supported():
        raise ValueError(f"{field}=True, and {runtime.device} has no bfloat16 support: set {field}=False")


def _check_model_arguments(
    args: TrainingArguments, model: Any, model_init: Any, optimizers: tuple, optimizer_cls_and_kwargs: Any
) -> None:
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


def _signature_params(fn: Callable) -> list:
    import inspect

    return list(inspect.signature(fn).parameters.values())


def _forward_params(model: nn.Module) -> list[str]:
    import inspect

    return list(inspect.signature(without_peft(model).forward).parameters)  # a PEFT model's base, as upstream


def enable_activation_checkpointing(model: nn.Module, kwargs: dict | None) -> None:
    """transformers >= 5.x names it `activation_checkpointing_enable` (the old name warns); as upstream,
    `every_n_layers` and `offload` are its own arguments, the other keys go to torch's checkpoint."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        options = dict(kwargs or {})
        layout = {k: options.pop(k) for k in ("every_n_layers", "offload") if k in options}
        enable(activation_checkpointing_kwargs=options or None, **layout)
    elif hasattr(model, "gradient_checkpointing_enable"):
        # transformers v4's name
        cast(Any, model).gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ValueError(
            f"gradient_checkpointing=True: {type(model).__name__} has no gradient_checkpointing_enable(); "
            "checkpoint its blocks with torch.utils.checkpoint yourself or set gradient_checkpointing=False."
        )


def _check_same_batches(runtime: Any, batches: int) -> None:
    """Every process must take the same number of steps (each waits for the others in the gradient
    all-reduce): a training loader that gives them different numbers of batches is refused rather
    than left to hang (a library's own loader with `even_batches=False`, as sentence-transformers
    prepares its training loader)."""
    counts = runtime.all_gather_object(batches)
    if len(set(counts)) > 1:
        raise ValueError(
            f"The training data gives the {len(counts)} processes {counts} batches per epoch, but every "
            "process must take the same number of optimizer steps (each waits for the others in the "
            "gradient all-reduce). With trainer.accelerator.even_batches=False (or accelerator_config's "
            "even_batches=False) the last batches are not evened out: use a dataset whose batches divide "
            "evenly over the processes, dataloader_drop_last=True, or even_batches=True."
        )
