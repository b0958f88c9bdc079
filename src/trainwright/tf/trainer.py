"""`TFTrainer`: transformers v4's TensorFlow trainer API on TensorFlow 2 and Keras 3.

The loop reads as the PyTorch one does: per optimizer step, fetch the step's batch, run the
compiled step (micro-batches, gradient sum, clip, apply: steps.py), update the counters, fire the
callbacks' events, maybe log / evaluate / save. State, control, callbacks, reporters, checkpoint
folders and metrics files are trainwright's shared ones.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainwright.callbacks import DefaultFlowCallback, ProgressCallback
from trainwright.checkpoint import PREFIX_CHECKPOINT_DIR, get_last_checkpoint, rotate_checkpoints
from trainwright.core.events import CallbackHandler, TrainerCallback
from trainwright.core.preemption import PreemptionGuard
from trainwright.core.state import TrainerControl, TrainerState, metric_improves
from trainwright.observe.metrics import (
    EvalPrediction,
    PredictionOutput,
    TrainOutput,
    denumpify_detensorize,
    log_metrics,
    save_metrics,
    speed_metrics,
)
from trainwright.reporters import get_reporting_integration_callbacks, normalize_report_to
from trainwright.reporters.base import env_choice
from trainwright.tf import checkpointing
from trainwright.tf.arguments import TFTrainingArguments
from trainwright.tf.data import epoch_order, known_length, split_element
from trainwright.tf.guard import guarded_train, preempted
from trainwright.tf.reporting import TFTensorBoardCallback
from trainwright.tf.schedule import TabulatedSchedule, make_optimizer, make_schedule
from trainwright.tf.steps import make_eval_function, make_train_function

logger = logging.getLogger(__name__)


def _outputs(out: Any) -> tuple[Any, Any]:
    """(loss, logits) of a model's output: a tuple/list, a mapping, or an object with attributes."""
    if isinstance(out, (tuple, list)):
        return out[0], (out[1] if len(out) > 1 else None)
    if isinstance(out, Mapping):
        return out.get("loss"), out.get("logits")
    if hasattr(out, "loss"):
        return out.loss, getattr(out, "logits", None)
    raise TypeError(
        f"the model returned {type(out).__name__}; TFTrainer needs (loss, logits), a dict with 'loss' "
        "and 'logits', or an object with .loss/.logits"
    )


# Reporters tried with TFTrainer; the others read PyTorch modules (model export, parameter counts).
TF_REPORTERS = ("tensorboard", "wandb", "comet_ml", "jsonl", "csv")


def _tf_report_to(report_to: Any) -> list[str]:
    """`report_to` as names TFTrainer runs: "all" keeps the installed ones it supports (logging the
    others it leaves out); naming an unsupported one is an error."""
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    named = [n for n in names if n not in ("all", "none")]
    refused = [n for n in named if n not in TF_REPORTERS]
    if refused:
        raise ValueError(
            f"report_to {refused}: not supported by TFTrainer; it reports to {list(TF_REPORTERS)}"
        )
    out = normalize_report_to(report_to)
    for name in out:
        if name not in TF_REPORTERS:
            logger.info("report_to='all' leaves out %s: not supported by TFTrainer", name)
    return [n for n in out if n in TF_REPORTERS]


