"""What a training checkpoint holds, and how the Trainer writes and restores it.

The file-level work (atomic folders, safetensors, weights-only loading, RNG files, rotation) is in
`checkpoint.py`; this module decides what goes in and puts it back: model, optimizer, scheduler,
scaler, TrainerState, the loop cursor with the sampler position (data_state.json), stateful
callbacks and every process's RNG, so that a resumed run continues bit for bit.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import TYPE_CHECKING, Any

import torch

import trainwright.checkpoint as ckpt
from trainwright.core.state import ExportableState, LoopCursor, TrainerState
from trainwright.distributed import fsdp

if TYPE_CHECKING:
    from trainwright.loop.trainer import Trainer

logger = logging.getLogger(__name__)

# Arguments that change what a saved position means; a resume with other values is refused.
_POSITION_ARGS = ("per_device_train_batch_size", "gradient_accumulation_steps")


def run_dir(trainer: Trainer) -> str:
    output_dir = trainer.args.output_dir
    assert output_dir is not None  # TrainingArguments.__post_init__ fills it in
    trial = trainer._trial
    if trial is None or trainer.hp_search_backend is None:
        return output_dir
    from trainwright.loop.hpo import trial_run_name

    return os.path.join(output_dir, trial_run_name(trainer, trial))


def _optimizer(trainer: Trainer) -> torch.optim.Optimizer:
    """The Trainer's optimizer, which train() creates before a checkpoint is saved or loaded."""
    if trainer.optimizer is None:
        raise RuntimeError(
            "The Trainer has no optimizer: train() creates it (create_optimizer) before a checkpoint is "
            "saved or loaded."
        )
    return trainer.optimizer


# ---------------------------------------------------------------------- choosing what to resume
def resolve_resume_path(trainer: Trainer, resume: str | bool | None) -> str | None:
    """The checkpoint folder to resume from, checked before any work is done."""
    if resume is None:
        resume = trainer.args.resume_from_checkpoint
    if resume is None or resume is False:
        return None
    if resume is True:
        output_dir = trainer.args.output_dir
        assert output_dir is not None  # TrainingArguments.__post_init__ fills it in
        path = ckpt.get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
        if path is None:
            raise ValueError(f"No valid checkpoint found in output directory ({output_dir}).")
    else:
        path = str(resume)
        if not os.path.isdir(path):
            raise ValueError(f"Can't find a valid checkpoint at {path}: no such folder.")
    needed = ["model", "trainer_state"]
    if os.path.exists(os.path.join(path, ckpt.OPTIMIZER_NAME)):
        if not trainer.args.save_only_model:
            needed += ["optimizer", "scheduler"]
    elif _engine_optimizer_state(path):
        pass  # FSDP's DCP folder or DeepSpeed's engine checkpoint holds the optimizer state
    elif not _weights_only_resume(trainer, path):
        raise ValueError(
            f"Can't resume exactly from {path}: it has no {ckpt.OPTIMIZER_NAME}, so the optimizer would start "
            "afresh (and its moments, step counts and learning-rate schedule with it). Resume from a complete "
            "checkpoint, or pass save_only_model=True to resume the weights with a fresh optimizer (a "
            f"{ckpt.SCHEDULER_NAME} that is present is still restored)."
        )
    problems = ckpt.check_checkpoint_files(path, need=tuple(needed))
    if "optimizer" not in needed:  # a weights-only resume does not read it, whatever state it is in
        problems = [p for p in problems if not p.startswith(ckpt.OPTIMIZER_NAME)]
    if problems:
        raise ValueError(f"Can't resume from {path}: " + "; ".join(problems))
    return path


def _saved_args(path: str) -> dict[str, Any]:
    """The checkpoint's training_args.json (empty for a checkpoint without one, e.g. upstream's)."""
    file = os.path.join(path, ckpt.TRAINING_ARGS_NAME)
    return ckpt.read_json(file) if os.path.isfile(file) else {}


def _engine_optimizer_state(path: str) -> bool:
    """Whether the optimizer state is in an engine's own format (DCP folder, DeepSpeed checkpoint)."""
    from trainwright.distributed.deepspeed import ENGINE_DIR

    return os.path.isdir(os.path.join(path, fsdp.OPTIMIZER_DIR)) or os.path.isdir(
        os.path.join(path, ENGINE_DIR)
    )


