"""Flyte: sync checkpoints through the task's checkpoint, show the log history in a Flyte Deck."""

from __future__ import annotations

import html
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from trainwright.reporters.base import Reporter, saved_checkpoint_dir

logger = logging.getLogger(__name__)


def log_history_html(rows: Sequence[Mapping[str, Any]]) -> str:
    """An HTML table of `state.log_history`: one row per entry, one column per key (first seen
    order), empty cells where an entry lacks a key."""
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(row.get(c, '')))}</td>" for c in columns) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class FlyteCallback(Reporter):
    """Inside a Flyte task: `sync_checkpoints` saves each checkpoint folder with
    `flytekit.current_context().checkpoint.save(...)` (so a retried task can resume from it), and
    `save_log_history` adds a "Log History" Deck with the log history at the end of training.
    `report_to="all"` includes it only inside a Flyte execution (`FLYTE_INTERNAL_EXECUTION_ID`).
    """

    name = "flyte"
    requires = ("flytekit",)
    pip_name = "flytekit"

    def __init__(self, save_log_history: bool = True, sync_checkpoints: bool = True) -> None:
        super().__init__()
        self.save_log_history = save_log_history
        self.sync_checkpoints = sync_checkpoints

    @classmethod
    def skip_reason(cls) -> str | None:
        if not os.environ.get("FLYTE_INTERNAL_EXECUTION_ID"):
            return "not inside a Flyte execution (FLYTE_INTERNAL_EXECUTION_ID is not set)"
        return None

    def service_address(self) -> str | None:
        return None  # a checkpoint must be synced before the task can be retried from it

    def on_save(self, args, state, control, **kwargs):
        if not self.sync_checkpoints:
            return
        from flytekit import current_context

        task_checkpoint = current_context().checkpoint
        if task_checkpoint is None:
            raise RuntimeError("this Flyte context has no checkpoint to sync to (is this a Flyte task?)")
        checkpoint = saved_checkpoint_dir(args, state)
        if checkpoint is None:
            logger.warning("Flyte: no checkpoint folder for step %d to sync", state.global_step)
            return
        task_checkpoint.save(checkpoint)

    def on_train_end(self, args, state, control, **kwargs):
        if not self.save_log_history:
            return
        from flytekit import Deck

        Deck("Log History", log_history_html(state.log_history))
