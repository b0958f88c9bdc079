"""`trainwright run SCRIPT.py [ARGS...]` (or `run -m MODULE [ARGS...]`, or `run COMMAND [ARGS...]` for a
Python console script on PATH such as `trl`): an unchanged transformers or TRL script, run as
`python SCRIPT.py ARGS...` would run it, on trainwright.

`patch_transformers()` first (so the script's `from transformers import Trainer` and the libraries
it imports get trainwright's classes; the Python processes it starts patch too, `children.py`),
then the script as `__main__`, with `sys.argv` and the
script's folder first on `sys.path` as Python sets them. Its exceptions and exit code are its own,
as under `python`; under `torchrun` every process does the same.
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys

USAGE = (
    "usage: trainwright run SCRIPT.py [ARGS...]  |  trainwright run -m MODULE [ARGS...]  |  "
    "trainwright run COMMAND [ARGS...]  (a Python console script on PATH, e.g. trl)"
)


def run_script(argv: list[str]) -> int:
    """Patch transformers, then run the script (or `-m` module) in `argv` as `__main__`."""
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = argv[0] == "-m"
    target = argv[1] if module else argv[0]
    if not module and not os.path.isfile(target):
        command = _python_command(target)
        if command is None:
            print(f"trainwright run: error: {target}: no such file", file=sys.stderr)
            return 2
        target = argv[0] = command  # a console script (`trainwright run trl sft ...`)
    from trainwright.app.children import reach_children
    from trainwright.app.patch import patch_transformers

    patch_transformers()
    reach_children()  # the processes the script starts (a launcher, a spawned worker) patch too
    if module:
        sys.argv = [target, *argv[2:]]  # runpy sets argv[0] to the module's file
        sys.path.insert(0, os.getcwd())  # python -m puts the working folder first
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *argv[1:]]
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))  # as `python SCRIPT.py` does
        runpy.run_path(target, run_name="__main__")
    return 0


def _python_command(name: str) -> str | None:
    """The file of a Python console script on PATH named `name` (what pip installs for a package's
    command, such as `trl`), else None."""
    if os.sep in name:
        return None
    path = shutil.which(name)
    if path is None:
        return None
    with open(path, "rb") as f:
        first = f.readline()
    return path if first.startswith(b"#!") and b"python" in first else None
