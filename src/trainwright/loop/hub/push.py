"""Pushing to the Hugging Face Hub, as transformers' Trainer does (`huggingface_hub` client).

* `init_repo`: `create_repo(hub_model_id or output_dir's name, exist_ok=True)` on the main process;
  the Trainer calls it at construction when `push_to_hub=True`.
* `push_from_checkpoint`: after each checkpoint save (`hub_strategy` other than "end") the model files
  are copied from the checkpoint into `output_dir` and `output_dir` is uploaded in the background
  (`upload_folder(run_as_future=True)`); "checkpoint" also uploads the checkpoint as
  `last-checkpoint/`, "all_checkpoints" as `checkpoint-N/`. A save while the previous push is still
  running pushes nothing, unless `hub_always_push`.
* `push_to_hub`: save the model, write the model card, wait for the background push, upload
  `output_dir` (checkpoint folders and `_*` left out).

Every Hub call that fails is re-raised as `HubError` naming the setting that asked for it; a
background push that fails is logged as an error (upstream drops it silently).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trainwright.checkpoint as ckpt
from trainwright.args.training_args import TrainingArguments
from trainwright.core.state import TrainerState
from trainwright.core.version import __version__

logger = logging.getLogger(__name__)

# Never uploaded with output_dir: private files, checkpoints (pushed on their own by the strategies that
# want them) and trainwright's hidden folders of checkpoints being written or deleted.
IGNORE_PATTERNS = ["_*", f"{ckpt.PREFIX_CHECKPOINT_DIR}-*", f".{ckpt.PREFIX_CHECKPOINT_DIR}-*"]
# Files of a checkpoint that make up the model, copied to output_dir before a checkpoint push.
MODEL_FILES = [
    "config.json",
    "generation_config.json",
    ckpt.WEIGHTS_NAME,
    ckpt.PT_WEIGHTS_NAME,
    "adapter_config.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
]


class HubError(OSError):
    """A Hub call failed; the message names the setting that made it and what to do."""


class PushInProgress:
    """The background uploads of one checkpoint push (upstream's `PushInProgress`)."""

    def __init__(self, jobs: list[futures.Future] | None = None) -> None:
        self.jobs = [] if jobs is None else jobs

    def is_done(self) -> bool:
        return all(job.done() for job in self.jobs)

    def wait_until_done(self) -> None:
        futures.wait(self.jobs)

    def cancel(self) -> None:
        """Cancel jobs not started yet and forget the finished ones."""
        self.jobs = [job for job in self.jobs if not (job.cancel() or job.done())]


@dataclass(frozen=True)
class HubPush:
    """What one push reads, built by the Trainer at each call from its values (this module never
    holds the Trainer): the arguments and state of now, the push in flight, and two hooks bound at
    the call, `repo_id` (the repository's id, made by the Trainer's `init_hf_repo` when missing)
    and `begin` (the callbacks' `on_push_begin`)."""

    args: TrainingArguments
    state: TrainerState
    is_main: bool
    model: Any
    processing_class: Any
    in_flight: PushInProgress | None
    repo_id: Callable[[], str | None]
    begin: Callable[[], object]


_APIS: dict[str, Any] = {}


def hf_api() -> Any:
    """One `HfApi` per Hub endpoint: its single worker thread runs background uploads one at a time."""
    try:
        from huggingface_hub import HfApi, constants
    except ImportError as e:
        raise ImportError("Pushing to the Hub needs huggingface_hub: pip install huggingface_hub") from e
    if constants.ENDPOINT not in _APIS:
        _APIS[constants.ENDPOINT] = HfApi(library_name="trainwright", library_version=__version__)
    return _APIS[constants.ENDPOINT]


def _setting(args: TrainingArguments) -> str:
    what = "push_to_hub=True" if args.push_to_hub else "Trainer.push_to_hub()"
    return f"{what} / hub_model_id={args.hub_model_id!r}"


def explain(error: BaseException, setting: str) -> Exception | None:
    """A `HubError` (a `ValueError` for a bad repository id) for a failure of the Hub client, None
    for any other error."""
    try:
        from huggingface_hub import errors
        from huggingface_hub.utils import httpx
    except ImportError:
        return None
    if isinstance(error, errors.HFValidationError):
        return ValueError(f"{setting}: not a valid Hub repository id (set hub_model_id): {error}")
    if isinstance(error, errors.OfflineModeIsEnabled):
        why = f"could not reach the Hugging Face Hub: offline mode is on (HF_HUB_OFFLINE) ({error})"
    elif isinstance(error, errors.LocalTokenNotFoundError):
        why = f"no Hugging Face token: run `hf auth login` or set hub_token ({error})"
    elif isinstance(error, errors.HfHubHTTPError):
        status = getattr(error.response, "status_code", None)
        hint = " (check hub_token and its write permission)" if status in (401, 403) else ""
        why = f"the Hugging Face Hub refused the request{hint}: {error}"
    elif isinstance(error, (httpx.HTTPError, ConnectionError, TimeoutError)):
        why = f"could not reach the Hugging Face Hub ({type(error).__name__}: {error})"
    else:
        return None
    return HubError(f"{setting}: {why}")


@contextlib.contextmanager
def _hub_call(args: TrainingArguments) -> Iterator[None]:
    try:
        yield
    except Exception as e:
        explained = explain(e, _setting(args))
        if explained is None:
            raise
        raise explained from e


def _watch(args: TrainingArguments, job: futures.Future, what: str) -> futures.Future:
    setting = _setting(args)

    def report(done: futures.Future) -> None:
        error = None if done.cancelled() else done.exception()
        if error is not None:
            logger.error("%s: %s failed: %s", setting, what, explain(error, setting) or repr(error))

    job.add_done_callback(report)
    return job


def init_repo(
    args: TrainingArguments, is_main: bool, token: str | None = None, private: bool | None = None
) -> str | None:
    """Create the repository if needed; its id (None on other processes than the main one)."""
    if not is_main:
        return None
    assert args.output_dir is not None  # TrainingArguments.__post_init__ fills it in
    name = args.hub_model_id if args.hub_model_id is not None else Path(args.output_dir).absolute().name
    token = token if token is not None else args.hub_token
    private = private if private is not None else args.hub_private_repo
    with _hub_call(args):
        url = hf_api().create_repo(name, token=token, private=private, exist_ok=True)
    return url.repo_id


def _copy_model_files(checkpoint: str, output_dir: str) -> None:
    names = list(MODEL_FILES)
    for index_name in (ckpt.WEIGHTS_INDEX_NAME, ckpt.PT_WEIGHTS_INDEX_NAME):
        index = os.path.join(checkpoint, index_name)
        if os.path.isfile(index):
            with open(index, encoding="utf-8") as f:
                names += [index_name, *sorted(set(json.load(f)["weight_map"].values()))]
    for name in names:
        if os.path.isfile(os.path.join(checkpoint, name)):
            shutil.copy(os.path.join(checkpoint, name), os.path.join(output_dir, name))


def push_from_checkpoint(push: HubPush, checkpoint: str) -> PushInProgress | None:
    """Push `output_dir` (and, per `hub_strategy`, the checkpoint) in the background after a save;
    the uploads now in flight when they are new ones (None: none started, or added to those in flight)."""
    args, state, in_flight = push.args, push.state, push.in_flight
    if not push.is_main or args.hub_strategy == "end":
        return None
    if not args.hub_always_push and in_flight is not None and not in_flight.is_done():
        logger.info("Previous Hub push still running: %s is not pushed.", checkpoint)
        return None
    repo_id = push.repo_id()  # made now when push_to_hub was turned on after the Trainer was built
    push.begin()
    output_dir = args.output_dir
    assert output_dir is not None  # TrainingArguments.__post_init__ fills it in
    _copy_model_files(checkpoint, output_dir)
    # The processing class may write any number of files: cheaper to save it again than to find them.
    processing = push.processing_class
    if processing is not None and hasattr(processing, "save_pretrained"):
        processing.save_pretrained(output_dir)
    ckpt.write_training_args(output_dir, args.to_dict())
    if args.save_strategy == "steps":
        message = f"Training in progress, step {state.global_step}"
    else:
        message = f"Training in progress, epoch {int(state.epoch or 0)}"
    common = {"repo_id": repo_id, "token": args.hub_token, "revision": args.hub_revision}
    api = hf_api()
    with _hub_call(args):
        jobs = [
            api.upload_folder(
                folder_path=output_dir,
                commit_message=message,
                run_as_future=True,
                ignore_patterns=IGNORE_PATTERNS,
                **common,
            )
        ]
        if args.hub_strategy in ("checkpoint", "all_checkpoints"):
            path_in_repo = "last-checkpoint" if args.hub_strategy == "checkpoint" else Path(checkpoint).name
            jobs.append(
                api.upload_folder(
                    folder_path=checkpoint,
                    path_in_repo=path_in_repo,
                    commit_message=f"{message}, checkpoint",
                    run_as_future=True,
                    **common,
                )
            )
    for job in jobs:
        _watch(args, job, message)
    if in_flight is None or in_flight.is_done():
        return PushInProgress(jobs)
    in_flight.jobs.extend(jobs)  # hub_always_push: the final push waits for these too
    return None


def finish_current_push(in_flight: PushInProgress | None) -> None:
    """Wait for the background push of the last checkpoint (end of training, before a final push)."""
    if in_flight is not None and not in_flight.is_done():
        logger.info("Waiting for the current checkpoint push to finish.")
        in_flight.wait_until_done()


def push_to_hub(
    push: HubPush,
    save_model: Callable[..., object],
    create_model_card: Callable[..., object],
    commit_message: str | None = "End of training",
    blocking: bool = True,
    token: str | None = None,
    revision: str | None = None,
    **card_kwargs: Any,
) -> Any:
    """`Trainer.push_to_hub`: save the model, write its card, upload output_dir (`save_model` and
    `create_model_card` are the Trainer's hooks, handed in at the call; the repository is made with
    `token`, as `push.repo_id` was bound). Returns the `CommitInfo` (blocking) or a `Future` of it;
    None on processes other than the main one."""
    args = push.args
    push.begin()
    model_name = card_kwargs.pop("model_name", None)
    if model_name is None and args.should_save:
        assert args.output_dir is not None  # TrainingArguments.__post_init__ fills it in
        model_name = (
            Path(args.output_dir).name if args.hub_model_id is None else args.hub_model_id.split("/")[-1]
        )
    token = token if token is not None else args.hub_token
    repo_id = push.repo_id()
    save_model(_internal_call=True)  # every process: a sharded model is gathered
    if not push.is_main:
        return None
    model_tags = getattr(push.model, "model_tags", None)
    if model_tags is not None:  # tags the model carries (e.g. from TRL) join the card's
        tags = card_kwargs.get("tags") or []
        tags = [tags] if isinstance(tags, str) else list(tags)
        card_kwargs["tags"] = tags + [t for t in model_tags if t not in tags]
    create_model_card(model_name=model_name, **card_kwargs)
    finish_current_push(push.in_flight)
    with _hub_call(args):
        result = hf_api().upload_folder(
            repo_id=repo_id,
            folder_path=args.output_dir,
            commit_message=commit_message,
            token=token,
            run_as_future=not blocking,
            ignore_patterns=IGNORE_PATTERNS,
            revision=revision if revision is not None else args.hub_revision,
        )
    return _watch(args, result, commit_message or "push") if not blocking else result


@contextlib.contextmanager
def quiet_progress_bars(enabled: bool) -> Iterator[None]:
    """huggingface_hub's upload bars off while training pushes in the background (upstream does too)."""
    if not enabled:
        yield
        return
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()
