"""`TFTrainingArguments`: the shared `TrainingArguments` plus transformers v4's TensorFlow fields.

Every shared field is either honoured by `TFTrainer` (listed in `HONOURED`) or, when given a value
other than its default, refused with a `ValueError` naming it: nothing is accepted and ignored.
The shared validation (`TrainingArguments.__post_init__`) runs as it does for the PyTorch side.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from dataclasses import dataclass, field
from typing import Any

from trainwright.args.aliases import takes_removed_v4_args
from trainwright.args.serialization import jsonable
from trainwright.args.training_args import TrainingArguments

# Shared fields that TFTrainer gives a meaning (docs/tf.md says which).
HONOURED = frozenset(
    {
        "output_dir",
        "overwrite_output_dir",
        "do_train",
        "do_eval",
        "do_predict",
        "resume_from_checkpoint",
        "per_device_train_batch_size",
        "per_device_eval_batch_size",
        "per_gpu_train_batch_size",
        "per_gpu_eval_batch_size",
        "gradient_accumulation_steps",
        "num_train_epochs",
        "max_steps",
        "learning_rate",
        "weight_decay",
        "adam_beta1",
        "adam_beta2",
        "adam_epsilon",
        "max_grad_norm",
        "optim",
        "lr_scheduler_type",
        "lr_scheduler_kwargs",
        "warmup_steps",
        "warmup_ratio",
        "logging_strategy",
        "logging_steps",
        "logging_first_step",
        "logging_nan_inf_filter",
        "logging_dir",
        "log_level",
        "log_level_replica",
        "log_on_each_node",
        "report_to",
        "run_name",
        "eval_strategy",
        "evaluation_strategy",
        "eval_steps",
        "eval_delay",
        "eval_on_start",
        "prediction_loss_only",
        "label_names",
        "save_strategy",
        "save_steps",
        "save_total_limit",
        "save_only_model",
        "load_best_model_at_end",
        "metric_for_best_model",
        "greater_is_better",
        "ignore_data_skip",
        "seed",
        "data_seed",
        "full_determinism",
        "dataloader_drop_last",
        "use_cpu",
        "no_cuda",
        "disable_tqdm",
        "preemption_signals",
        "enable_jit_checkpoint",
        # defaults that describe what TF does anyway (a non-default value is refused below)
        "dataloader_pin_memory",
        "remove_unused_columns",
        "half_precision_backend",
        "fp16_backend",
        "ddp_timeout",
        "hub_strategy",
        "project",
        "ray_scope",
    }
)

# Shared fields whose default the TF side cannot honour but which, at that default, mean nothing here.
_INERT_AT_DEFAULT = frozenset({"dataloader_pin_memory", "remove_unused_columns", "half_precision_backend"})
_INERT_AT_DEFAULT |= {"fp16_backend", "ddp_timeout", "hub_strategy", "project", "ray_scope"}

# Optimizer names: the AdamW family maps to keras.optimizers.AdamW, "sgd" to keras.optimizers.SGD.
ADAMW_NAMES = frozenset({"adamw_torch_fused", "adamw_torch", "adamw_hf", "adamw"})
OPTIM_NAMES = ADAMW_NAMES | {"sgd"}
SCHEDULES = (
    "linear",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "cosine",
    "cosine_with_restarts",
    "inverse_sqrt",
    "cosine_with_min_lr",
    "warmup_stable_decay",
)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _is_default(value: Any, default: Any) -> bool:
    if value == default:
        return True
    # An empty container and None mean "nothing" alike (e.g. lr_scheduler_kwargs, debug).
    return not value and not default and value is not False and default is not False


@takes_removed_v4_args
@dataclass(repr=False)
class TFTrainingArguments(TrainingArguments):
    """`TrainingArguments` for `TFTrainer` (TensorFlow 2, Keras 3).

    Adds transformers v4's TF fields. `strategy` is the `tf.distribute` strategy the trainer runs
    under, made on first use: `TPUStrategy` when `tpu_name` is set, `MultiWorkerMirroredStrategy`
    when `TF_CONFIG` names several workers, `MirroredStrategy` when there are several GPUs (or
    several logical CPU devices configured before TensorFlow started), else `OneDeviceStrategy`.
    Build the model under `args.strategy.scope()` when there is more than one replica.
    """

    tpu_name: str | None = field(default=None, metadata={"help": "Name of the Cloud TPU to use."})
    tpu_zone: str | None = field(default=None, metadata={"help": "GCE zone of the Cloud TPU."})
    gcp_project: str | None = field(default=None, metadata={"help": "Google Cloud project of the TPU."})
    poly_power: float = field(default=1.0, metadata={"help": "Power of the polynomial decay schedule."})
    xla: bool = field(default=False, metadata={"help": "Compile the training step with XLA (jit_compile)."})

    def __post_init__(self) -> None:
        self._refuse_torch_only()
        super().__post_init__()
        if isinstance(self.optim, str) and str(self.optim) not in OPTIM_NAMES:
            raise ValueError(
                f"optim={str(self.optim)!r} is not available in TFTrainer; choose one of {sorted(OPTIM_NAMES)}"
            )
        if str(self.lr_scheduler_type) not in SCHEDULES:
            raise ValueError(
                f"lr_scheduler_type={str(self.lr_scheduler_type)!r} is not available in TFTrainer; "
                f"choose one of {list(SCHEDULES)}"
            )
        if str(self.save_strategy) == "best":
            raise ValueError(
                "save_strategy='best' is not supported by TFTrainer; use 'steps' or 'epoch' with "
                "metric_for_best_model (save_total_limit keeps the best checkpoint)"
            )
        if not (isinstance(self.poly_power, (int, float)) and self.poly_power > 0):
            raise ValueError(f"poly_power must be a number > 0; got {self.poly_power!r}")
        if self.tpu_name is None and (self.tpu_zone is not None or self.gcp_project is not None):
            raise ValueError("tpu_zone and gcp_project locate a TPU: they need tpu_name")
        self._strategy: Any = None

    def _refuse_torch_only(self) -> None:
        """Refuse every shared field TFTrainer does not implement when it is set (nothing silent)."""
        for f in dataclasses.fields(TrainingArguments):
            if f.name in HONOURED and f.name not in _INERT_AT_DEFAULT:
                continue
            default = _default(f)
            value = getattr(self, f.name)
            if default is dataclasses.MISSING or _is_default(value, default):
                continue
            if jsonable(value) == _validated_defaults().get(f.name):  # e.g. read back from to_dict()
                continue
            raise ValueError(
                f"TFTrainingArguments: {f.name}={value!r} is not supported by TFTrainer "
                f"(it is a PyTorch Trainer setting); leave it at its default {default!r}. "
                "See docs/tf.md for what the TensorFlow trainer honours."
            )

    # -- processes and devices (TensorFlow's view) -------------------------------------------------

    @property
    def strategy(self) -> Any:
        """The `tf.distribute.Strategy` of this run (made once, on first use)."""
        if self._strategy is None:
            from trainwright.tf.strategy import make_strategy

            self._strategy = make_strategy(self)
        return self._strategy

    @property
    def n_replicas(self) -> int:
        """Number of replicas the strategy keeps in sync (devices over all workers)."""
        return int(self.strategy.num_replicas_in_sync)

    @property
    def train_batch_size(self) -> int:
        """Samples per optimizer micro-step over all replicas (v4: per device x replicas)."""
        return self.per_device_train_batch_size * self.n_replicas

    @property
    def eval_batch_size(self) -> int:
        """Samples per evaluation step over all replicas."""
        return self.per_device_eval_batch_size * self.n_replicas

    @property
    def n_gpu(self) -> int:
        """GPUs TensorFlow sees (0 with use_cpu or on the CPU wheel)."""
        if self.use_cpu:
            return 0
        import tensorflow as tf

        return len(tf.config.list_logical_devices("GPU"))

    @property
    def world_size(self) -> int:
        """Worker processes named by TF_CONFIG (1 without it)."""
        return _cluster_info()[0]

    @property
    def process_index(self) -> int:
        """This worker's index in TF_CONFIG (0 without it)."""
        return _cluster_info()[1]

    @property
    def local_process_index(self) -> int:
        """This worker's index among the TF_CONFIG workers on its host (0 without TF_CONFIG)."""
        return _cluster_info()[2]

    @property
    def should_log(self) -> bool:
        """Each host's first worker with log_on_each_node, else worker 0."""
        return (self.local_process_index if self.log_on_each_node else self.process_index) == 0

    @property
    def should_save(self) -> bool:
        return self.process_index == 0


