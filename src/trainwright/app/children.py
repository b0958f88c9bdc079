"""The patch in every Python process a `trainwright run` starts.

`trainwright run` patches its own process; a script may start others that train: TRL's `trl sft`
re-launches itself through `accelerate launch`, a `multiprocessing` "spawn" child imports the script
again, a launcher runs `python train.py`. Each would import transformers' own Trainer and train on
it without a word. So the run puts `startup/` (a `sitecustomize` module) first on `PYTHONPATH` and
sets `TRAINWRIGHT_PATCH_TRANSFORMERS=1`: every Python process started below it, at interpreter
start-up, arranges for `patch_transformers()` to run the moment transformers is first imported
(nothing is imported before that, so a child that never imports transformers pays nothing).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from typing import Any

from trainwright.core.import_hooks import spec_from_other_finders

PATCH_ENV = "TRAINWRIGHT_PATCH_TRANSFORMERS"
STARTUP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup")


def reach_children() -> None:
    """Make the processes this one starts patch transformers too (see the module docstring)."""
    os.environ[PATCH_ENV] = "1"
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != STARTUP_DIR]
    os.environ["PYTHONPATH"] = os.pathsep.join([STARTUP_DIR, *paths])


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: each spec the other finders give for `transformers` gets a loader that
    runs `patch_transformers()` as soon as the package has executed; the finder then steps aside.
    (Libraries ask `importlib.util.find_spec("transformers")` without importing it, so it stays in
    place until the package really executes.)"""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "transformers":
            return None
        spec = spec_from_other_finders(self, name, path, target)
        if spec is None:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_patch(module: Any) -> None:
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            from trainwright.patch import patch_transformers

            patch_transformers()

        loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


def at_startup() -> None:
    """Called by `startup/sitecustomize.py` in a process started under `trainwright run`."""
    if os.environ.get(PATCH_ENV) != "1":
        return
    if "transformers" in sys.modules:  # imported already (by another site hook): patch now
        from trainwright.patch import patch_transformers

        patch_transformers()
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
