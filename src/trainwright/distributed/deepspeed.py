"""DeepSpeed's engine behind the Trainer (the `deepspeed` argument: a config dict or JSON file).

The engine owns what ZeRO changes: the data-parallel gradient reduction, clipping
(`gradient_clipping`), mixed precision, and the optimizer step over partitioned state. The Trainer
keeps everything else: batches, accumulation boundaries (set on the engine for each micro-batch, so a
short last accumulation of an epoch still ends in a step), token-weighted loss scaling, and the
learning-rate schedule. The schedule is stepped by the Trainer on the engine's base optimizer rather
than handed to `deepspeed.initialize`, so that the logged learning rate is the one each step applied and
ReduceLROnPlateau gets its metric exactly as without DeepSpeed; a `scheduler` section in the config is
therefore refused.

Checkpoints: the engine writes its own (sharded optimizer state, fp32 master weights) into a
`deepspeed/` folder inside trainwright's checkpoint folder; trainwright still writes consolidated
weights, the schedule, RNG and the loop position beside it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from trainwright.core.files import JSONFileError, read_json_object

ENGINE_DIR = "deepspeed"
_AUTO = "auto"


def load_config(source: dict[str, Any] | str) -> dict[str, Any]:
    """A copy of the DeepSpeed config given as a dict or a JSON file path."""
    if isinstance(source, dict):
        return json.loads(json.dumps(source))  # deep copy; the user's dict is left as given
    if not isinstance(source, str) or not os.path.isfile(source):
        raise ValueError(f"deepspeed: expected a config dict or an existing JSON file, got {source!r}")
    try:
        return read_json_object(source)
    except JSONFileError as e:
        raise JSONFileError(f"deepspeed: {e}") from None


def fill_config(config: dict[str, Any], args: Any, world_size: int) -> dict[str, Any]:
    """Replace "auto" (and fill missing) values from the TrainingArguments; a value set in both places
    that disagrees is an error, since DeepSpeed and the Trainer would otherwise run different batches."""
    if "scheduler" in config:
        raise ValueError(
            "deepspeed: the config has a `scheduler` section, but trainwright steps the learning-rate "
            "schedule itself: remove it and set lr_scheduler_type / warmup_steps in TrainingArguments."
        )
    micro, ga = args.per_device_train_batch_size, args.gradient_accumulation_steps
    clip = args.max_grad_norm if args.max_grad_norm is not None and args.max_grad_norm > 0 else 0.0
    _set(config, "train_micro_batch_size_per_gpu", micro, "per_device_train_batch_size")
    _set(config, "gradient_accumulation_steps", ga, "gradient_accumulation_steps")
    _set(
        config,
        "train_batch_size",
        micro * ga * world_size,
        "per_device_train_batch_size x accumulation x processes",
    )
    _set(config, "gradient_clipping", clip, "max_grad_norm")
    for section, flag in (("bf16", bool(args.bf16)), ("fp16", bool(args.fp16))):
        if section in config:
            _set(config[section], "enabled", flag, section, where=f"{section}.enabled")
        elif flag:
            config[section] = {"enabled": True}
    params = config.get("optimizer", {}).get("params")
    if isinstance(params, dict):
        for key, value in (
            ("lr", args.learning_rate),
            ("betas", [args.adam_beta1, args.adam_beta2]),
            ("eps", args.adam_epsilon),
            ("weight_decay", args.weight_decay),
        ):
            if params.get(key) == _AUTO:
                params[key] = value
    leftover = _auto_paths(config)
    if leftover:
        raise ValueError(
            f'deepspeed: no TrainingArguments value fills {", ".join(leftover)} ("auto"): set it in the config.'
        )
    return config


def _set(section: dict[str, Any], key: str, value: Any, arg: str, where: str | None = None) -> None:
    current = section.get(key, _AUTO)
    if current == _AUTO:
        section[key] = value
    elif current != value:
        raise ValueError(f"deepspeed: {where or key}={current!r} in the config but {arg} gives {value!r}")


def _auto_paths(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _auto_paths(v, f"{prefix}{k}.")]
    return [prefix.rstrip(".")] if node == _AUTO else []


def _one_process_rendezvous() -> None:
    """DeepSpeed needs a process group even for one process; without torchrun's variables it would
    look for MPI instead. Describe a world of one on loopback (values the user set are kept)."""
    import socket

    if os.environ.get("MASTER_PORT") is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    for name, value in (
        ("MASTER_ADDR", "127.0.0.1"),
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "1"),
    ):
        os.environ.setdefault(name, value)


class DeepSpeedRun:
    """The engine of one `train()` call and the few operations the Trainer asks of it."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    @classmethod
    def start(
        cls,
        args: Any,
        runtime: Any,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        create_optimizer: Callable[[], torch.optim.Optimizer],
    ) -> DeepSpeedRun:
        """Build the engine over `model` with the config's optimizer, else `optimizer`, else a new
        one from `create_optimizer` (the Trainer's); forward then runs on `engine`, and the schedule
        drives `base_optimizer`."""
        try:
            import deepspeed
        except ImportError as e:
            raise ImportError(
                "deepspeed is set in TrainingArguments but the deepspeed package is not installed: "
                "pip install deepspeed"
            ) from e
        if args.torch_compile:
            raise ValueError(
                "deepspeed and torch_compile are both set: DeepSpeed's engine is not compiled here."
            )
        if args.deepspeed is None:
            raise RuntimeError("DeepSpeedRun.start: TrainingArguments.deepspeed (the config) is not set.")
        config = fill_config(load_config(args.deepspeed), args, runtime.world_size)
        from trainwright.optim.optimizers import decay_param_groups

        kwargs: dict[str, Any]
        if "optimizer" in config:
            if optimizer is not None:
                raise ValueError(
                    "deepspeed: the config has an `optimizer` section and the Trainer got an optimizer "
                    "too: keep one of them."
                )
            kwargs = {
                "optimizer": None,
                "model_parameters": decay_param_groups(model, args.weight_decay),
            }
        else:
            kwargs = {"optimizer": create_optimizer()}
            # ZeRO otherwise refuses optimizers outside its own list (SGD, fused AdamW, ...).
            config.setdefault("zero_allow_untested_optimizer", True)
        if not runtime.distributed:
            _one_process_rendezvous()
        engine, _, _, _ = deepspeed.initialize(model=model, config=config, **kwargs)
        return cls(engine)

    @property
    def base_optimizer(self) -> torch.optim.Optimizer:
        """The torch optimizer whose param_groups the engine's step reads (the schedule sets lr here)."""
        optimizer = self.engine.optimizer
        return getattr(optimizer, "optimizer", optimizer)

    @property
    def zero_stage(self) -> int:
        return int(self.engine.zero_optimization_stage())

    def set_boundary(self, is_boundary: bool) -> None:
        """Mark the next backward as the last micro-batch of an optimizer step (or not)."""
        self.engine.set_gradient_accumulation_boundary(is_boundary)

    def backward(self, loss: torch.Tensor) -> None:
        # The Trainer has already weighted the loss for accumulation (by tokens): no 1/GA on top.
        self.engine.backward(loss, scale_wrt_gas=False)

    def step(self) -> tuple[bool, float | None]:
        """The engine's optimizer step (clip, update, zero grads): (applied, gradient norm).
        `applied` is False when fp16 loss scaling skipped the update."""
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return bool(self.engine.was_step_applied()), (None if norm is None else float(norm))

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Whole weights gathered from every rank under ZeRO-3 (call on every rank); None below stage 3,
        where each rank's module already holds all of them."""
        if self.zero_stage < 3:
            return None
        return self.engine._zero3_consolidated_16bit_state_dict()

    def save(self, checkpoint_dir: str) -> None:
        """The engine's checkpoint (every rank writes its partition) under checkpoint_dir/deepspeed."""
        self.engine.save_checkpoint(os.path.join(checkpoint_dir, ENGINE_DIR), tag="engine")

    def load(self, checkpoint_dir: str, with_optimizer: bool = True) -> None:
        folder = os.path.join(checkpoint_dir, ENGINE_DIR)
        if not os.path.isdir(folder):
            raise ValueError(
                f"Can't resume {checkpoint_dir} with deepspeed: it has no {ENGINE_DIR}/ folder (it was not written "
                "by a DeepSpeed run). Resume it without deepspeed, or load its weights into the model first."
            )
        path, _ = self.engine.load_checkpoint(
            folder,
            tag="engine",
            load_optimizer_states=with_optimizer,
            load_lr_scheduler_states=False,
            load_module_only=not with_optimizer,
        )
        if path is None:
            raise ValueError(f"deepspeed could not load the engine checkpoint in {folder}")
