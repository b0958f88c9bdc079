"""Resuming: which checkpoint folder to resume, and the rules that decide whether what it holds fits
this run (the optimizer and schedule it was written with, the batch geometry that gives the saved
position its meaning, the data order). The checkpoint parts (`checkpoint_parts.py`) run these as
their own checks, before anything is loaded; each names the file and the argument in its error.
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from typing import Any

import torch

import trainwright.checkpoint as ckpt
from trainwright.args.training_args import TrainingArguments
from trainwright.checkpoint import adapters
from trainwright.checkpoint.files import BASE_MODEL_NAME
from trainwright.checkpoint.layout import PARTS
from trainwright.core.state import LoopCursor
from trainwright.data.kinds import fingerprint
from trainwright.distributed import fsdp
from trainwright.distributed.deepspeed import ENGINE_DIR

logger = logging.getLogger(__name__)

# Arguments that change what a saved position means; a resume with other values is refused.
POSITION_ARGS = ("per_device_train_batch_size", "gradient_accumulation_steps")


# ---------------------------------------------------------------------- choosing what to resume
def resolve_resume_path(args: TrainingArguments, resume: str | bool | None) -> str | None:
    """The checkpoint folder to resume from, checked before any work is done."""
    if resume is None:
        resume = args.resume_from_checkpoint
    if resume is None or resume is False:
        return None
    if resume is True:
        output_dir = args.output_dir
        assert output_dir is not None  # TrainingArguments.__post_init__ fills it in
        path = ckpt.get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
        if path is None:
            raise ValueError(f"No valid checkpoint found in output directory ({output_dir}).")
    else:
        path = str(resume)
        if not os.path.isdir(path):
            raise ValueError(f"Can't find a valid checkpoint at {path}: no such folder.")
    with_optimizer = os.path.exists(os.path.join(path, ckpt.OPTIMIZER_NAME)) and not args.save_only_model
    needed = [n for n, row in PARTS.items() if row.required and (with_optimizer or not row.optimizer_state)]
    if with_optimizer or _engine_optimizer_state(path):
        pass  # optimizer.pt, or FSDP's DCP folder or DeepSpeed's engine checkpoint holds the optimizer state
    elif not _weights_only_resume(args, path):
        raise ValueError(
            f"Can't resume exactly from {path}: it has no {ckpt.OPTIMIZER_NAME}, so the optimizer would start "
            "afresh (and its moments, step counts and learning-rate schedule with it). Resume from a complete "
            "checkpoint, or pass save_only_model=True to resume the weights with a fresh optimizer (a "
            f"{ckpt.SCHEDULER_NAME} that is present is still restored)."
        )
    problems = ckpt.check_checkpoint_files(path, need=needed)
    if "optimizer" not in needed:  # a weights-only resume does not read it, whatever state it is in
        problems = [p for p in problems if not p.startswith(ckpt.OPTIMIZER_NAME)]
    if problems:
        raise ValueError(f"Can't resume from {path}: " + "; ".join(problems))
    return path


def check_base_model(model: Any, saved: dict[str, Any] | None, folder: str) -> None:
    """Refuse to resume a PEFT model's adapters onto another base model than they were trained on:
    they change that model's weights, and trained on from another's, they train something else.

    The weights decide where the checkpoint records them (`base_model.json`'s fingerprint, written by
    trainwright) and this process holds them whole: the same weights resume whatever folder they were
    loaded from now (a base moved or copied elsewhere, the same model in another dtype); other ones
    (another model, a fine-tuned variant, the folder's model replaced) are refused, naming both bases.
    Without a fingerprint (a checkpoint of transformers or of an earlier trainwright) only the names
    can be compared: an adapter_config.json naming another base than this run's is refused, with the
    way to say that the base only moved."""
    now_name = adapters.base_model_name(model)
    names = adapters.saved_base_names(folder)
    recorded = (saved or {}).get("fingerprint")
    now = adapters.base_fingerprint(model) if recorded else None
    if recorded and now:
        difference = adapters.fingerprint_difference(recorded, now)
        saved_name = (saved or {}).get("base_model_name_or_path") or next(iter(names.values()), None)
        if difference is None:
            if saved_name != now_name:
                logger.info(
                    "Resuming %s: its base model %r is now loaded from %r.", folder, saved_name, now_name
                )
            return
        raise ValueError(
            f"Can't resume from {folder}: its adapter was trained on the base model {saved_name!r} (recorded in "
            f"{BASE_MODEL_NAME}), and this run's base model {now_name!r} holds other weights: {difference}. "
            "An adapter is a change to the weights it was trained on: on another base it trains something else. "
            "Resume with the checkpoint's base model, or train a new adapter on this one (without "
            "resume_from_checkpoint)."
        )
    other = {path: name for path, name in names.items() if now_name and not _same_base(name, now_name)}
    if other:
        path, name = next(iter(other.items()))
        manifest = os.path.exists(os.path.join(folder, ckpt.CHECKPOINT_COMPLETE_NAME))
        raise ValueError(
            f"Can't resume from {folder}: {path} says its adapter was trained on the base model {name!r}, this "
            f"run's base model is {now_name!r}, and the checkpoint records nothing of its base's weights to "
            f"compare (no {BASE_MODEL_NAME}: a checkpoint of transformers or of an earlier trainwright). Resume "
            f"with the base model {name!r}; if {now_name!r} holds the same weights (the model moved), set "
            f'"base_model_name_or_path" in {path} to {now_name!r}'
            + (
                f" and delete {ckpt.CHECKPOINT_COMPLETE_NAME}, whose checksum of it would differ"
                if manifest
                else ""
            )
            + "."
        )


def _same_base(saved: str, now: str) -> bool:
    """Whether two base model names are one model: the same id or path, or the same folder."""
    if saved == now or os.path.normpath(saved) == os.path.normpath(now):
        return True
    try:
        return os.path.samefile(saved, now)
    except OSError:  # a Hub id, or a folder that is not there
        return False


def _saved_args(path: str) -> dict[str, Any]:
    """The checkpoint's training_args.json (empty for a checkpoint without one, e.g. upstream's)."""
    file = os.path.join(path, ckpt.TRAINING_ARGS_NAME)
    return ckpt.read_json(file) if os.path.isfile(file) else {}


def _engine_optimizer_state(path: str) -> bool:
    """Whether the optimizer state is in an engine's own format (DCP folder, DeepSpeed checkpoint)."""
    return os.path.isdir(os.path.join(path, fsdp.OPTIMIZER_DIR)) or os.path.isdir(
        os.path.join(path, ENGINE_DIR)
    )


