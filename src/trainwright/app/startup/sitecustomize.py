"""Start-up hook of the processes a `trainwright run` starts (on their PYTHONPATH; see
trainwright/app/children.py). Runs the `sitecustomize` it shadows first, if there is one."""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys


def _run_shadowed() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


class _NoTrainwright(importlib.abc.MetaPathFinder):
    """In an interpreter without trainwright, importing transformers would train on it unnoticed."""

    def find_spec(self, name, path=None, target=None):
        if name == "transformers" and os.environ.get("TRAINWRIGHT_PATCH_TRANSFORMERS") == "1":
            raise ImportError(
                f"this process ({sys.executable}) was started under `trainwright run`, but trainwright is "
                "not installed in its Python, so it would train on transformers' own Trainer: install "
                "trainwright in that environment, or start the process from the same Python"
            )
        return None


_run_shadowed()
try:
    from trainwright.app.children import at_startup
except ImportError:
    sys.meta_path.insert(0, _NoTrainwright())
else:
    at_startup()
