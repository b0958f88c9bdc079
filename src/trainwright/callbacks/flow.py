"""DefaultFlowCallback: decides when the loop logs, evaluates, saves and stops."""

from __future__ import annotations

from typing import Any

from trainwright.core.events import TrainerCallback
from trainwright.core.state import TrainerControl, TrainerState


def strategy_is(strategy: Any, name: str) -> bool:
    """True if a strategy (a plain string or an enum member of one) is `name`."""
    if isinstance(strategy, str):  # plain strings and str-enums compare as strings: the fast path
        return strategy == name
    return getattr(strategy, "value", strategy) == name


class DefaultFlowCallback(TrainerCallback):
    """Sets `should_log` / `should_evaluate` / `should_save` / `should_training_stop` from the
    logging, eval and save strategies, as transformers 5.23 does.

    Intervals are read from `state.logging_steps` / `state.eval_steps` / `state.save_steps`
    (already absolute); `args.eval_delay` counts steps for the steps strategy and epochs for the
    epoch strategy. At the last step (`global_step >= max_steps`) training stops, a steps-strategy
    evaluation runs if that step was not an evaluation step anyway, and a steps-strategy save runs.

    Difference from transformers: with `logging_strategy="steps"` the last step is also a logging
    step, so the final partial logging window gets its `loss` row instead of being dropped (it
    used to show up only inside `train_loss`).
    """

    def on_step_end(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        step = state.global_step
        # the interval test first, inline (an unset interval is None or 0): on most steps no
        # strategy needs reading, and every step pays this
        if step == 1 and args.logging_first_step:
            control.should_log = True
        if (n := state.logging_steps) and step % n == 0 and strategy_is(args.logging_strategy, "steps"):
            control.should_log = True
        eval_step = bool((n := state.eval_steps) and step % n == 0)
        if eval_step and self._evaluates_at(args, step):
            control.should_evaluate = True
        if (n := state.save_steps) and step % n == 0 and strategy_is(args.save_strategy, "steps"):
            control.should_save = True

        if step >= state.max_steps:
            control.should_training_stop = True
            if not eval_step and self._evaluates_at(args, step):
                control.should_evaluate = True
            if strategy_is(args.save_strategy, "steps"):
                control.should_save = True
        return control

    @staticmethod
    def _evaluates_at(args: Any, step: int) -> bool:
        """Whether the steps strategy evaluates at `step` once its interval says so (after `eval_delay`)."""
        return strategy_is(args.eval_strategy, "steps") and (args.eval_delay or 0) <= step

    def on_epoch_end(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        if strategy_is(args.logging_strategy, "epoch"):
            control.should_log = True
        if strategy_is(args.eval_strategy, "epoch") and (args.eval_delay or 0) <= (state.epoch or 0):
            control.should_evaluate = True
        if strategy_is(args.save_strategy, "epoch"):
            control.should_save = True
        return control
