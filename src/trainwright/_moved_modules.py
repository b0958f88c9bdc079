"""Old module paths (before the layered packages) keep working for one release, with a warning.

`trainwright.trainer` is now `trainwright.loop.trainer`, and so on. Importing an old path returns
the new module itself (so `mock.patch("trainwright.trainer.x")` patches the real one) and warns with
a `DeprecationWarning` naming the new path. `trainwright.args`, `.data`, `.optim` and `.checkpoint`
are packages now that re-export what the old modules held, so they need no alias.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED: dict[str, str] = {
    "trainwright.accelerator_config": "trainwright.args.accelerator_config",
    "trainwright.accelerator_facade": "trainwright.distributed.accelerator",
    "trainwright.argparser": "trainwright.args.parser",
    "trainwright.batch_size_finder": "trainwright.loop.batch_size_finder",
    "trainwright.checkpoint_io": "trainwright.checkpoint",  # its names are split over files/weights now
    "trainwright.cli": "trainwright.app.cli",
    "trainwright.debug_underflow": "trainwright.modeling.debug_underflow",
    "trainwright.deepspeed_engine": "trainwright.distributed.deepspeed",
    "trainwright.demo": "trainwright.app.demo",
    "trainwright.device_cache": "trainwright.distributed.device_cache",
    "trainwright.enums": "trainwright.core.enums",
    "trainwright.evaluation": "trainwright.loop.eval.gather",
    "trainwright.events": "trainwright.core.events",
    "trainwright.flops": "trainwright.observe.flops",
    "trainwright.fsdp": "trainwright.distributed.fsdp",
    "trainwright.hpo": "trainwright.loop.search.hpo",
    "trainwright.hub": "trainwright.loop.hub.push",
    "trainwright.liger": "trainwright.modeling.liger",
    "trainwright.loss": "trainwright.modeling.loss",
    "trainwright.memory": "trainwright.observe.memory",
    "trainwright.metrics": "trainwright.observe.metrics",
    "trainwright.model_card": "trainwright.loop.hub.model_card",
    "trainwright.neftune": "trainwright.modeling.neftune",
    "trainwright.optim_extra": "trainwright.optim.extra",
    "trainwright.output_lock": "trainwright.core.output_lock",
    "trainwright.checkpoint.output_lock": "trainwright.core.output_lock",
    "trainwright.past_state": "trainwright.modeling.past_state",
    "trainwright.plot": "trainwright.app.plot",
    "trainwright.preemption": "trainwright.core.preemption",
    "trainwright.rng": "trainwright.checkpoint.rng",
    "trainwright.runtime": "trainwright.core.runtime",
    "trainwright.distributed.runtime": "trainwright.core.runtime",
    "trainwright.schedules": "trainwright.optim.schedules",
    "trainwright.seed": "trainwright.core.seed",
    "trainwright.seq2seq": "trainwright.loop.seq2seq",
    "trainwright.state": "trainwright.core.state",
    "trainwright.third_party": "trainwright.core.third_party",
    "trainwright.tinygpt": "trainwright.app.tinygpt",
    "trainwright.train_script": "trainwright.app.train_script",
    "trainwright.trainer": "trainwright.loop.trainer",
    "trainwright.training_checkpoint": "trainwright.loop.checkpoint_parts",
    "trainwright.loop.checkpointing": "trainwright.loop.checkpoint_parts",
    "trainwright.loop.async_saves": "trainwright.loop.checkpointer",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; the old path will be removed in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(new)
        self._real_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system set the alias's spec on the real module: give it its own back.
        module.__spec__ = self._real_spec


def install() -> None:
    """Put the finder on `sys.meta_path` once."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