@functools.cache
def _validated_defaults() -> dict[str, Any]:
    """What the shared validation makes of the defaults (to_dict() output reads back as these)."""
    return TrainingArguments().to_dict()


def _cluster_info() -> tuple[int, int, int]:
    """(number of workers, this worker's index, its index among the workers on its host) from
    TF_CONFIG; a chief counts as worker 0."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return 1, 0, 0
    try:
        config = json.loads(raw)
        cluster = config.get("cluster", {})
        task = config.get("task", {})
    except (json.JSONDecodeError, AttributeError) as exc:
        raise ValueError(
            f"environment variable TF_CONFIG is not a JSON object with cluster/task: {exc}"
        ) from None
    chiefs = len(cluster.get("chief", []))
    workers = len(cluster.get("worker", []))
    kind, index = task.get("type", "worker"), int(task.get("index", 0))
    if kind not in ("chief", "worker"):
        raise ValueError(f"TF_CONFIG task type {kind!r}: TFTrainer runs as 'chief' or 'worker' only")
    addresses = [str(a) for a in cluster.get("chief", [])] + [str(a) for a in cluster.get("worker", [])]
    me = index if kind == "chief" else chiefs + index
    host = addresses[me].rpartition(":")[0] if me < len(addresses) else ""
    local = sum(1 for a in addresses[:me] if a.rpartition(":")[0] == host)
    return max(1, chiefs + workers), me, local