def _weights_only_resume(trainer: Trainer, path: str) -> bool:
    """A resume that loads weights (and a scheduler if saved) but no optimizer: opted into by
    save_only_model now, or by a checkpoint written with save_only_model."""
    return bool(trainer.args.save_only_model or _saved_args(path).get("save_only_model"))


def _check_optimizer_matches(trainer: Trainer, saved: dict[str, Any], path: str) -> None:
    """Refuse optimizer.pt written by another optimizer (another `optim`, or groups of other
    hyperparameters): loading it would fail at the first step, or silently mix states."""
    now_name = _optim_name(trainer.args.optim)
    saved_name = _saved_args(path).get("optim")
    groups_now, groups_saved = _optimizer(trainer).param_groups, saved.get("param_groups", [])
    keys_now = sorted(set().union(*(g.keys() for g in groups_now)) - {"params", "initial_lr"})
    keys_saved = (
        sorted(set().union(*(g.keys() for g in groups_saved)) - {"params", "initial_lr"})
        if groups_saved
        else []
    )
    layout_now = [len(g["params"]) for g in groups_now]
    layout_saved = [len(g["params"]) for g in groups_saved]
    problems = []
    if (
        saved_name is not None
        and trainer.optimizer_cls_and_kwargs is None
        and _optim_name(saved_name) != now_name
    ):
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


def _keep_saved_schedule(trainer: Trainer, path: str) -> None:
    """The rule on resume: the checkpoint's learning-rate schedule continues. Its rates and step
    come back from scheduler.pt; its shape (type, warm-up, kwargs) from its training_args.json, so
    a Trainer-made scheduler is rebuilt with them. Changed arguments are named in one warning."""
    saved = _saved_args(path)
    args = trainer.args
    changed = {
        k: (saved[k], _plain(getattr(args, k)))
        for k in _SCHEDULE_FIELDS
        if k in saved and _normal(saved[k]) != _normal(_plain(getattr(args, k)))
    }
    if not changed:
        return
    logger.warning(
        "Resuming from %s: %s differ from the checkpoint's; the checkpoint's learning-rate schedule "
        "continues (its scheduler.pt wins). Start a new run to train with the new values.",
        path,
        ", ".join(f"{k} ({now!r} now, {was!r} in the checkpoint)" for k, (was, now) in changed.items()),
    )
    if not getattr(trainer, "_created_scheduler", False) or isinstance(
        trainer.lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau
    ):
        return  # the user's own scheduler object: its state is loaded as it is
    from types import SimpleNamespace

    from trainwright.args.training_args import TrainingArguments
    from trainwright.optim.schedules import get_scheduler

    warm = SimpleNamespace(
        warmup_steps=saved.get("warmup_steps", args.warmup_steps),
        warmup_ratio=saved.get("warmup_ratio", args.warmup_ratio),
    )
    total = trainer.state.max_steps
    trainer.lr_scheduler = get_scheduler(
        saved.get("lr_scheduler_type", _plain(args.lr_scheduler_type)),
        optimizer=_optimizer(trainer),
        num_warmup_steps=TrainingArguments.get_warmup_steps(warm, total),  # type: ignore[arg-type]
        num_training_steps=total,
        scheduler_specific_kwargs=saved.get("lr_scheduler_kwargs") or {},
    )


def _plain(value: Any) -> Any:
    return getattr(value, "value", value)


def _normal(value: Any) -> Any:
    return {} if value is None else value  # lr_scheduler_kwargs: None and {} are the same


# ---------------------------------------------------------------------- callbacks' state
def callback_states(trainer: Trainer) -> dict[str, Any]:
    """{ClassName: {"args", "attributes"}} of callbacks that export state, plus TrainerControl."""
    states: dict[str, Any] = {}
    for cb in [*trainer.callback_handler.callbacks, trainer.control]:
        if not isinstance(cb, ExportableState) or not callable(getattr(cb, "state", None)):
            continue
        name = type(cb).__name__
        if name in states:
            existing = states[name]
            states[name] = [*(existing if isinstance(existing, list) else [existing]), cb.state()]
        else:
            states[name] = cb.state()
    return states


