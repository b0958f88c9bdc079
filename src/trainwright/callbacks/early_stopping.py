"""EarlyStoppingCallback: stop training when the evaluation metric stops improving."""

from __future__ import annotations

import logging
import math
from typing import Any

from trainwright.callbacks.flow import strategy_is
from trainwright.core.events import TrainerCallback
from trainwright.core.state import TrainerControl, TrainerState, metric_improves

logger = logging.getLogger(__name__)


class EarlyStoppingCallback(TrainerCallback):
    """Stops training after `early_stopping_patience` evaluations in a row without improvement of
    `args.metric_for_best_model` (by more than `early_stopping_threshold`, an absolute amount).

    Needs `metric_for_best_model` and an evaluation strategy other than "no": training fails at
    `on_train_begin` with an AssertionError (as transformers does) when either is missing.

    The reference value is `state.best_metric` when the Trainer tracks one (it is updated after
    this callback has seen the evaluation, so the comparison is against the previous best);
    otherwise the callback's own `best_metric`, which it always keeps, so early stopping also works
    when the Trainer tracks no best metric. Its state (patience counter and best value) is saved in
    checkpoints through `state()`. An evaluation without the metric is skipped (warned once).
    """

    def __init__(self, early_stopping_patience: int = 1, early_stopping_threshold: float | None = 0.0):
        if isinstance(early_stopping_patience, bool) or not isinstance(early_stopping_patience, int):
            raise TypeError(
                f"early_stopping_patience must be an int >= 1, got {type(early_stopping_patience).__name__}"
            )
        if early_stopping_patience < 1:
            raise ValueError(f"early_stopping_patience must be >= 1, got {early_stopping_patience}")
        threshold = 0.0 if early_stopping_threshold is None else early_stopping_threshold
        if not isinstance(threshold, (int, float)) or isinstance(threshold, bool) or not threshold >= 0:
            raise ValueError(f"early_stopping_threshold must be a number >= 0 (or None), got {threshold!r}")
        self.early_stopping_patience = early_stopping_patience
        self.early_stopping_threshold = early_stopping_threshold
        self.early_stopping_patience_counter = 0
        self.best_metric: float | None = None
        self._warned_missing = False

    @staticmethod
    def _metric_key(args: Any) -> str:
        key = args.metric_for_best_model
        return key if key.startswith("eval_") else f"eval_{key}"

    @staticmethod
    def _greater_is_better(args: Any) -> bool:
        value = getattr(args, "greater_is_better", None)
        if value is None:
            # TrainingArguments' own default: losses go down, everything else goes up.
            return not args.metric_for_best_model.endswith("loss")
        return bool(value)

    def check_metric_value(
        self, args: Any, state: TrainerState, control: TrainerControl, metric_value: float
    ) -> None:
        """Reset the patience counter on a large enough improvement, else count one more miss."""
        greater = self._greater_is_better(args)
        threshold = self.early_stopping_threshold or 0.0
        reference = state.best_metric if state.best_metric is not None else self.best_metric

        if metric_improves(metric_value, reference, greater, threshold):
            self.early_stopping_patience_counter = 0
        else:
            self.early_stopping_patience_counter += 1
        if math.isfinite(metric_value) and metric_improves(metric_value, self.best_metric, greater):
            self.best_metric = float(metric_value)

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if not getattr(args, "load_best_model_at_end", False):
            logger.warning(
                "EarlyStoppingCallback is used without load_best_model_at_end=True: when training stops, "
                "the model is the last one, not the best one."
            )
        if args.metric_for_best_model is None:
            raise AssertionError(
                "EarlyStoppingCallback requires TrainingArguments.metric_for_best_model to be set "
                "(e.g. metric_for_best_model='loss')"
            )
        if strategy_is(args.eval_strategy, "no"):
            raise AssertionError(
                "EarlyStoppingCallback requires an evaluation strategy: set TrainingArguments.eval_strategy "
                "to 'steps' or 'epoch' (it is 'no')"
            )

    def on_evaluate(
        self,
        args: Any,
        state: TrainerState,
        control: TrainerControl,
        metrics: dict | None = None,
        **kwargs: Any,
    ) -> None:
        key = self._metric_key(args)
        value = (metrics or {}).get(key)
        if value is None:
            if not self._warned_missing:
                logger.warning(
                    "EarlyStoppingCallback: metric %r is not in the evaluation metrics (%s); early stopping "
                    "does nothing for evaluations without it.",
                    key,
                    ", ".join(sorted(metrics or {})),
                )
                self._warned_missing = True
            return
        self.check_metric_value(args, state, control, float(value))
        if self.early_stopping_patience_counter >= self.early_stopping_patience:
            control.should_training_stop = True

    def state(self) -> dict:
        """Constructor args and counters, for `TrainerState.stateful_callbacks`."""
        return {
            "args": {
                "early_stopping_patience": self.early_stopping_patience,
                "early_stopping_threshold": self.early_stopping_threshold,
            },
            "attributes": {
                "early_stopping_patience_counter": self.early_stopping_patience_counter,
                "best_metric": self.best_metric,
            },
        }

    @classmethod
    def from_state(cls, state: dict) -> EarlyStoppingCallback:
        """Rebuild a callback from what `state()` returned."""
        callback = cls(**state.get("args", {}))
        for name, value in state.get("attributes", {}).items():
            setattr(callback, name, value)
        return callback
