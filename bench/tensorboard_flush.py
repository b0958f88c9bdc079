"""Is `SummaryWriter.flush()` a barrier? tensorboardX's against the one trainwright uses.

The TensorBoard reporter flushes after every `on_log`, so a scalar logged is on disk when the call
returns (a run killed after it, or TensorBoard reading the folder, sees it). This writes two scalars,
flushes, and reads the folder back with TensorBoard's own reader, N times per writer.

    .venv/bin/python bench/tensorboard_flush.py [--tries 200]

Measured (2026-11-29, tensorboardX 2.6.5, tensorboard 2.21.0): tensorboardX 200 of 200 reads miss the
second scalar (its flush() does not wait for its writer thread's queue, which writes every
`flush_secs`, 120 s); trainwright's writer (`torch.utils.tensorboard` with TensorBoard's TF-compat
module bound to its stub) 0 of 200. Why the reporter does not use tensorboardX: docs/design.md.
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any


def misses(make_writer: Any, tries: int) -> int:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    missed = 0
    for _ in range(tries):
        with tempfile.TemporaryDirectory() as folder:
            writer = make_writer(folder)
            writer.add_scalar("first", 1.0, 0)
            writer.add_scalar("second", 2.0, 1)
            writer.flush()
            reader = EventAccumulator(folder)
            reader.Reload()
            missed += "second" not in reader.Tags()["scalars"]
            writer.close()
    return missed


def trainwright_writer(folder: str) -> Any:
    from trainwright.core.third_party import tensorboard_without_tensorflow

    tensorboard_without_tensorflow()
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(folder)


def tensorboardx_writer(folder: str) -> Any:
    from tensorboardX import SummaryWriter

    return SummaryWriter(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=200)
    tries = parser.parse_args().tries
    for name, make in (
        ("trainwright (torch.utils.tensorboard)", trainwright_writer),
        ("tensorboardX", tensorboardx_writer),
    ):
        print(f"{name:40s} scalar missing right after flush(): {misses(make, tries)} of {tries}")


if __name__ == "__main__":
    main()