def _restore_callback_states(trainer: Trainer, saved: dict[str, Any]) -> None:
    """Put saved attributes back into the live callbacks of the same class (by order for several
    of one class). With `restore_callback_states_from_checkpoint` constructor args and the
    TrainerControl come back too, as upstream does."""
    full = trainer.args.restore_callback_states_from_checkpoint
    by_class: dict[str, list] = {}
    for cb in trainer.callback_handler.callbacks:
        by_class.setdefault(type(cb).__name__, []).append(cb)
    for name, value in saved.items():
        entries = value if isinstance(value, list) else [value]
        if name == "TrainerControl":
            if full:
                for k, v in entries[0].get("args", {}).items():
                    setattr(trainer.control, k, v)
            continue
        live = by_class.get(name, [])
        if not live:
            logger.warning("Checkpoint has state for callback %s, which this Trainer does not have.", name)
            continue
        for cb, entry in zip(live, entries):
            if full:
                new = type(cb)(**entry.get("args", {}))
                trainer.callback_handler.remove_callback(cb)
                trainer.callback_handler.add_callback(new)
                cb = new
            for k, v in entry.get("attributes", {}).items():
                setattr(cb, k, v)


# ---------------------------------------------------------------------- saving
def save(trainer: Trainer) -> str:
    """Write checkpoint-<global_step> atomically, then rotate old ones."""
    args, state, runtime = trainer.args, trainer.state, trainer.runtime
    trainer.store_flos()
    folder = run_dir(trainer)
    name = f"{ckpt.PREFIX_CHECKPOINT_DIR}-{state.global_step}"
    if state.best_global_step is not None:
        best = os.path.join(folder, f"{ckpt.PREFIX_CHECKPOINT_DIR}-{state.best_global_step}")
        if state.best_global_step == state.global_step or os.path.isdir(best):
            state.best_model_checkpoint = best
    state.stateful_callbacks = callback_states(trainer)
    cursor = trainer.cursor
    windows = runtime.all_gather_object(trainer._losses.values(cursor.steps_since_log))
    cursor.loss_window = windows[runtime.rank]
    main = runtime.is_main_process or (args.save_on_each_node and runtime.is_local_main_process)
    sharded = fsdp.is_sharded(trainer.model)  # FSDP2: model + optimizer as DCP folders, from every rank
    engine = trainer._deepspeed  # DeepSpeed: its own checkpoint beside whole weights
    custom_save_model = trainer._overrides("save_model")
    engine_weights = (  # ZeRO-3: every rank gathers
        engine.full_state_dict() if engine is not None and not custom_save_model else None
    )

    def write(tmp: str) -> None:
        if main and sharded:  # the weights are DCP folders (below): the folder still describes the model
            write_model(trainer, tmp, weights=False)
        elif custom_save_model:  # a subclass's save_model is called as upstream calls it, on every rank
            trainer.save_model(tmp, _internal_call=True)
        elif main:  # what save_model(_internal_call=True) does, without gathering the weights again
            trainer._save(tmp, state_dict=engine_weights)
        if engine is not None and not args.save_only_model:
            engine.save(tmp)
        if sharded:
            fsdp.save_sharded(trainer.model, None if args.save_only_model else trainer.optimizer, tmp)
        if not args.save_only_model:
            if main and not sharded and engine is None:
                ckpt.save_torch_state(
                    _optimizer(trainer).state_dict(), os.path.join(tmp, ckpt.OPTIMIZER_NAME)
                )
            if main:
                ckpt.save_torch_state(
                    trainer.lr_scheduler.state_dict(), os.path.join(tmp, ckpt.SCHEDULER_NAME)
                )
                if trainer.scaler is not None:
                    ckpt.save_torch_state(trainer.scaler.state_dict(), os.path.join(tmp, ckpt.SCALER_NAME))
            ckpt.save_rng_state(tmp, runtime.rank, runtime.world_size)
        if main:
            ckpt.write_json(os.path.join(tmp, ckpt.DATA_STATE_NAME), _data_state(trainer, windows))
            state.save_to_json(os.path.join(tmp, ckpt.TRAINER_STATE_NAME))

    path = ckpt.write_checkpoint(folder, name, write, runtime=runtime)
    if main and args.save_total_limit is not None:
        ckpt.rotate_checkpoints(
            folder, args.save_total_limit, best_model_checkpoint=state.best_model_checkpoint
        )
    runtime.barrier()
    return path


