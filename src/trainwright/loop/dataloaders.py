"""Building the Trainer's data loaders: columns the model does not take removed (from a
`datasets.Dataset` up front, else by the collator), trainwright's resumable samplers, worker seeds
fixed by (seed, epoch).

The Trainer's `get_train_dataloader` / `get_eval_dataloader` / `get_test_dataloader` call in here;
the steps they are made of go through the Trainer's own methods (`_remove_unused_columns`,
`_get_train_sampler`, `_get_eval_sampler`, `_get_collator_with_removed_columns`), so a subclass
that overrides one of them is used. The trainer is seen through `DataTrainer`, so this module never
imports the loop's trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from trainwright import data as data_utils
from trainwright.args.training_args import TrainingArguments
from trainwright.data import packing


class DataTrainer(Protocol):
    """What building the data loaders reads of the Trainer."""

    args: TrainingArguments
    runtime: Any
    state: Any
    train_dataset: Any
    eval_dataset: Any
    data_collator: Callable
    accelerator: Any
    _eval_dataloaders: dict[str, Any]  # persistent workers: the kept evaluation loaders, by key
    _eval_dataloader_datasets: dict[str, Any]  # the dataset each kept loader was built from

    def _remove_unused_columns(self, *args: Any, **kwargs: Any) -> Any: ...
    def _get_collator_with_removed_columns(self, *args: Any, **kwargs: Any) -> Any: ...
    def _get_train_sampler(self, *args: Any, **kwargs: Any) -> Any: ...
    def _get_eval_sampler(self, *args: Any, **kwargs: Any) -> Any: ...


def resumed_dataloader(dataloader: Any, num_batches: int) -> Any:
    """`dataloader` past its first `num_batches` batches: a resumable sampler starts after them (none
    is loaded); a loader prepared by accelerate continues its epoch; any other is iterated past them."""
    sampler: Any = getattr(dataloader, "sampler", None)
    batch_size = getattr(dataloader, "batch_size", None)
    if hasattr(sampler, "set_start") and batch_size:
        sampler.set_start(min(num_batches * batch_size, len(sampler)))
        return dataloader
    if callable(continue_epoch := getattr(dataloader, "continue_epoch", None)):
        return continue_epoch(num_batches)
    return data_utils.skip_iterable(dataloader, num_batches)


def is_hf_dataset(dataset: Any) -> bool:
    """A `datasets.Dataset` (its columns can be removed up front), told without importing `datasets`."""
    return type(dataset).__module__.startswith("datasets.") and hasattr(dataset, "column_names")


def collator_for(trainer: DataTrainer, dataset: Any, description: str) -> Callable:
    """The trainer's collator, behind a filter of the keys the model does not take unless the
    columns were removed from the dataset itself."""
    collator = packing.run_collator(trainer.args, trainer.data_collator, getattr(trainer, "model", None))
    if is_hf_dataset(dataset):
        return collator  # columns were removed from the dataset itself
    return trainer._get_collator_with_removed_columns(collator, description)


def train_dataloader(trainer: DataTrainer) -> torch.utils.data.DataLoader:
    """Training dataloader: resumable sampler, worker seeds fixed by (seed, epoch)."""
    if trainer.train_dataset is None:
        raise ValueError("Trainer: training requires a train_dataset.")
    batch_size = trainer.args.per_device_train_batch_size
    return get_dataloader(
        trainer, trainer.train_dataset, "training", batch_size, trainer._get_train_sampler, True
    )


def get_dataloader(
    trainer: DataTrainer,
    dataset: Any,
    description: str,
    batch_size: int,
    sampler_fn: Callable[[Any], Any] | None = None,
    is_training: bool = False,
    dataloader_key: str | None = None,
) -> Any:
    """upstream's `_get_dataloader`: `dataset` without the columns the model does not take, batches
    of `batch_size` drawn by `sampler_fn(dataset)` (none for an iterable dataset), dealt to this
    process; training loaders drop the last batch as `dataloader_drop_last` says and seed their
    workers by `data_seed`; with `dataloader_key` and persistent workers, kept for reuse."""
    args = trainer.args
    dataset = trainer._remove_unused_columns(dataset, description=description)
    iterable = isinstance(dataset, torch.utils.data.IterableDataset)
    sampler = sampler_fn(dataset) if sampler_fn is not None and not iterable else None
    seed = args.data_seed if is_training and args.data_seed is not None else args.seed
    drop_last = args.dataloader_drop_last if is_training else False
    loader = _loader(trainer, dataset, batch_size, sampler, description, drop_last, seed, train=is_training)
    if dataloader_key is not None and args.dataloader_persistent_workers:
        trainer._eval_dataloaders[dataloader_key] = loader
    return loader


def _loader(
    trainer: DataTrainer,
    dataset: Any,
    batch_size: int,
    sampler: Any,
    description: str,
    drop_last: bool,
    seed: int,
    train: bool = False,
) -> Any:
    """The DataLoader of `dataset` as `accelerator_config`'s data settings deal it to this process
    (`data.distribute`): its own slice of each global batch, or process 0's batches dispatched."""
    dealing = data_utils.DataDealing.of(dataset, trainer.args, trainer.runtime)
    # a subclass's own sampler (TRL's RepeatSampler) knows nothing of the processes: its batches are
    # dealt as accelerate deals a prepared loader's, whole batches in turn
    foreign = dealing.world > 1 and not dealing.dispatch and sampler is not None
    foreign = foreign and not isinstance(sampler, data_utils.ResumableSampler)
    if train:
        dealing.check_same_steps(sampler, batch_size)
    loader = data_utils.make_dataloader(
        dealing.dataset(dataset, dealing.loader_batch(batch_size), drop_last, train),
        batch_size=batch_size if foreign else dealing.loader_batch(batch_size),
        sampler=sampler,
        collate_fn=collator_for(trainer, dataset, description),
        args=trainer.args,
        drop_last=drop_last,
        seed=seed,
    )
    if foreign:
        return trainer.accelerator.prepare_data_loader(loader)
    return dealing.wrap(loader, trainer.runtime, drop_last)