def _weights_only_resume(args: TrainingArguments, path: str) -> bool:
    """A resume that loads weights (and a scheduler if saved) but no optimizer: opted into by
    save_only_model now, or by a checkpoint written with save_only_model."""
    return bool(args.save_only_model or _saved_args(path).get("save_only_model"))


def check_optimizer_matches(
    args: TrainingArguments,
    optimizer: torch.optim.Optimizer,
    saved: dict[str, Any],
    path: str,
    custom_optimizer: bool,
) -> None:
    """Refuse optimizer.pt written by another optimizer (another `optim`, unless the optimizer class
    was given (`custom_optimizer`), or groups of other hyperparameters): loading it would fail at the
    first step, or silently mix states."""
    now_name = _optim_name(args.optim)
    saved_name = _saved_args(path).get("optim")
    groups_now, groups_saved = optimizer.param_groups, saved.get("param_groups", [])
    keys_now = sorted(set().union(*(g.keys() for g in groups_now)) - {"params", "initial_lr"})
    keys_saved = (
        sorted(set().union(*(g.keys() for g in groups_saved)) - {"params", "initial_lr"})
        if groups_saved
        else []
    )
    # empty groups aside: transformers keeps an empty no-decay group; older trainwright checkpoints lack it
    layout_now = [len(g["params"]) for g in groups_now if g["params"]]
    layout_saved = [len(g["params"]) for g in groups_saved if g["params"]]
    problems = []
    if saved_name is not None and not custom_optimizer and _optim_name(saved_name) != now_name:
        problems.append(f"it was written with optim={saved_name!r}, this run has optim={now_name!r}")
    if keys_now != keys_saved:
        problems.append(f"its parameter groups hold {keys_saved}, this optimizer's hold {keys_now}")
    elif layout_now != layout_saved:
        problems.append(f"its groups have {layout_saved} parameters, this optimizer's have {layout_now}")
    if problems:
        raise ValueError(
            f"Can't load {os.path.join(path, ckpt.OPTIMIZER_NAME)} into this run's optimizer: "
            + "; ".join(problems)
            + ". Resume with the checkpoint's optim (and the same model and trainable parameters), or pass "
            "save_only_model=True to resume the weights with a fresh optimizer."
        )