def _data_state(trainer: Trainer, windows: list[list[float]]) -> dict[str, Any]:
    args = trainer.args
    dataloader = trainer.callback_handler.train_dataloader
    dataset = getattr(dataloader, "dataset", None)
    out: dict[str, Any] = {
        "cursor": trainer.cursor.to_dict(),
        "world_size": trainer.runtime.world_size,
        "dataset_length": len(dataset) if dataset is not None and hasattr(dataset, "__len__") else None,
        "seed": args.data_seed if args.data_seed is not None else args.seed,
        "loss_windows": windows,
        **{k: getattr(args, k) for k in _POSITION_ARGS},
    }
    sampler: Any = getattr(dataloader, "sampler", None)
    if hasattr(sampler, "state_dict"):
        out["sampler"] = sampler.state_dict()
    if dataset is not None and callable(getattr(dataset, "state_dict", None)):
        out["dataset_state"] = dataset.state_dict()
    return out


def write_model(
    trainer: Trainer, directory: str, weights: bool = True, state_dict: dict | None = None
) -> None:
    """Weights (or, without them, the model's config), training_args.json and the processing class."""
    config: Any = getattr(trainer.model, "config", None)
    if weights:
        ckpt.save_model_weights(
            trainer.model, directory, max_shard_size=trainer.args.save_max_shard_size, state_dict=state_dict
        )
    elif hasattr(config, "save_pretrained"):
        config.save_pretrained(directory)  # sharded weights: still describe the model
    ckpt.write_json(os.path.join(directory, ckpt.TRAINING_ARGS_NAME), trainer.args.to_dict())
    processing = trainer.processing_class
    if processing is None:
        processing = getattr(trainer.data_collator, "tokenizer", None)
    if processing is not None and hasattr(processing, "save_pretrained"):
        processing.save_pretrained(directory)


def save_model(trainer: Trainer, output_dir: str) -> None:
    """`Trainer.save_model`: weights, processing class and training_args.json (main process).
    An FSDP-sharded model is gathered first (every rank must call this) and saved consolidated."""
    state_dict = None
    if trainer._deepspeed is not None:
        state_dict = trainer._deepspeed.full_state_dict()  # ZeRO-3: gathered on every rank
    elif fsdp.is_sharded(trainer.model):
        state_dict = fsdp.full_state_dict(trainer.model, on_every_rank=trainer.args.save_on_each_node)
    if trainer.runtime.is_main_process or (
        trainer.args.save_on_each_node and trainer.runtime.is_local_main_process
    ):
        trainer._save(output_dir, state_dict=state_dict)
    trainer.runtime.barrier()