class TFTrainer:
    """Trains, evaluates and predicts with a Keras 3 model under a `tf.distribute` strategy.

    The model's call takes the batch (a dict of features with the labels under "labels", or
    `model(features, labels=labels, training=...)` when its `call` has a `labels` argument) and
    returns the loss first and the logits second. Datasets are `tf.data.Dataset`s of
    `(features, labels)` or of dicts, unbatched (the trainer batches them); the training dataset's
    length must be known. `optimizers=(optimizer, schedule)` replaces the default AdamW and
    schedule; build both (and the model) under `args.strategy.scope()`.
    """

    def __init__(
        self,
        model: keras.Model,
        args: TFTrainingArguments,
        train_dataset: tf.data.Dataset | None = None,
        eval_dataset: tf.data.Dataset | None = None,
        compute_metrics: Callable[[EvalPrediction], dict[str, float]] | None = None,
        tb_writer: Any = None,
        optimizers: tuple[Any, Any] = (None, None),
        callbacks: list[TrainerCallback] | None = None,
    ) -> None:
        if not isinstance(args, TFTrainingArguments):
            raise TypeError(f"TFTrainer needs TFTrainingArguments, got {type(args).__name__}")
        self.model = model
        self.args = args
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        self.compute_metrics = compute_metrics
        self.optimizer, self.lr_scheduler = optimizers
        self._given_optimizers = optimizers
        self.tb_writer = tb_writer
        self.global_step = 0
        self.epoch_logging = 0.0
        self.state = TrainerState()
        self.state.is_world_process_zero = args.process_index == 0
        self.state.is_local_process_zero = args.local_process_index == 0
        self.control = TrainerControl()
        self._labels_keyword = "labels" in inspect.signature(model.call).parameters
        self._train_fns: dict[bool, Any] = {}
        self._eval_fns: dict[bool, Any] = {}
        self._loss_window: list[tf.Tensor] = []
        self._loss_logged_total = 0.0
        self._last_norm: tf.Tensor | None = None
        self._preemption: PreemptionGuard | None = None  # set while train() runs
        if args.full_determinism:
            tf.config.experimental.enable_op_determinism()
        keras.utils.set_random_seed(args.seed)
        logging.getLogger("trainwright").setLevel(args.get_process_log_level())
        reporters: list[Any] = []
        for cls in get_reporting_integration_callbacks(_tf_report_to(args.report_to)):
            reporters.append(TFTensorBoardCallback(tb_writer) if cls.name == "tensorboard" else cls())
        if tb_writer is not None and not any(isinstance(r, TFTensorBoardCallback) for r in reporters):
            reporters.append(TFTensorBoardCallback(tb_writer))  # v4: a writer passed in is used
        self._check_reporters(reporters)
        default = [DefaultFlowCallback] + ([] if args.disable_tqdm else [ProgressCallback])
        self.callback_handler = CallbackHandler(
            default + reporters + list(callbacks or []), model, None, None, None
        )
        self.control = self.callback_handler.on_init_end(args, self.state, self.control)

    # -- reporters -------------------------------------------------------------------------------

    @staticmethod
    def _check_reporters(reporters: list[Any]) -> None:
        names = {getattr(r, "name", "") for r in reporters}
        if "wandb" in names:
            for var in ("WANDB_LOG_MODEL", "WANDB_WATCH"):
                if (
                    env_choice(
                        var, ("false", "end", "checkpoint", "gradients", "parameters", "all", "true"), "false"
                    )
                    != "false"
                ):
                    raise ValueError(
                        f"{var} is set, but W&B model artifacts and wandb.watch need a PyTorch module; "
                        "unset it for TFTrainer"
                    )

    def _reporter(self, name: str) -> Any:
        found = [cb for cb in self.callback_handler.callbacks if getattr(cb, "name", None) == name]
        if found:
            return found[0]
        cls = get_reporting_integration_callbacks([name])[0]
        reporter = cls()
        self._check_reporters([reporter])
        self.callback_handler.add_callback(reporter)
        return reporter

    def setup_wandb(self) -> None:
        """Start the Weights & Biases run (W&B reads WANDB_MODE, WANDB_PROJECT, ...) and log the
        arguments, as the reporter of `report_to="wandb"` does at the start of training."""
        self._reporter("wandb").setup(self.args, self.state, None)

    def setup_comet(self) -> None:
        """Start the Comet experiment (COMET_MODE=offline writes an archive) and log the arguments."""
        self._reporter("comet_ml").setup(self.args, self.state, None)

    # -- datasets --------------------------------------------------------------------------------

    def _step_batch(self) -> int:
        """Samples of one optimizer step over all replicas."""
        return (
            self.args.per_device_train_batch_size
            * self.args.gradient_accumulation_steps
            * self.args.n_replicas
        )

    def get_train_tfdataset(self, epoch: int = 0, skip: int = 0) -> tf.data.Dataset:
        """Batches of epoch `epoch` (seeded shuffle, one optimizer step per batch), the first `skip` left out."""
        if self.train_dataset is None:
            raise ValueError("TFTrainer: training needs a train_dataset")
        self.num_train_examples = known_length(self.train_dataset, "train_dataset")
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        return epoch_order(
            self.train_dataset,
            self.num_train_examples,
            seed,
            epoch,
            self._step_batch(),
            self.args.dataloader_drop_last,
            skip,
        )

    def get_eval_tfdataset(self, eval_dataset: tf.data.Dataset | None = None) -> tf.data.Dataset:
        """The evaluation batches (in order), from `eval_dataset` or the trainer's."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("TFTrainer: evaluation needs an eval_dataset")
        return self.get_test_tfdataset(dataset)

    def get_test_tfdataset(self, test_dataset: tf.data.Dataset) -> tf.data.Dataset:
        """`test_dataset` in batches of `per_device_eval_batch_size` x replicas, in order."""
        return test_dataset.batch(self.args.eval_batch_size, drop_remainder=False).prefetch(tf.data.AUTOTUNE)

    # -- model, optimizer --------------------------------------------------------------------------

    def run_model(self, features: Any, labels: Any, training: bool) -> tuple[Any, Any]:
        """Call the model on one batch; returns (loss, logits)."""
        if self._labels_keyword:
            out = self.model(features, labels=labels, training=training)
        elif isinstance(features, Mapping):
            batch = dict(features)
            if labels is not None:
                batch[(self.args.label_names or ["labels"])[0]] = labels
            out = self.model(batch, training=training)
        else:
            raise TypeError(
                "the features are a tensor, not a dict: give the model's call a `labels` argument or make "
                "the dataset's features a dict"
            )
        return _outputs(out)

    def _build_model(self, dataset: tf.data.Dataset | None) -> None:
        if self.model.built and self.model.trainable_variables:
            return
        if dataset is None:
            raise ValueError("the model has no variables yet and there is no dataset to build it on")
        with self.args.strategy.scope():
            features, labels = split_element(next(iter(dataset.batch(1))), self.args.label_names)
            self.run_model(features, labels, False)

    def _check_placement(self) -> None:
        if self.args.n_replicas > 1 and not all(
            isinstance(v.value, tf.distribute.DistributedValues) for v in self.model.trainable_variables
        ):
            raise ValueError(
                f"the strategy has {self.args.n_replicas} replicas but the model's variables were made outside "
                "it: build the model under `args.strategy.scope()`"
            )

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        """The default optimizer (AdamW, or `optim`) and schedule, unless `optimizers` gave them."""
        with self.args.strategy.scope():
            if self.lr_scheduler is None:
                self.lr_scheduler = make_schedule(self.args, num_training_steps)
            if self.optimizer is None:
                self.optimizer = make_optimizer(self.args, self.lr_scheduler, self.model)
            elif not self.optimizer.built:
                self.optimizer.build(self.model.trainable_variables)
        self.callback_handler.optimizer = self.optimizer
        self.callback_handler.lr_scheduler = self.lr_scheduler

    def _learning_rate(self) -> float:
        if isinstance(self.lr_scheduler, TabulatedSchedule):
            return self.lr_scheduler.value_at(max(self.global_step - 1, 0))
        lr = self.optimizer.learning_rate
        return float(lr.numpy() if hasattr(lr, "numpy") else lr)

    # -- the training step -------------------------------------------------------------------------

    def training_step(
        self, features: Any, labels: Any, nb_instances_in_global_batch: Any = None
    ) -> tuple[Any, Any]:
        """One optimizer step on the step's batch: returns (mean loss, gradient norm) tensors."""
        # A full step compiles without the guard for replicas or micro-batches left with no rows;
        # the (at most one per epoch) short step uses a second function that has it.
        rows = tf.nest.flatten(features)[0].shape[0]
        partial = rows is None or rows < self._step_batch()
        fn = self._train_fns.get(partial)
        if fn is None:
            fn = self._train_fns[partial] = make_train_function(self, partial)
        return fn(features, labels)

    def apply_gradients(self, features: Any, labels: Any, nb_instances_in_global_batch: Any = None) -> Any:
        """v4's name for one optimizer step (accumulate, clip, apply); returns the mean loss."""
        return self.training_step(features, labels, nb_instances_in_global_batch)[0]

    # -- train -----------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint: str | bool | None = None) -> TrainOutput:
        """Train; `resume_from_checkpoint=True` continues from the newest complete checkpoint in
        `output_dir`, a path from that checkpoint. As `Trainer.train`: `output_dir` is locked for
        the call, and a preemption signal saves a checkpoint at the end of the step and exits 0."""
        return guarded_train(self, lambda: self._train(resume_from_checkpoint))

    def _train(self, resume_from_checkpoint: str | bool | None) -> TrainOutput:
        args = self.args
        self._build_model(self.train_dataset)
        self._check_placement()
        length = known_length(self.train_dataset, "train_dataset")
        step_batch = self._step_batch()
        steps_per_epoch = (
            length // step_batch if args.dataloader_drop_last else math.ceil(length / step_batch)
        )
        if steps_per_epoch < 1:
            raise ValueError(
                f"train_dataset has {length} samples, fewer than one step's {step_batch} with dataloader_drop_last"
            )
        max_steps = (
            args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * steps_per_epoch)
        )
        epochs = math.ceil(max_steps / steps_per_epoch)
        if self._train_fns:  # a second train(): a fresh optimizer and schedule, as the PyTorch Trainer
            self.optimizer, self.lr_scheduler = self._given_optimizers
            self._train_fns = {}
        self.create_optimizer_and_scheduler(max_steps)
        self.state = TrainerState()
        self._loss_window, self._loss_logged_total = [], 0.0
        epoch, skip = 0, 0
        self.global_step, self.epoch_logging = 0, 0.0
        checkpoint = self._resume_path(resume_from_checkpoint)
        if checkpoint is not None:  # counters, history and best model from the checkpoint
            epoch, skip = checkpointing.resume(self, checkpoint)
        # this run's length and intervals (a resumed run may be given more steps)
        self.state.train_batch_size = args.train_batch_size
        self.state.compute_steps(args, max_steps)
        self.state.max_steps, self.state.num_train_epochs = max_steps, epochs
        self.state.is_world_process_zero = args.process_index == 0
        self.state.is_local_process_zero = args.local_process_index == 0
        start_step = self.global_step
        self.callback_handler.model = self.model
        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        if args.eval_on_start and self.eval_dataset is not None:
            self.evaluate()
        start = time.time()
        samples, stopped = 0, False
        while epoch < epochs and not self.control.should_training_stop:
            self.control = self.callback_handler.on_epoch_begin(args, self.state, self.control)
            for batch_index, element in enumerate(self.get_train_tfdataset(epoch, skip), start=skip):
                self.control = self.callback_handler.on_step_begin(args, self.state, self.control)
                features, labels = split_element(element, args.label_names)
                loss, norm = self.training_step(features, labels)
                self._loss_window.append(loss)
                self._last_norm = norm
                self.global_step += 1
                samples += int(tf.nest.flatten(features)[0].shape[0])  # host metadata: no sync
                self.epoch_logging = epoch + (batch_index + 1) / steps_per_epoch
                self._sync_state()
                self.control = self.callback_handler.on_step_end(args, self.state, self.control)
                if preempted(self):  # save at this step's end, then stop (the epoch has not ended)
                    self.control.should_save = self.control.should_training_stop = stopped = True
                self._maybe_log_save_evaluate(epoch, batch_index + 1)
                if self.control.should_training_stop or self.control.should_epoch_stop:
                    break
            if stopped:
                break
            epoch, skip = epoch + 1, 0
            self.control = self.callback_handler.on_epoch_end(args, self.state, self.control)
            self._maybe_log_save_evaluate(epoch, 0)
        runtime = time.time() - start
        if args.load_best_model_at_end and self.state.best_model_checkpoint and not stopped:
            checkpointing.restore(self.state.best_model_checkpoint, self.model)
        steps = self.global_step - start_step
        unlogged = sum(float(x) for x in self._loss_window)
        train_loss = (self._loss_logged_total + unlogged) / max(self.global_step, 1)
        metrics = speed_metrics("train", start, num_samples=samples, num_steps=steps)
        metrics["train_runtime"] = round(runtime, 4)
        metrics["train_loss"] = train_loss
        metrics["epoch"] = float(self.state.epoch or 0.0)
        self.state.log_history.append({**metrics, "step": self.global_step})
        self.control = self.callback_handler.on_log(args, self.state, self.control, logs=metrics)
        self.control = self.callback_handler.on_train_end(args, self.state, self.control)
        return TrainOutput(self.global_step, train_loss, metrics)

    def _sync_state(self) -> None:
        self.state.global_step = self.global_step
        self.state.epoch = self.epoch_logging

    def _maybe_log_save_evaluate(self, epoch: int, batch_in_epoch: int) -> None:
        if self.control.should_log and self._loss_window:
            losses = np.array([float(x) for x in self._loss_window])
            if self.args.logging_nan_inf_filter:
                kept = losses[np.isfinite(losses)]
                losses = kept if kept.size else losses
            self._loss_logged_total += float(losses.mean()) * len(self._loss_window)
            logs = {"loss": round(float(losses.mean()), 4)}
            # Without clipping, several replicas never hold the summed gradient: no norm to log.
            if self._last_norm is not None and (self.args.n_replicas == 1 or self.args.max_grad_norm > 0):
                logs["grad_norm"] = float(self._last_norm)
            logs["learning_rate"] = self._learning_rate()
            self._loss_window = []
            self.log(logs)
        metrics = None
        if self.control.should_evaluate and self.eval_dataset is not None:
            metrics = self.evaluate()
        if self.control.should_save:
            self._save_checkpoint(epoch, batch_in_epoch, metrics)
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def log(self, logs: dict[str, float]) -> None:
        """Record a row in `state.log_history` (with epoch and step) and hand it to the reporters."""
        logs = {**logs, "epoch": self.epoch_logging}
        self.state.log_history.append({**logs, "step": self.global_step})
        self.control = self.callback_handler.on_log(self.args, self.state, self.control, logs=logs)

    # -- checkpoints -----------------------------------------------------------------------------

    @property
    def _output_dir(self) -> str:
        return str(self.args.output_dir)  # validation has set the default ("trainer_output")

    def _resume_path(self, resume: str | bool | None) -> str | None:
        if resume is None or resume is False:
            return None
        if resume is True:
            found = get_last_checkpoint(self._output_dir)
            if found is None:
                raise ValueError(f"resume_from_checkpoint=True: no complete checkpoint in {self._output_dir}")
            return found
        return os.fspath(resume)

    def _save_checkpoint(self, epoch: int, batch_in_epoch: int, metrics: dict[str, float] | None) -> None:
        args = self.args
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.global_step}"
        path = os.path.join(self._output_dir, name)
        if metrics is not None and args.metric_for_best_model:
            key = args.metric_for_best_model
            key = key if key.startswith("eval_") else f"eval_{key}"
            if key not in metrics:
                raise KeyError(
                    f"metric_for_best_model={args.metric_for_best_model!r}: evaluation returned {sorted(metrics)}"
                )
            if metric_improves(metrics[key], self.state.best_metric, bool(args.greater_is_better)):
                self.state.best_metric, self.state.best_global_step = float(metrics[key]), self.global_step
                self.state.best_model_checkpoint = path
        data = {
            "epoch": epoch,
            "batch_in_epoch": batch_in_epoch,
            "step_batch": self._step_batch(),
            "has_optimizer": not args.save_only_model,
            "loss_window": [float(x) for x in self._loss_window],
            "loss_logged_total": self._loss_logged_total,
        }
        optimizer = None if args.save_only_model else self.optimizer
        checkpointing.save(
            self._output_dir, name, self.model, optimizer, self.state, args, data, args.should_save
        )
        if args.should_save:
            rotate_checkpoints(self._output_dir, args.save_total_limit, self.state.best_model_checkpoint)

    def save_model(self, output_dir: str | None = None) -> None:
        """Save the model's weights (`model.weights.h5`) and the arguments into `output_dir`."""
        output_dir = output_dir or self._output_dir
        if not self.args.should_save:
            return
        os.makedirs(output_dir, exist_ok=True)
        save_pretrained = getattr(self.model, "save_pretrained", None)
        if callable(save_pretrained):
            save_pretrained(output_dir)
        else:
            with warnings.catch_warnings():
                # Keras' h5 writer calls np.array(variable); NumPy 2 warns about the copy keyword
                # that TF's __array__ lacks. The values written are right; the warning is noise.
                warnings.filterwarnings("ignore", "__array__ implementation", DeprecationWarning)
                self.model.save_weights(os.path.join(output_dir, "model.weights.h5"))
        self.args.to_json_file(os.path.join(output_dir, checkpointing.TRAINING_ARGS_NAME))

    # -- evaluate / predict ------------------------------------------------------------------------

    def prediction_step(
        self, features: Any, labels: Any, nb_instances_in_global_batch: Any = None
    ) -> tuple[Any, Any, Any]:
        """One evaluation batch: (loss sum, items, logits) over all replicas."""
        want = not self.args.prediction_loss_only
        fn = self._eval_fns.get(want)
        if fn is None:
            fn = self._eval_fns[want] = make_eval_function(self, want)
        return fn(features, labels)

    def prediction_loop(
        self,
        dataset: tf.data.Dataset,
        steps: int | None,
        num_examples: int | None,
        description: str,
        prediction_loss_only: bool | None = None,
    ) -> PredictionOutput:
        """Run `prediction_step` over `dataset` (batched) and compute the metrics."""
        if not self.model.built:
            self._build_model(dataset.unbatch())
        saved = self.args.prediction_loss_only
        if prediction_loss_only is not None:
            self.args.prediction_loss_only = prediction_loss_only
        try:
            total, items = 0.0, 0.0
            preds: list[Any] = []
            label_ids: list[Any] = []
            for element in dataset:
                features, labels = split_element(element, self.args.label_names)
                loss_sum, count, logits = self.prediction_step(features, labels)
                total += float(loss_sum)
                items += float(count)
                if not self.args.prediction_loss_only:
                    preds.append(tf.nest.map_structure(lambda t: t.numpy(), logits))
                    if labels is not None:
                        label_ids.append(tf.nest.map_structure(lambda t: t.numpy(), labels))
                self.control = self.callback_handler.on_prediction_step(self.args, self.state, self.control)
        finally:
            self.args.prediction_loss_only = saved
        predictions = _concat(preds)
        label_array = _concat(label_ids)
        metrics: dict[str, Any] = {}
        if self.compute_metrics is not None and predictions is not None and label_array is not None:
            metrics = dict(
                self.compute_metrics(EvalPrediction(predictions=predictions, label_ids=label_array))
            )
        if items > 0:
            metrics["loss"] = total / items
        metrics = denumpify_detensorize(metrics)
        prefix = "eval" if description == "Evaluation" else "test"
        metrics = {k if k.startswith(f"{prefix}_") else f"{prefix}_{k}": v for k, v in metrics.items()}
        return PredictionOutput(predictions=predictions, label_ids=label_array, metrics=metrics)

    def evaluate(self, eval_dataset: tf.data.Dataset | None = None) -> dict[str, float]:
        """Loss and `compute_metrics` on the evaluation set, prefixed `eval_`; logged."""
        dataset = self.get_eval_tfdataset(eval_dataset)
        start = time.time()
        source = eval_dataset if eval_dataset is not None else self.eval_dataset
        assert source is not None  # get_eval_tfdataset has checked
        n = int(source.cardinality().numpy())
        output = self.prediction_loop(dataset, None, n, "Evaluation")
        metrics = dict(output.metrics or {})
        metrics.update(speed_metrics("eval", start, num_samples=n if n >= 0 else None))
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics=metrics)
        return metrics

    def predict(self, test_dataset: tf.data.Dataset) -> PredictionOutput:
        """Predictions, label ids and `test_`-prefixed metrics for `test_dataset`."""
        start = time.time()
        n = int(test_dataset.cardinality().numpy())
        output = self.prediction_loop(self.get_test_tfdataset(test_dataset), None, n, "Prediction")
        metrics = dict(output.metrics or {})
        metrics.update(speed_metrics("test", start, num_samples=n if n >= 0 else None))
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, metrics=metrics)
        return PredictionOutput(output.predictions, output.label_ids, metrics)

    # -- metrics files (the PyTorch Trainer's) -------------------------------------------------------

    def log_metrics(self, split: str, metrics: dict[str, Any]) -> None:
        log_metrics(split, metrics, is_world_process_zero=self.args.process_index == 0)

    def save_metrics(self, split: str, metrics: dict[str, Any], combined: bool = True) -> None:
        save_metrics(
            self._output_dir, split, metrics, combined, is_world_process_zero=self.args.process_index == 0
        )

    def save_state(self) -> None:
        if self.args.should_save:
            os.makedirs(self._output_dir, exist_ok=True)
            self.state.save_to_json(os.path.join(self._output_dir, checkpointing.TRAINER_STATE_NAME))


def _concat(parts: list[Any]) -> Any:
    if not parts:
        return None
    return tf.nest.map_structure(lambda *xs: np.concatenate(xs, axis=0), *parts)
