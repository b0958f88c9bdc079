"""Building the Trainer's data loaders: columns the model does not take removed (from a
`datasets.Dataset` up front, else by the collator), trainwright's resumable samplers, worker seeds
fixed by (seed, epoch).

The Trainer's `get_train_dataloader` / `get_eval_dataloader` / `get_test_dataloader` /
`_get_dataloader` build a `Loaders` from the values they read and its upstream hooks bound
(`_remove_unused_columns`, `_get_collator_with_removed_columns`, `_get_eval_sampler`), so a subclass
that overrides one of them is used; nothing here holds or names the Trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainwright import data as data_utils
from trainwright.args.training_args import TrainingArguments
from trainwright.core.runtime import Runtime
from trainwright.data import packing


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


@dataclass(frozen=True)
class Loaders:
    """The Trainer's loader building, from what it reads of the Trainer at the call: values, and the
    upstream hooks it calls, bound (a subclass's overrides run)."""

    args: TrainingArguments
    runtime: Runtime
    data_collator: Callable
    model: Any
    remove_columns: Callable[..., Any]  # _remove_unused_columns(dataset, description=...)
    collator_filter: Callable[[Callable, str], Callable]  # _get_collator_with_removed_columns
    eval_sampler: Callable[[Any], Any]  # _get_eval_sampler
    prepare: Callable[[Any], Any]  # accelerator.prepare_data_loader: a foreign sampler's loader dealt
    kept: dict[str, Any]  # upstream's `_eval_dataloaders`: persistent workers' loaders, by key

    def collator_for(self, dataset: Any, description: str) -> Callable:
        """The trainer's collator, behind a filter of the keys the model does not take unless the
        columns were removed from the dataset itself."""
        collator = packing.run_collator(self.args, self.data_collator, self.model)
        if is_hf_dataset(dataset):
            return collator  # columns were removed from the dataset itself
        return self.collator_filter(collator, description)

    def get(
        self,
        dataset: Any,
        description: str,
        batch_size: int,
        sampler_fn: Callable[[Any], Any] | None = None,
        is_training: bool = False,
        dataloader_key: str | None = None,
    ) -> Any:
        """upstream's `_get_dataloader`: `dataset` without the columns the model does not take,
        batches of `batch_size` drawn by `sampler_fn(dataset)` (none for an iterable dataset), dealt
        to this process; training loaders drop the last batch as `dataloader_drop_last` says and seed
        their workers by `data_seed`; with `dataloader_key` and persistent workers, kept for reuse."""
        args = self.args
        dataset = self.remove_columns(dataset, description=description)
        iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        sampler = sampler_fn(dataset) if sampler_fn is not None and not iterable else None
        seed = args.data_seed if is_training and args.data_seed is not None else args.seed
        drop_last = args.dataloader_drop_last if is_training else False
        loader = self._loader(dataset, batch_size, sampler, description, drop_last, seed, train=is_training)
        if dataloader_key is not None and args.dataloader_persistent_workers:
            self.kept[dataloader_key] = loader
        return loader

    def _loader(
        self,
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
        dealing = data_utils.DataDealing.of(dataset, self.args, self.runtime)
        # a subclass's own sampler (TRL's RepeatSampler) knows nothing of the processes: its batches
        # are dealt as accelerate deals a prepared loader's, whole batches in turn
        foreign = dealing.world > 1 and not dealing.dispatch and sampler is not None
        foreign = foreign and not isinstance(sampler, data_utils.ResumableSampler)
        if train:
            dealing.check_same_steps(sampler, batch_size)
        loader = data_utils.make_dataloader(
            dealing.dataset(dataset, dealing.loader_batch(batch_size), drop_last, train),
            batch_size=batch_size if foreign else dealing.loader_batch(batch_size),
            sampler=sampler,
            collate_fn=self.collator_for(dataset, description),
            args=self.args,
            drop_last=drop_last,
            seed=seed,
        )
        if foreign:
            return self.prepare(loader)
        return dealing.wrap(loader, self.runtime, drop_last)

    def inference(self, dataset: Any, description: str) -> torch.utils.data.DataLoader:
        """Evaluation or test dataloader: dataset order, dealt across processes, nothing dropped."""
        return self.get(dataset, description, self.args.per_device_eval_batch_size, self.eval_sampler)

    def evaluation(
        self, datasets: Any, eval_dataset: Any, sources: dict[str, Any], log_history: list[dict]
    ) -> torch.utils.data.DataLoader:
        """`get_eval_dataloader` (`datasets`: the trainer's `eval_dataset`): with
        `dataloader_persistent_workers`, one loader per evaluation dataset, kept for later
        evaluations so its workers start once (upstream's `_eval_dataloaders`, keyed by the
        dataset's name, "eval" for the trainer's single one or a dataset passed in; `sources`: the
        dataset each kept loader was built from).

        Upstream returns the kept loader whatever dataset is then passed under that key; here a loader
        is reused only for the same dataset object it was built from, else built anew and kept.
        """
        key = eval_dataset if isinstance(eval_dataset, str) else "eval"
        dataset = eval_dataset_of(datasets, eval_dataset)
        persistent, loaders = self.args.dataloader_persistent_workers, self.kept
        if persistent and key in loaders and sources.get(key) is dataset:
            return loaders[key]
        loader = self.inference(dataset, "evaluation")
        if persistent:
            loaders[key], sources[key] = loader, dataset
            if hasattr(loader, "started") and _evaluated_before(log_history, key):
                loader.started = True  # a resumed run's kept loader: the run it continues iterated it
        return loader


def eval_dataset_of(datasets: Any, eval_dataset: Any) -> Any:
    """The dataset to evaluate: `eval_dataset`, a name of one of the trainer's (`datasets`), or the
    trainer's."""
    if isinstance(eval_dataset, str):
        if not isinstance(datasets, dict) or eval_dataset not in datasets:
            raise ValueError(f"No eval dataset named {eval_dataset!r}.")
        eval_dataset = datasets[eval_dataset]
    dataset = eval_dataset if eval_dataset is not None else datasets
    if dataset is None:
        raise ValueError("Trainer: evaluation requires an eval_dataset.")
    if isinstance(dataset, dict):
        raise ValueError(
            f"eval_dataset is a dict of datasets {sorted(dataset)}: name one, get_eval_dataloader(name) "
            "(evaluate() runs them all)."
        )
    return dataset


def _evaluated_before(log_history: list[dict], key: str) -> bool:
    """Whether the run's log holds an evaluation of the dataset kept under `key` (its runtime row)."""
    runtime = "eval_runtime" if key == "eval" else f"eval_{key}_runtime"
    return any(runtime in row for row in log_history)


def num_examples(dataloader: Any, fallback_batch_size: int) -> int:
    """Samples in the dataloader's dataset; else batches x batch size (the loader's, else
    `fallback_batch_size`), for a loader without `.dataset` or `.batch_size`."""
    try:
        return data_utils.num_examples(dataloader)
    except ValueError:
        if not data_utils.has_length(dataloader):
            raise
        return len(dataloader) * fallback_batch_size