# ---------------------------------------------------------------------- restoring
def restore(trainer: Trainer, path: str, train_dataloader: Any) -> None:
    """Load everything a checkpoint holds into the Trainer, refusing a resume whose arguments
    change the meaning of the saved position (unless ignore_data_skip)."""
    args, runtime = trainer.args, trainer.runtime
    data_state = (
        ckpt.read_json(os.path.join(path, ckpt.DATA_STATE_NAME)) if _has(path, ckpt.DATA_STATE_NAME) else None
    )
    saved_state = TrainerState.load_from_json(os.path.join(path, ckpt.TRAINER_STATE_NAME))
    if data_state is not None and not args.ignore_data_skip:
        _check_position_args(trainer, data_state, train_dataloader, path)

    if trainer._deepspeed is not None:  # the engine puts back weights, fp32 masters and optimizer state
        trainer._deepspeed.load(path, with_optimizer=not args.save_only_model)
        if _has(path, ckpt.SCHEDULER_NAME) and not args.save_only_model:
            trainer.lr_scheduler.load_state_dict(
                ckpt.safe_torch_load(os.path.join(path, ckpt.SCHEDULER_NAME))
            )
    elif fsdp.has_sharded_checkpoint(path):  # DCP reshards to this run's processes, sharded or not
        with_optimizer = _has(path, ckpt.SCHEDULER_NAME) and not args.save_only_model
        fsdp.load_sharded(trainer.model, trainer.optimizer if with_optimizer else None, path)
        if with_optimizer:
            trainer.lr_scheduler.load_state_dict(
                ckpt.safe_torch_load(os.path.join(path, ckpt.SCHEDULER_NAME))
            )
    elif fsdp.is_sharded(trainer.model):
        raise ValueError(
            f"Can't resume {path} with fsdp: it holds unsharded weights ({ckpt.WEIGHTS_NAME}), not the DCP "
            f"folders ({fsdp.MODEL_DIR}/) a sharded model loads. Resume it without fsdp."
        )
    else:
        trainer._load_from_checkpoint(path)
        if _has(path, ckpt.SCHEDULER_NAME):
            _keep_saved_schedule(trainer, path)
        if _has(path, ckpt.OPTIMIZER_NAME) and not args.save_only_model:
            saved_optimizer = ckpt.safe_torch_load(os.path.join(path, ckpt.OPTIMIZER_NAME))
            _check_optimizer_matches(trainer, saved_optimizer, path)
            _optimizer(trainer).load_state_dict(saved_optimizer)
        elif _has(path, ckpt.OPTIMIZER_NAME):
            logger.warning("save_only_model=True: resuming the weights of %s with a fresh optimizer.", path)
        if _has(path, ckpt.SCHEDULER_NAME):  # never dropped, even when the optimizer starts afresh
            trainer.lr_scheduler.load_state_dict(
                ckpt.safe_torch_load(os.path.join(path, ckpt.SCHEDULER_NAME))
            )
    if trainer.scaler is not None and _has(path, ckpt.SCALER_NAME):
        trainer.scaler.load_state_dict(ckpt.safe_torch_load(os.path.join(path, ckpt.SCALER_NAME)))

    state = trainer.state
    for key in (
        "global_step",
        "epoch",
        "log_history",
        "best_metric",
        "best_global_step",
        "total_flos",
        "num_input_tokens_seen",
        "optimizer_step_attempts",
        "stateful_callbacks",
        "trial_name",
        "trial_params",
    ):
        setattr(state, key, getattr(saved_state, key))
    best = saved_state.best_model_checkpoint
    if best is not None and not os.path.isdir(best):
        logger.warning("The best checkpoint recorded in %s (%s) no longer exists; forgetting it.", path, best)
        best = None
    state.best_model_checkpoint = best
    _restore_callback_states(trainer, saved_state.stateful_callbacks or {})

    if data_state is not None:
        cursor = LoopCursor.from_dict(data_state["cursor"])
        cursor.steps_in_epoch = trainer.cursor.steps_in_epoch
        _use_own_loss_window(cursor, data_state, runtime)
        if not args.ignore_data_skip:
            _rescale_position(cursor, data_state, trainer)
    else:  # a transformers checkpoint: rebuild the position from global_step, as upstream does
        cursor = _cursor_from_global_step(trainer, saved_state.global_step)
    if args.ignore_data_skip:
        cursor.batch_in_epoch = cursor.samples_in_epoch = 0
    trainer.cursor = cursor
    if data_state is not None and not args.ignore_data_skip:
        _keep_saved_data_order(trainer, train_dataloader, data_state, path)
    dataset: Any = getattr(train_dataloader, "dataset", None)
    if data_state is not None and "dataset_state" in data_state and hasattr(dataset, "load_state_dict"):
        dataset.load_state_dict(data_state["dataset_state"])
        trainer._iterable_restored = True
    if not args.save_only_model:
        ckpt.load_rng_state(path, runtime.rank, runtime.world_size)  # a damaged file is an error
    logger.info(
        "Resumed from %s at step %d (epoch %d, batch %d of it).",
        path,
        cursor.steps_applied,
        cursor.epoch,
        cursor.batch_in_epoch,
    )


def _has(path: str, name: str) -> bool:
    return os.path.isfile(os.path.join(path, name))


def _global_batch(values: dict[str, Any]) -> int | None:
    try:
        return (
            values["per_device_train_batch_size"]
            * values["gradient_accumulation_steps"]
            * values["world_size"]
        )
    except (KeyError, TypeError):
        return None


def _check_position_args(trainer: Trainer, data_state: dict, dataloader: Any, path: str) -> None:
    """Refuse a resume whose batch geometry moves the saved position. A different split of the same
    global batch (processes x batch per device x accumulation) is fine: the sampler deals one
    global order, so the position is rescaled (`_rescale_position`)."""
    now: dict[str, Any] = {k: getattr(trainer.args, k) for k in _POSITION_ARGS}
    now["world_size"] = trainer.runtime.world_size
    dataset = getattr(dataloader, "dataset", None)
    now["dataset_length"] = len(dataset) if dataset is not None and hasattr(dataset, "__len__") else None
    same_global = _global_batch(now) == _global_batch(data_state) is not None
    changed = [
        f"{k}: {data_state.get(k)} in the checkpoint, {v} now"
        for k, v in now.items()
        if data_state.get(k) != v and not (same_global and k in (*_POSITION_ARGS, "world_size"))
    ]
    if changed:
        raise ValueError(
            f"Can't resume exactly from {path}: "
            + "; ".join(changed)
            + ". These change which samples the saved "
            "position points to. Restore the original values, or pass ignore_data_skip=True to restart the "
            "current epoch from its first batch."
        )


