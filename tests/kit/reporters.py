"""Shared helpers for the reporter tests: real TrainingArguments/TrainerState, a tiny model with a
config, a driver that fires events through the real CallbackHandler as the Trainer does, and W&B
and Comet set offline with what they wrote read back."""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import struct
import zipfile
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from trainwright.args.training_args import TrainingArguments
from trainwright.core.events import CallbackHandler
from trainwright.core.state import TrainerControl, TrainerState


@dataclasses.dataclass
class TinyConfig:
    hidden_size: int = 4
    model_type: str = "tiny"


class TinyModel(torch.nn.Module):
    """A linear layer with a `config`, enough for every reporter's model handling."""

    def __init__(self) -> None:
        super().__init__()
        self.config = TinyConfig()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def make_args(output_dir: Any, run_name: str | None = "run-1", **kwargs: Any) -> TrainingArguments:
    return TrainingArguments(output_dir=str(output_dir), run_name=run_name, **kwargs)


def make_state(**kwargs: Any) -> TrainerState:
    return TrainerState(**kwargs)


def write_checkpoint(output_dir: Any, step: int) -> str:
    """A small checkpoint folder as the trainer writes it (contents do not matter to reporters)."""
    path = os.path.join(str(output_dir), f"checkpoint-{step}")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "trainer_state.json"), "w") as f:
        json.dump({"global_step": step}, f)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(b"\0" * 16)
    return path


def handler_for(callbacks: Sequence[Any], model: Any = None) -> CallbackHandler:
    # The handler warns when no DefaultFlowCallback is present; these tests drive flags themselves.
    logger = logging.getLogger("trainwright.core.events")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        return CallbackHandler(list(callbacks), model, None, None, None)
    finally:
        logger.setLevel(level)


def drive(
    callbacks: Sequence[Any] | Any,
    args: TrainingArguments,
    logs: Iterable[tuple[int, dict[str, Any]]],
    *,
    state: TrainerState | None = None,
    model: Any = None,
    save_steps: Iterable[int] = (),
    train_end: bool = True,
) -> TrainerState:
    """Fire init_end, train_begin, then per (step, logs): log (and save at `save_steps`, after
    writing a checkpoint folder), then train_end; as the Trainer orders them."""
    handler = handler_for(callbacks if isinstance(callbacks, (list, tuple)) else [callbacks], model)
    state = state or make_state()
    control = TrainerControl()
    saves = set(save_steps)
    handler.on_init_end(args, state, control)
    handler.on_train_begin(args, state, control)
    for step, row in logs:
        state.global_step = step
        state.epoch = step / 10
        state.log_history.append({**row, "step": step})
        handler.on_log(args, state, control, logs=dict(row))
        if step in saves:
            write_checkpoint(args.output_dir, step)
            handler.on_save(args, state, control)
    if train_end:
        handler.on_train_end(args, state, control)
    return state


def logged(caplog: Any, text: str) -> list[str]:
    """The messages captured by `caplog` that contain `text`."""
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


# ------------------------------------------------------------- W&B offline: its .wandb log read back
_BLOCK = 32 * 1024  # the .wandb file is a LevelDB-style log: 7-byte file header, 32 KiB blocks
_FULL, _LAST = 1, 4


def wandb_offline(monkeypatch: Any, folder: Any) -> None:
    """W&B offline and quiet, writing under `folder`; no project, model logging, watch or run id
    from the environment."""
    for name in ("WANDB_PROJECT", "WANDB_LOG_MODEL", "WANDB_WATCH", "WANDB_DISABLED", "WANDB_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(folder))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")


def finish_and_flush() -> None:
    """finish() can return before wandb-core has written the run's log; teardown() waits for it."""
    import wandb

    if wandb.run is not None:
        wandb.finish()
    wandb.teardown()


def offline_run_files(wandb_dir: Any) -> list[str]:
    return sorted(glob.glob(str(wandb_dir / "wandb" / "offline-run-*" / "run-*.wandb")))


def read_records(path: str) -> list:
    """Parse a .wandb file into its protobuf Records (checking each chunk's CRC)."""
    from wandb.proto import wandb_internal_pb2

    raw = open(path, "rb").read()
    ident, _magic, _version = struct.unpack("<4sHB", raw[:7])
    assert ident == b":W&B"
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(raw):
        left = _BLOCK - pos % _BLOCK
        if left < 7:
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        data = raw[pos + 7 : pos + 7 + length]
        assert zlib.crc32(data, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc
        pos += 7 + length
        pending += data
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def by_kind(records: list, kind: str) -> list:
    return [getattr(r, kind) for r in records if r.WhichOneof("record_type") == kind]


def items(update: Any) -> dict:
    return {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in update}


def merged(records: list, kind: str) -> dict:
    """The items of every `kind` record ("config", "summary"), later updates winning."""
    out: dict = {}
    for record in by_kind(records, kind):
        out.update(items(record.update))
    return out


# ------------------------------------------------- Comet offline: its archive's messages read back
def comet_offline(monkeypatch: Any, folder: Any) -> None:
    """Comet offline, its archive in `folder`/comet; call before comet_ml is first imported."""
    for name in ("COMET_API_KEY", "COMET_START_ONLINE", "COMET_PROJECT_NAME", "COMET_LOG_ASSETS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COMET_MODE", "offline")
    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(folder / "comet"))
    # keep the test fast and quiet: no emissions tracker, environment or git scans
    for name in ("CO2", "ENV_DETAILS", "GIT_METADATA", "GIT_PATCH", "CODE", "CLI_ARGUMENTS"):
        monkeypatch.setenv(f"COMET_AUTO_LOG_{name}", "false")
    monkeypatch.setenv("COMET_DISPLAY_SUMMARY_LEVEL", "0")
    monkeypatch.setenv("COMET_ERROR_TRACKING_ENABLE", "false")  # no error reports over the network
    # Importing comet_ml otherwise patches other libraries process-wide (it slows MLflow's runs
    # down for every later test); the setting is read once, at import.
    monkeypatch.setenv("COMET_DISABLE_AUTO_LOGGING", "1")


def end_and_read(folder: Any, with_experiment: bool = False):
    """End the running Comet experiment, which writes its offline archive, and read its messages
    (and experiment.json)."""
    import comet_ml

    comet_ml.get_running_experiment().end()
    (archive,) = glob.glob(str(folder / "comet" / "*.zip"))
    with zipfile.ZipFile(archive) as z:
        messages = [json.loads(line) for line in z.read("messages.json").decode().splitlines()]
        if with_experiment:
            return messages, json.loads(z.read("experiment.json"))
    return messages