def align_empty_groups(saved: dict[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """`saved` (an optimizer's state dict that `check_optimizer_matches` accepted) with the parameter
    groups of `optimizer`: an empty group it lacks is added (the optimizer's own, no state), an empty
    group the optimizer lacks is dropped; the groups holding parameters are untouched."""
    groups = saved.get("param_groups", [])
    if len(groups) == len(optimizer.param_groups):
        return saved
    filled = iter(g for g in groups if g["params"])
    aligned = [next(filled) if g["params"] else {**g, "params": []} for g in optimizer.param_groups]
    return {**saved, "param_groups": aligned}


def _optim_name(value: Any) -> str:
    name = getattr(value, "value", value)
    return "adamw_torch" if name == "adamw_hf" else str(name)


_SCHEDULE_FIELDS = (
    "learning_rate",
    "lr_scheduler_type",
    "lr_scheduler_kwargs",
    "warmup_steps",
    "warmup_ratio",
)


def keep_saved_schedule(
    args: TrainingArguments,
    scheduler: Any,
    optimizer: torch.optim.Optimizer,
    max_steps: int,
    path: str,
    trainer_made: bool,
    resized: bool = False,
) -> Any:
    """The rule on resume: the checkpoint's learning-rate schedule continues. Its rates and step
    come back from scheduler.pt; its shape (type, warm-up, kwargs) from its training_args.json, so
    a Trainer-made scheduler is rebuilt with them: the scheduler to load scheduler.pt into (the
    given one, or its rebuild). Changed arguments are named in one warning."""
    saved = _saved_args(path)
    changed = {
        k: (saved[k], _plain(getattr(args, k)))
        for k in _SCHEDULE_FIELDS
        if k in saved and _normal(saved[k]) != _normal(_plain(getattr(args, k)))
    }
    if not changed and not resized:
        return scheduler
    if changed:
        _say_schedule_change(path, changed)
    if not trainer_made or isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        return scheduler  # the user's own scheduler object: its state is loaded as it is
    return _rebuilt_schedule(args, saved, optimizer, max_steps)


def _say_schedule_change(path: str, changed: dict[str, Any]) -> None:
    logger.warning(
        "Resuming from %s: %s differ from the checkpoint's; the checkpoint's learning-rate schedule "
        "continues (its scheduler.pt wins). Start a new run to train with the new values.",
        path,
        ", ".join(f"{k} ({now!r} now, {was!r} in the checkpoint)" for k, (was, now) in changed.items()),
    )


def _rebuilt_schedule(args: Any, saved: dict[str, Any], optimizer: Any, max_steps: int) -> Any:
    """A Trainer-made scheduler with the checkpoint's shape (type, warm-up, kwargs) over `max_steps`."""
    from types import SimpleNamespace

    from trainwright.optim.schedules import get_scheduler

    warm = SimpleNamespace(
        warmup_steps=saved.get("warmup_steps", args.warmup_steps),
        warmup_ratio=saved.get("warmup_ratio", args.warmup_ratio),
    )
    return get_scheduler(
        saved.get("lr_scheduler_type", _plain(args.lr_scheduler_type)),
        optimizer=optimizer,
        num_warmup_steps=TrainingArguments.get_warmup_steps(warm, max_steps),  # type: ignore[arg-type]
        num_training_steps=max_steps,
        scheduler_specific_kwargs=saved.get("lr_scheduler_kwargs") or {},
    )


def _plain(value: Any) -> Any:
    return getattr(value, "value", value)


def _normal(value: Any) -> Any:
    return {} if value is None else value  # lr_scheduler_kwargs: None and {} are the same


def _global_batch(values: dict[str, Any]) -> int | None:
    try:
        return (
            values["per_device_train_batch_size"]
            * values["gradient_accumulation_steps"]
            * values["world_size"]
        )
    except (KeyError, TypeError):
        return None


def check_position_args(
    args: TrainingArguments, world_size: int, data_state: dict, dataloader: Any, path: str
) -> dict[str, tuple[Any, Any]]:
    """The batch geometry changed since the checkpoint ({argument: (saved, now)}). A changed dataset
    length is refused: the saved position (a count of samples in the epoch's order) would point to
    other samples. Another batch size, accumulation or number of processes is not: the position is
    mapped onto the new geometry (`rescale_position`)."""
    dataset = getattr(dataloader, "dataset", None)
    length = len(dataset) if dataset is not None and hasattr(dataset, "__len__") else None
    if data_state.get("dataset_length") != length:
        raise ValueError(
            f"Can't resume exactly from {path}: dataset_length: {data_state.get('dataset_length')} in the "
            f"checkpoint, {length} now. The saved position counts samples of the epoch's order, which a "
            "dataset of another length does not have. Resume with the checkpoint's dataset, or pass "
            "ignore_data_skip=True to restart the current epoch from its first batch."
        )
    _say_other_rows(data_state, dataset, path)
    now: dict[str, Any] = {k: getattr(args, k) for k in POSITION_ARGS}
    now["world_size"] = world_size
    return {
        k: (data_state.get(k, 1 if k == "world_size" else None), v)
        for k, v in now.items()
        if data_state.get(k, 1 if k == "world_size" else None) != v
    }


def _say_other_rows(data_state: dict, dataset: Any, path: str) -> None:
    """A `datasets` training set whose fingerprint is not the checkpoint's: said once (the position
    is a count of samples, which in another dataset of the same length are other rows)."""
    saved, now = data_state.get("dataset_fingerprint"), fingerprint(dataset)
    if saved is None or now is None or saved == now:
        return
    logger.warning(
        "Resuming from %s with a training set whose fingerprint differs from the checkpoint's (%s in it, "
        "%s now): its rows may be other rows than those the run trained on, so the resumed epoch would "
        "continue at the same position of another order. If the data is the same (a map() whose function "
        "datasets could not hash gets a random fingerprint in each process), nothing is wrong; else resume "
        "with the checkpoint's dataset, or pass ignore_data_skip=True to restart the epoch.",
        path,
        saved,
        now,
    )


def say_geometry_change(
    path: str, changed: dict[str, tuple[Any, Any]], data_state: dict, args: Any, world_size: int
) -> bool:
    """Warn once about a resume with another global batch (True then): it continues at the same
    sample, but the weights can no longer match the uninterrupted run bit for bit."""
    now = {**{k: getattr(args, k) for k in POSITION_ARGS}, "world_size": world_size}
    saved = {**now, **{k: was for k, (was, _) in changed.items()}}
    if _global_batch(saved) == _global_batch(now):
        return False  # the same global batch split otherwise: the same updates
    logger.warning(
        "Resuming %s with another batch: %s (global batch %s -> %s). Training continues at the same "
        "sample of the epoch, so no sample is trained twice or skipped, but the weights can no longer "
        "match those of the uninterrupted run bit for bit.",
        path,
        ", ".join(f"{k} {was} -> {now_value}" for k, (was, now_value) in changed.items()),
        _global_batch(saved),
        _global_batch(now),
    )
    return True


def rescale_position(
    cursor: LoopCursor, data_state: dict, world_size: int, batch_size: int, per_device_batch: int
) -> None:
    """The saved position on this run's geometry: per-process counts rescaled to this number of
    processes (the sampler deals one global order), the epoch's micro-batches counted in this batch
    size. In the saved geometry (the same processes and `per_device_batch`), the saved count of
    micro-batches stands: a library's own loader may batch otherwise than the arguments say."""
    old, new = data_state.get("world_size", 1), world_size
    if old == new and data_state.get("per_device_train_batch_size") == per_device_batch:
        return
    if old != new:
        consumed = cursor.samples_in_epoch * old  # the global position in this epoch's order
        if consumed % new:
            raise ValueError(
                f"Can't resume with {new} processes: the checkpoint's position ({consumed} samples into the "
                "epoch) does not split evenly over them. Use a number of processes that divides it, or "
                "ignore_data_skip=True."
            )
        cursor.samples_in_epoch = consumed // new
        cursor.samples_seen = cursor.samples_seen * old // new
        cursor.tokens_seen = cursor.tokens_seen * old // new
        cursor.flops_seen = cursor.flops_seen * old / new
        logger.info("Checkpoint saved with %d processes, resumed with %d: position rescaled.", old, new)
    cursor.batch_in_epoch = cursor.samples_in_epoch // batch_size


def steps_left(
    cursor: LoopCursor, epochs: int, accumulation: int, micro_left: int, micro_per_epoch: int
) -> int:
    """Optimizer steps from the cursor's position to the end of `epochs` epochs: `micro_left`
    micro-batches left in this epoch, `micro_per_epoch` in each later one."""

    def ceil(a: int, b: int) -> int:
        return -(-a // b)

    later = max(epochs - cursor.epoch - 1, 0) * max(ceil(micro_per_epoch, accumulation), 1)
    return ceil(micro_left, accumulation) + later


def check_saved_step(saved: dict[str, Any], folder: str) -> None:
    """Refuse a trainer_state.json whose global_step no run could have reached (edited or damaged):
    not a whole number >= 0, or past the max_steps it records."""
    step, limit = saved.get("global_step"), saved.get("max_steps")
    whole = isinstance(step, int) and not isinstance(step, bool) and step >= 0
    if not whole or (isinstance(limit, int) and limit > 0 and isinstance(step, int) and step > limit):
        raise ValueError(
            f"Can't resume from {folder}: its {ckpt.TRAINER_STATE_NAME} says global_step={step!r}, which no "
            f"run of max_steps={limit!r} reaches: the file was edited or damaged. Resume from another "
            "checkpoint."
        )


def warn_changed_workers(args: Any, path: str) -> None:
    """Worker processes seed their random streams per worker: another `dataloader_num_workers`
    draws other numbers in them (augmentations) from the same position."""
    saved = _saved_args(path).get("dataloader_num_workers")
    if saved is not None and saved != args.dataloader_num_workers:
        logger.warning(
            "Resuming %s with dataloader_num_workers=%s, the checkpoint's run had %s: each worker seeds its "
            "random streams by its index, so a dataset that draws random numbers in the workers (e.g. "
            "augmentations) draws other ones from here on and the resume is not bit-exact; the data order is "
            "unchanged. Resume with dataloader_num_workers=%s for an exact resume.",
            path,
            args.dataloader_num_workers,
            saved,
            saved,
        )


def keep_saved_data_order(
    args: TrainingArguments, world_size: int, dataloader: Any, data_state: dict, path: str
) -> None:
    """The interrupted run's data order continues: the sampler's saved state (its seed with it) and
    the loader's worker seeds. A changed seed/data_seed is named in a warning; it applies to new runs."""
    sampler: Any = getattr(dataloader, "sampler", None)
    saved_seed = data_state.get("seed")
    now_seed = args.data_seed if args.data_seed is not None else args.seed
    if saved_seed is not None and saved_seed != now_seed:
        field = "data_seed" if args.data_seed is not None else "seed"
        logger.warning(
            "Resuming from %s: %s=%s now, the checkpoint's data order was drawn with %s; that order continues "
            "so no sample is trained twice or skipped in this epoch (the new value applies to new runs).",
            path,
            field,
            now_seed,
            saved_seed,
        )
    saved_sampler = data_state.get("sampler")
    same_layout = data_state.get("world_size", 1) == world_size
    if saved_sampler is not None and same_layout and hasattr(sampler, "load_state_dict"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its own seed warning repeats the one above
            sampler.load_state_dict(saved_sampler)
    elif saved_seed is not None and hasattr(sampler, "seed"):
        sampler.seed = int(saved_seed)
    if saved_seed is not None and hasattr(dataloader, "seed"):
        dataloader.seed = int(saved_seed)  # worker seeds of an EpochSeededDataLoader


def use_own_loss_window(cursor: LoopCursor, data_state: dict, runtime: Any) -> None:
    """Each process's unlogged step losses (saved per process, so logged means stay exact)."""
    windows = data_state.get("loss_windows")
    if not windows:
        return
    if len(windows) == runtime.world_size:
        cursor.loss_window = list(windows[runtime.rank])
    else:  # another number of processes: every process continues from the mean window
        cursor.loss_window = [None if None in v else sum(v) / len(v) for v in zip(*windows)]


def cursor_from_global_step(args: TrainingArguments, steps_in_epoch: int, global_step: int) -> LoopCursor:
    """The position of a checkpoint without data_state.json (transformers'), from its global_step."""
    ga = args.gradient_accumulation_steps
    batches = steps_in_epoch
    cursor = LoopCursor(steps_in_epoch=batches, steps_applied=global_step, steps_attempted=global_step)
    if batches:
        updates = max(-(-batches // ga), 1)
        cursor.epoch = global_step // updates
        cursor.batch_in_epoch = min((global_step % updates) * ga, batches)
        cursor.samples_in_epoch = cursor.batch_in_epoch * args.per_device_train_batch_size
    return cursor


def align_with_saved_epoch(
    cursor: LoopCursor, saved_epoch: float | None, args: TrainingArguments, folder: str
) -> bool:
    """A checkpoint without data_state.json: its trainer_state.json's `epoch` (the fraction of the
    epoch its run had read) is the position when this run's batch geometry puts `global_step`
    elsewhere (another batch size, accumulation or number of processes). Rounded down to a whole
    batch of this run (a few samples are seen again rather than skipped), and said. Whether it moved."""
    steps = cursor.steps_in_epoch
    if saved_epoch is None or not steps:
        return False
    here = cursor.epoch + cursor.batch_in_epoch / steps
    if abs(here - saved_epoch) <= 1e-9 * max(1.0, saved_epoch):
        return False  # the same geometry: global_step gives the position exactly
    epoch = int(saved_epoch + 1e-9)
    exact = (saved_epoch - epoch) * steps
    batch = min(math.floor(exact + 1e-6), steps)
    cursor.epoch, cursor.batch_in_epoch = epoch, batch
    cursor.samples_in_epoch = batch * args.per_device_train_batch_size
    logger.warning(
        "%s has no data_state.json (a transformers checkpoint): its global_step %d would put this run, whose "
        "batches differ (per_device_train_batch_size, gradient_accumulation_steps or processes), at epoch "
        "%.4g, but its trainer_state.json says epoch %.6g: resuming there, at batch %d of %d of epoch %d%s.",
        folder,
        cursor.steps_applied,
        here,
        saved_epoch,
        batch,
        steps,
        epoch,
        "" if abs(exact - batch) < 1e-6 else " (rounded down to a whole batch: a few samples are seen again)",
    )
    return True