def _rescale_position(cursor: LoopCursor, data_state: dict, trainer: Trainer) -> None:
    """Per-process counts of a checkpoint saved with another number of processes (same global batch)."""
    old, new = data_state.get("world_size", 1), trainer.runtime.world_size
    if old == new:
        return
    consumed = cursor.samples_in_epoch * old  # the global position in this epoch's order
    if consumed % new:
        raise ValueError(
            f"Can't resume with {new} processes: the checkpoint's position ({consumed} samples into the epoch) "
            f"does not split evenly over them. Use a number of processes that divides it, or ignore_data_skip=True."
        )
    cursor.samples_in_epoch = consumed // new
    cursor.batch_in_epoch = cursor.samples_in_epoch // trainer.args.per_device_train_batch_size
    cursor.samples_seen = cursor.samples_seen * old // new
    cursor.tokens_seen = cursor.tokens_seen * old // new
    cursor.flops_seen = cursor.flops_seen * old / new
    logger.info("Checkpoint saved with %d processes, resumed with %d: position rescaled.", old, new)


def _keep_saved_data_order(trainer: Trainer, dataloader: Any, data_state: dict, path: str) -> None:
    """The interrupted run's data order continues: the sampler's saved state (its seed with it) and
    the loader's worker seeds. A changed seed/data_seed is named in a warning; it applies to new runs."""
    args = trainer.args
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
    same_layout = data_state.get("world_size", 1) == trainer.runtime.world_size
    if saved_sampler is not None and same_layout and hasattr(sampler, "load_state_dict"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its own seed warning repeats the one above
            sampler.load_state_dict(saved_sampler)
    elif saved_seed is not None and hasattr(sampler, "seed"):
        sampler.seed = int(saved_seed)
    if saved_seed is not None and hasattr(dataloader, "seed"):
        dataloader.seed = int(saved_seed)  # worker seeds of an EpochSeededDataLoader


def _use_own_loss_window(cursor: LoopCursor, data_state: dict, runtime: Any) -> None:
    """Each process's unlogged step losses (saved per process, so logged means stay exact)."""
    windows = data_state.get("loss_windows")
    if not windows:
        return
    if len(windows) == runtime.world_size:
        cursor.loss_window = list(windows[runtime.rank])
    else:  # another number of processes: every process continues from the mean window
        cursor.loss_window = [sum(v) / len(v) for v in zip(*windows)]


def _cursor_from_global_step(trainer: Trainer, global_step: int) -> LoopCursor:
    ga = trainer.args.gradient_accumulation_steps
    batches = trainer.cursor.steps_in_epoch
    cursor = LoopCursor(steps_in_epoch=batches, steps_applied=global_step, steps_attempted=global_step)
    if batches:
        updates = max(-(-batches // ga), 1)
        cursor.epoch = global_step // updates
        cursor.batch_in_epoch = min((global_step % updates) * ga, batches)
        cursor.samples_in_epoch = cursor.batch_in_epoch * trainer.args.per_device_train_batch_size
    return cursor


def load_weights(trainer: Trainer, path: str, model: Any) -> None:
    """A checkpoint's weights into `model`: DCP folders (FSDP) or safetensors / bin files."""
    if fsdp.has_sharded_checkpoint(path):
        fsdp.load_sharded(model, None, path)
    else:
        ckpt.load_model_weights(model, path)


def cleanup_after_training(trainer: Trainer) -> None:
    """With save_total_limit=1, keep only the best checkpoint once training is over (upstream)."""
    args, state = trainer.args, trainer.state
    if (
        args.save_total_limit != 1
        or state.best_model_checkpoint is None
        or not trainer.runtime.is_main_process
    ):
        return
    folder = run_dir(trainer)
    for path in ckpt.sort_checkpoints(folder):
        if os.path.abspath(path) != os.path.abspath(state.best_model_checkpoint):
            logger.info("Deleting %s (save_total_limit=1 keeps the best checkpoint).", path)
            ckpt.delete_checkpoint(path)
