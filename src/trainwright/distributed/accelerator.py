"""`Trainer.accelerator`: the part of accelerate's `Accelerator` that training scripts and the
libraries built on the Trainer (TRL) call, answered by trainwright's runtime and run.

trainwright does not run on accelerate. Each member here has accelerate's meaning (its process facts,
collectives, precision, model preparation for a frozen model, the accumulation boundary); a call
that trainwright cannot honour with that meaning raises an error naming it, and anything else asked
of this object raises an AttributeError that says so, rather than pretending.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from trainwright.args import process_state
from trainwright.core.modules import unwrap_model as _unwrap
from trainwright.core.nested import holds_tensors, slice_batch
from trainwright.data.prepared import prepare_loader
from trainwright.distributed import collectives

_ANSWERS = (
    "device, state, distributed_type, mixed_precision, parallelism_config, dataloader_config, "
    "split_batches, dispatch_batches, even_batches, use_seedable_sampler, non_blocking, "
    "sync_gradients, gradient_accumulation_steps, is_main_process, is_local_main_process, process_index, "
    "local_process_index, num_processes, use_distributed, wait_for_everyone, gather, gather_for_metrics, "
    "reduce, pad_across_processes, split_between_processes, unwrap_model, prepare_model, prepare, "
    "prepare_data_loader, "
    "autocast, backward, clip_grad_norm_, print, main_process_first, local_main_process_first, "
    "free_memory and end_training"
)


class RuntimeAccelerator:
    """What code written against accelerate uses of `trainer.accelerator`, over the Trainer's runtime.

    Built from values, as accelerate's `Accelerator` is: the runtime and the arguments; the Trainer
    hands it what it prepares (`follow`: the trained model and its wrapper, the run while train()
    runs). It holds no Trainer, and the trained models only weakly (as the loaders `prepare` made),
    so a user's `accelerator` keeps no model alive after `del trainer`."""

    def __init__(self, runtime: Any, args: Any) -> None:
        self._runtime, self._args = runtime, args
        self._run: Any = None  # the training run while train() runs
        self._even_batches: bool | None = None  # set by a library (None: accelerator_config's)
        self._loaders: weakref.WeakSet[Any] = weakref.WeakSet()  # the loaders prepare() made
        self._trained: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # the Trainer's model (and wrapper)

    def follow(self, args: Any, run: Any = None, models: tuple[nn.Module, ...] = ()) -> None:
        """The Trainer's arguments (a search trial's), its run while train() runs (None after), and
        the model it trains with its wrapper (`prepare_model` returns those as they are)."""
        self._args, self._run = args, run
        self._trained = weakref.WeakSet(m for m in models if m is not None)  # none yet: model_init's

    def __getstate__(self) -> dict[str, Any]:
        # pickled with its Trainer (ray's search ships the Trainer to its workers): the weak sets
        # are not pickled (the Trainer hands its model again when train() starts)
        return {"runtime": self._runtime, "args": self._args, "even_batches": self._even_batches}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._runtime, self._args, self._run = state["runtime"], state["args"], None
        self._even_batches = state.get("even_batches")
        self._loaders, self._trained = weakref.WeakSet(), weakref.WeakSet()

    # -- process facts ---------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self._runtime.device

    @property
    def is_main_process(self) -> bool:
        return self._runtime.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self._runtime.is_local_main_process

    @property
    def process_index(self) -> int:
        return self._runtime.rank

    @property
    def local_process_index(self) -> int:
        return self._runtime.local_rank

    @property
    def num_processes(self) -> int:
        return self._runtime.world_size

    @property
    def use_distributed(self) -> bool:
        return self._runtime.distributed

    @property
    def state(self) -> process_state.ProcessState:
        """accelerate's `AcceleratorState` facts (distributed type, plugins: see args/process_state.py)."""
        return process_state.process_state(self._args)

    @property
    def distributed_type(self) -> process_state.DistributedType:
        return process_state.distributed_type(self._args)

    @property
    def mixed_precision(self) -> str:
        return process_state.mixed_precision(self._args)

    @property
    def parallelism_config(self) -> Any:
        """The arguments' `parallelism_config` (accelerate's field names and `*_enabled` facts), or None."""
        return self._args.parallelism_config

    @property
    def dataloader_config(self) -> Any:
        """The arguments' `accelerator_config` (`split_batches`, `dispatch_batches`, `even_batches`,
        `use_seedable_sampler`): a change to it applies to the data loaders built afterwards."""
        return self._args.accelerator_config

    def _data_setting(self, name: str, default: Any) -> Any:
        config = self._args.accelerator_config
        return getattr(config, name, default) if config is not None else default

    @property
    def split_batches(self) -> bool:
        return bool(self._data_setting("split_batches", False))

    @property
    def dispatch_batches(self) -> bool | None:
        return self._data_setting("dispatch_batches", None)

    @property
    def even_batches(self) -> bool:
        """accelerate's: whether `prepare`'s loaders complete the epoch's last batches with repeats.
        A library may set it (sentence-transformers: False for its training loader, True for
        evaluation); it applies to the loaders `prepare` makes afterwards, not the Trainer's own."""
        if self._even_batches is not None:
            return self._even_batches
        return self._data_setting("even_batches", True) is not False

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self._even_batches = bool(value)

    @property
    def use_seedable_sampler(self) -> bool:
        return self._data_setting("use_seedable_sampler", True) is not False

    @property
    def non_blocking(self) -> bool:
        return bool(self._data_setting("non_blocking", False))

    @property
    def gradient_accumulation_steps(self) -> int:
        return self._args.gradient_accumulation_steps

    @property
    def sync_gradients(self) -> bool:
        """False while a micro-batch that is not its step's last is trained, else True (accelerate's
        meaning: gradients are synchronised and the optimizer steps after this backward)."""
        run = self._run
        return run is None or run.at_step_boundary()

    # -- collectives -----------------------------------------------------------------------------
    def wait_for_everyone(self) -> None:
        self._runtime.barrier()

    def gather(self, tensor: Any) -> Any:
        """Every process's tensors (nested in mappings, lists and tuples) concatenated along the first
        dimension, in rank order; a 0-d tensor becomes one row per process."""
        return collectives.gather(self._runtime, tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """`gather` for tensors; other objects (lists of strings, ...) gathered as objects and flattened.
        While a loader `prepare` made yields the last global step of its epoch, the samples repeated
        to even out the processes are dropped (the first rows are the real ones), as accelerate
        does; trainwright's own evaluation sampler repeats no sample."""
        if use_gather_object or not holds_tensors(input_data):
            gathered = collectives.gather_object(self._runtime, input_data)
        else:
            gathered = self.gather(input_data)
        rows = next((r for loader in self._loaders if (r := loader.real_rows_in_step) is not None), None)
        if rows is None:
            return gathered
        return gathered[:rows] if isinstance(gathered, list) else slice_batch(gathered, slice(0, rows))

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        return collectives.reduce(self._runtime, tensor, reduction, scale)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False
    ) -> Any:
        return collectives.pad_across_processes(self._runtime, tensor, dim, pad_index, pad_first)

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        yield collectives.split_between_processes(self._runtime, inputs, apply_padding)

    # -- models, precision, steps -------------------------------------------------------------------
    def unwrap_model(
        self, model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> nn.Module:
        """The model inside DDP (and `torch.compile`, unless `keep_torch_compile`); without
        `keep_fp32_wrapper`, a forward that `prepare_model` wrapped in autocast is restored."""
        inner = _unwrap(model)
        compiled = getattr(model, "_orig_mod", None) is not None
        module = model if compiled and keep_torch_compile else inner
        if not keep_fp32_wrapper and "_original_forward" in inner.__dict__:
            inner.forward = inner.__dict__.pop("_original_forward")
        return module

    def prepare_model(
        self, model: nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False
    ) -> nn.Module:
        """A model beside the trained one (a reference or reward model): on this process's device, its
        forward under the arguments' autocast with float32 outputs, as accelerate prepares it.

        Training a second model is not something trainwright's run does: `evaluation_mode=False`
        over several processes (where accelerate would wrap it in DDP) is refused."""
        if model in self._trained:
            return model  # the trained model: the run's engine wraps it when train() starts
        if not evaluation_mode and self._runtime.distributed:
            raise NotImplementedError(
                f"trainer.accelerator.prepare_model({type(model).__name__}) for training over "
                f"{self._runtime.world_size} processes: trainwright's engine wraps only the Trainer's "
                "model. Pass evaluation_mode=True for a frozen model, or train this model in a Trainer of its own."
            )
        if device_placement is not False and not _spread_over_devices(model):
            model = model.to(self.device)
        dtype = _autocast_dtype(self._args)
        if dtype is not None and "_original_forward" not in model.__dict__:
            model._original_forward = model.forward  # type: ignore[assignment]
            model.forward = _fp32_outputs(self._runtime, dtype, model.forward)  # type: ignore[method-assign]
        return model

    def prepare(self, *objects: Any, device_placement: list[bool] | None = None) -> Any:
        """Models through `prepare_model`, data loaders through `prepare_data_loader`. Anything else
        is refused naming it."""
        places = device_placement if device_placement is not None else [None] * len(objects)
        if len(places) != len(objects):
            raise ValueError(
                f"trainer.accelerator.prepare: device_placement has {len(places)} entries for {len(objects)} objects"
            )
        prepared = [self._prepare_one(obj, place) for obj, place in zip(objects, places)]
        return prepared[0] if len(prepared) == 1 else tuple(prepared)

    def _prepare_one(self, obj: Any, device_placement: bool | None) -> Any:
        if isinstance(obj, nn.Module):
            return self.prepare_model(obj, device_placement=device_placement)
        if isinstance(obj, torch.utils.data.DataLoader):
            return self.prepare_data_loader(obj, device_placement=device_placement)
        raise NotImplementedError(
            f"trainer.accelerator.prepare({type(obj).__name__}): trainwright prepares models and data loaders; "
            "its Trainer builds its own optimizer and schedule."
        )

    def prepare_data_loader(
        self, data_loader: torch.utils.data.DataLoader, device_placement: bool | None = None
    ) -> Any:
        """A library's own loader as accelerate prepares it (`data/prepared.py`): this process's
        batches (a batch sampler's dealt over the processes, an iterable dataset's dispatched from
        process 0, as `accelerator_config` and `even_batches` say), a seedable sampler's order a
        function of the seed and the epoch, on this process's device unless `device_placement=False`."""
        device = None if device_placement is False else self.device
        prepared = prepare_loader(
            data_loader, self._args, self._runtime, device, self.even_batches, self._args.data_seed
        )
        self._loaders.add(prepared)
        return prepared

    def autocast(self, autocast_handler: Any = None) -> contextlib.AbstractContextManager:
        """The arguments' mixed precision (bf16 / fp16 autocast on this device), else nothing."""
        if autocast_handler is not None:
            raise NotImplementedError(
                "trainer.accelerator.autocast(autocast_handler=...): trainwright autocasts as `bf16` / `fp16` say."
            )
        return self._runtime.autocast(_autocast_dtype(self._args))

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """The run's backward (fp16 scaling, DeepSpeed's engine), or `loss.backward()` outside train()."""
        run = self._run
        if run is not None:  # train() is running
            if kwargs:
                raise NotImplementedError(
                    f"trainer.accelerator.backward(loss, {', '.join(kwargs)}=...) during train()"
                )
            run.engine.backward(loss)
        else:
            loss.backward(**kwargs)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    # -- the rest of accelerate's everyday surface ---------------------------------------------------
    def print(self, *args: Any, **kwargs: Any) -> None:
        if self._runtime.is_local_main_process:
            print(*args, **kwargs)

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        with self._runtime.main_process_first(local=False):
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        with self._runtime.main_process_first(local=True):
            yield

    def free_memory(self, *objects: Any) -> list[None]:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return [None for _ in objects]

    def end_training(self) -> None:
        self._runtime.shutdown()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"trainer.accelerator.{name}: trainwright runs on its own runtime, not accelerate; its "
            f"accelerator answers {_ANSWERS}."
        )


def _autocast_dtype(args: Any) -> torch.dtype | None:
    return torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None


def _spread_over_devices(model: nn.Module) -> bool:
    device_map = getattr(model, "hf_device_map", None)
    return isinstance(device_map, Mapping) and len(set(device_map.values())) > 1


def _fp32_outputs(runtime: Any, dtype: torch.dtype, forward: Any) -> Any:
    """`forward` under autocast to `dtype`, its half-precision outputs returned as float32 (accelerate's
    `convert_outputs_to_fp32`)."""

    @functools.wraps(forward)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with runtime.autocast(dtype):
            out = forward(*args, **kwargs)
        return collectives.to_float32(out)

    return wrapped