def eval_dataset_of(trainer: DataTrainer, eval_dataset: Any) -> Any:
    """The dataset to evaluate: `eval_dataset`, a name of one of the trainer's, or the trainer's."""
    if isinstance(eval_dataset, str):
        if not isinstance(trainer.eval_dataset, dict) or eval_dataset not in trainer.eval_dataset:
            raise ValueError(f"No eval dataset named {eval_dataset!r}.")
        eval_dataset = trainer.eval_dataset[eval_dataset]
    dataset = eval_dataset if eval_dataset is not None else trainer.eval_dataset
    if dataset is None:
        raise ValueError("Trainer: evaluation requires an eval_dataset.")
    if isinstance(dataset, dict):
        raise ValueError(
            f"eval_dataset is a dict of datasets {sorted(dataset)}: name one, get_eval_dataloader(name) "
            "(evaluate() runs them all)."
        )
    return dataset


def inference_dataloader(trainer: DataTrainer, dataset: Any, description: str) -> torch.utils.data.DataLoader:
    """Evaluation or test dataloader: dataset order, dealt across processes, nothing dropped."""
    batch_size = trainer.args.per_device_eval_batch_size
    return get_dataloader(trainer, dataset, description, batch_size, trainer._get_eval_sampler)


def eval_dataloader(trainer: DataTrainer, eval_dataset: Any) -> torch.utils.data.DataLoader:
    """`get_eval_dataloader`: with `dataloader_persistent_workers`, one loader per evaluation
    dataset, kept for later evaluations so its workers start once (upstream's `_eval_dataloaders`,
    keyed by the dataset's name, "eval" for the trainer's single one or a dataset passed in).

    Upstream returns the kept loader whatever dataset is then passed under that key; here a loader
    is reused only for the same dataset object it was built from, else built anew and kept.
    """
    key = eval_dataset if isinstance(eval_dataset, str) else "eval"
    dataset = eval_dataset_of(trainer, eval_dataset)
    persistent = trainer.args.dataloader_persistent_workers
    loaders, sources = trainer._eval_dataloaders, trainer._eval_dataloader_datasets
    if persistent and key in loaders and sources.get(key) is dataset:
        return loaders[key]
    loader = inference_dataloader(trainer, dataset, "evaluation")
    if persistent:
        loaders[key], sources[key] = loader, dataset
        if hasattr(loader, "started") and _evaluated_before(trainer.state, key):
            loader.started = True  # a resumed run's kept loader: the run it continues iterated it
    return loader


def _evaluated_before(state: Any, key: str) -> bool:
    """Whether the run's log holds an evaluation of the dataset kept under `key` (its runtime row)."""
    runtime = "eval_runtime" if key == "eval" else f"eval_{key}_runtime"
    return any(runtime in row for row in state.log_history)


def num_examples(dataloader: Any, fallback_batch_size: int) -> int:
    """Samples in the dataloader's dataset; else batches x batch size (the loader's, else
    `fallback_batch_size`), for a loader without `.dataset` or `.batch_size`."""
    try:
        return data_utils.num_examples(dataloader)
    except ValueError:
        if not data_utils.has_length(dataloader):
            raise
        return len(dataloader) * fallback_batch_size
