"""`past_index` (transformers v4): feed a model's recurrent memory back to it as `mems`.

Models like Transformer-XL and XLNet return their memory among their outputs; with
`past_index >= 0` the output at that index is given back as the `mems` input of the next batch. As
in transformers v4 the memory starts empty at each epoch and at each evaluation/prediction; in a
prediction without labels the model returns no loss before its other outputs, so the memory is
read at `past_index - 1`, as v4 did. An evaluation during training uses its own
memory and leaves the training memory as it was (v4 deleted it, which failed the next step).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class PastState:
    """The memory carried from one batch to the next."""

    def __init__(self, index: int):
        self.index = index
        self.past: Any = None

    def reset(self) -> None:
        self.past = None

    def feed(self, inputs: Any) -> Any:
        """`inputs` with the last memory as `mems` (unchanged while there is none)."""
        if self.past is None:
            return inputs
        if not isinstance(inputs, Mapping):
            raise ValueError(f"past_index={self.index}: batches must be mappings to receive `mems`.")
        return {**inputs, "mems": self.past}

    def keep(self, outputs: Any, without_loss: bool = False) -> None:
        """Remember `outputs[past_index]` (`past_index - 1` when the outputs have no loss)."""
        index = self.index - 1 if without_loss else self.index
        if hasattr(outputs, "to_tuple"):  # ModelOutput: indexed like its tuple (None fields dropped)
            values = outputs.to_tuple()
        elif isinstance(outputs, dict):
            values = tuple(outputs.values())
        else:
            values = outputs
        if not isinstance(values, (tuple, list)) or not -len(values) <= index < len(values):
            raise ValueError(
                f"past_index={self.index}: the model returned {type(outputs).__name__} with "
                f"{len(values) if isinstance(values, (tuple, list)) else 'no indexable'} outputs, "
                f"so there is no memory at index {index}."
            )
        self.past = values[index]

    def swap(self, past: Any = None) -> Any:
        """Replace the memory, returning the old one (an evaluation's own memory)."""
        old, self.past = self.past, past
        return old
