"""`trainwright run SCRIPT.py [ARGS...]` (or `run -m MODULE [ARGS...]`, `run DIR` holding a `__main__.py`,
or `run COMMAND [ARGS...]` for a Python console script on PATH such as `trl`): an unchanged
transformers or TRL script, run as `python SCRIPT.py ARGS...` would run it, on trainwright.

`patch_transformers()` first (so the script's `from transformers import Trainer` and the libraries
it imports get trainwright's classes; the Python processes it starts patch too, `children.py`),
then the script as `__main__` exactly as Python runs it: `sys.argv`, `__file__` (absolute), the
first entry of `sys.path` (the script's folder, the working folder for `-m`, the folder itself for
`DIR`; where Python had put trainwright's own, the entry for its own start), `__name__`, `__spec__`,
the script's exceptions (their tracebacks start in the script, as Python prints them: no frame of
ours) and exit code. Under `torchrun` every process does the same.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import importlib.util
import io
import marshal
import os
import pkgutil
import runpy
import shutil
import sys
import types
from collections.abc import Callable
from typing import Any

USAGE = (
    "usage: trainwright run SCRIPT.py [ARGS...]  |  trainwright run -m MODULE [ARGS...]  |  "
    "trainwright run DIR [ARGS...]  |  trainwright run COMMAND [ARGS...]  (a Python console script on "
    "PATH, e.g. trl)"
)


def run_script(argv: list[str]) -> int:
    """Patch transformers, then run the script (folder, or `-m` module) in `argv` as `__main__`."""
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    if argv[0] == "-m":
        return _run(lambda: _module(argv[1], argv[2:]))
    target = argv[0]
    if not os.path.exists(target):
        command = _python_command(target)
        if command is None:
            print(f"trainwright run: error: {target}: no such file", file=sys.stderr)
            return 2
        target = command  # a console script (`trainwright run trl sft ...`)
    if pkgutil.get_importer(_absolute(target)) is not None:  # a folder or zip file: its __main__ module
        return _run(lambda: _folder(target, argv[1:]))
    try:
        with io.open_code(_absolute(target)) as f:
            source = f.read()
    except OSError as e:
        print(f"trainwright run: error: {target}: {e.strerror or e}", file=sys.stderr)
        return 2
    return _run(lambda: _file(target, source, argv[1:]))


def _run(start: Callable[[], Callable[[], Any]]) -> int:
    """Set the process up as Python would for the script (`start`), patch, then run what `start`
    returned. Python's own reports: an exception goes on up, and Python prints it as it would
    have, from the script's first frame on; a module or folder that cannot be run is one line."""
    error: type[BaseException] = getattr(runpy, "_Error", ImportError)  # runpy's "No module named ..."
    try:
        run = start()
    except error as e:
        print(f"trainwright run: error: {e}", file=sys.stderr)
        return 1
    from trainwright.app.children import reach_children
    from trainwright.patch import patch_transformers

    patch_transformers()
    reach_children()  # the processes the script starts (a launcher, a spawned worker) patch too
    try:
        run()
    except SystemExit as e:
        if isinstance(e.__context__, error):  # runpy's report of a module it could not run
            print(f"trainwright run: error: {e.__context__}", file=sys.stderr)
            return 1
        raise
    except BaseException as e:
        _report_from_the_script(e)
        raise
    return 0


def _file(target: str, source: bytes, rest: list[str]) -> Callable[[], Any]:
    """`python SCRIPT.py`: argv as given, `__file__` absolute, the script's real folder first."""
    path = _absolute(target)
    _set_path0(os.path.dirname(os.path.realpath(path)))
    sys.argv = [target, *rest]
    main = _new_main()
    compiled = source[:4] == importlib.util.MAGIC_NUMBER  # a .pyc, as Python runs one
    loader_class = (
        importlib.machinery.SourcelessFileLoader if compiled else importlib.machinery.SourceFileLoader
    )
    main.__dict__.update(__file__=path, __cached__=None, __loader__=loader_class("__main__", path))

    def run() -> None:
        # dont_inherit: the script's code is compiled with its own __future__ imports, not ours
        code = marshal.loads(source[16:]) if compiled else compile(source, path, "exec", dont_inherit=True)
        exec(code, main.__dict__)

    return run


def _module(name: str, rest: list[str]) -> Callable[[], Any]:
    """`python -m MODULE`: the working folder first, argv[0] "-m" until runpy sets the module's file."""
    _set_path0(os.getcwd())
    try:
        missing = importlib.util.find_spec(name.partition(".")[0]) is None
    except (ImportError, ValueError):
        missing = False
    if missing:  # said at once, in runpy's words: nothing is imported (nor patched) first
        runpy._get_module_details(name, runpy._Error)  # type: ignore[attr-defined]
    sys.argv = ["-m", *rest]
    _new_main()
    return lambda: runpy._run_module_as_main(name)  # type: ignore[attr-defined]  # what `python -m` calls


def _folder(target: str, rest: list[str]) -> Callable[[], Any]:
    """`python DIR` (or a zip file): the folder first on the path, its `__main__` module run."""
    _set_path0(_absolute(target))
    sys.argv = [target, *rest]
    _new_main()
    return lambda: runpy._run_module_as_main("__main__", alter_argv=False)  # type: ignore[attr-defined]


def _absolute(path: str) -> str:
    """The path as Python makes a script's absolute: joined to the working folder, not normalised."""
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


def _set_path0(entry: str) -> None:
    """`entry` first on `sys.path` in place of the one Python put there for trainwright's own start
    (its console script's folder, or the working folder under `python -m trainwright`); nothing
    under `python -P` / PYTHONSAFEPATH, where Python puts none. (Called while `sys.argv` is still
    trainwright's.)"""
    if sys.flags.safe_path:
        return
    ours = {"", os.getcwd(), os.path.dirname(os.path.realpath(sys.argv[0])) if sys.argv else ""}
    if sys.path and sys.path[0] in ours:
        sys.path[0] = entry
    else:
        sys.path.insert(0, entry)


def _new_main() -> types.ModuleType:
    """A fresh `__main__` module in `sys.modules` (the one Python made holds trainwright's command)."""
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __package__=None, __spec__=None)
    if sys.version_info < (3, 14):  # Python's own `__main__` starts with one there
        main.__dict__["__annotations__"] = {}
    sys.modules["__main__"] = main
    return main


def _report_from_the_script(exc: BaseException) -> None:
    """Make Python's report of `exc`, once it reaches the top, start where the script starts: the
    frames of this module are left out of its traceback (runpy's stay where `python -m` shows them).
    `sys.excepthook` (the script's own, if it set one) is called as Python calls it."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    hook = sys.excepthook

    def report(kind: type[BaseException], value: BaseException, full: Any) -> None:
        sys.excepthook = hook
        if value is exc:
            value.__traceback__, full = tb, tb  # the report prints the exception's own traceback
        hook(kind, value, full)

    sys.excepthook = report


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
