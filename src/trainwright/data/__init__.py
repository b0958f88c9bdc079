"""Data for exact resume, one concern per module: resumable samplers (`samplers`), epoch-seeded
data loaders and the resume of data without a sampler (`loaders`), collators (`collators`), column
removal (`columns`), batch geometry (`items`); `kinds` says what a dataset is.

Two rules shape it:

- **Order is a function of (seed, epoch).** A sampler draws its permutation from a private
  ``torch.Generator`` seeded with ``seed + epoch``; it never touches the global RNG. Resuming in
  epoch ``e`` at position ``k`` is ``set_epoch(e)`` + ``set_start(k)``: the sampler slices its
  index list, so no skipped sample is ever loaded or collated.
- **Randomness inside data loading is a function of the batch's place.** See
  :class:`EpochSeededDataLoader` for what is guaranteed with and without worker processes.
"""

from trainwright.data.collators import PaddingCollator, default_data_collator, pad_sequence_collator
from trainwright.data.columns import RemoveColumnsCollator, forward_arg_names, remove_unused_columns
from trainwright.data.distribute import DataDealing, DispatchingLoader, IterableShard
from trainwright.data.items import num_examples, sampler_geometry
from trainwright.data.kinds import IGNORE_INDEX, has_length, is_iterable_dataset
from trainwright.data.loaders import (
    EpochSeededDataLoader,
    iterable_resume_state,
    iterate_epoch,
    load_iterable_resume_state,
    make_dataloader,
    skip_iterable,
)
from trainwright.data.samplers import LengthGroupedSampler, ResumableSampler, build_sampler

# Moved next to the loss (modeling/loss.py); still importable from here for one release.
from trainwright.modeling.loss import count_items, is_causal_lm

__all__ = [
    "IGNORE_INDEX",
    "DataDealing",
    "DispatchingLoader",
    "IterableShard",
    "EpochSeededDataLoader",
    "LengthGroupedSampler",
    "PaddingCollator",
    "RemoveColumnsCollator",
    "ResumableSampler",
    "build_sampler",
    "count_items",
    "default_data_collator",
    "forward_arg_names",
    "has_length",
    "is_causal_lm",
    "is_iterable_dataset",
    "iterable_resume_state",
    "load_iterable_resume_state",
    "make_dataloader",
    "num_examples",
    "pad_sequence_collator",
    "remove_unused_columns",
    "sampler_geometry",
    "iterate_epoch",
    "skip_iterable",
]
