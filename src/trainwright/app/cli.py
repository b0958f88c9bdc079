"""Command line: `trainwright demo`, `trainwright train CONFIG [--flags]`, `trainwright plot DIR`,
`trainwright run SCRIPT.py [ARGS]` (a script of its own: its errors and exit code are the script's).

A user's mistake (a bad field or value, a missing file or package, a checkpoint that cannot be
resumed) prints one line, `trainwright <command>: error: ...`, and exits 2, as argparse does; anything
else is a bug and keeps its traceback (exit 1). `trainwright --debug <command>` prints the traceback
of a mistake too, above its line, and still exits 2. `--debug` may also follow the command
(`trainwright train --debug run.yaml`); there, followed by one of TrainingArguments' `debug` options
(`--debug underflow_overflow`), it is that field. Under torchrun (several processes) errors go to
torchrun's report as they are.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence

USAGE = """usage: trainwright [--debug] <command> [options]   |   trainwright --version

commands:
  demo [--output_dir DIR] [--max_steps N]   train a small GPT on text that ships with Python
       [--framework tf]                     ... or a small Keras model with TFTrainer (extra `tf`)
  train CONFIG.yaml|json [--KEY VALUE ...]  train a model from a config and local files
                                            (trainwright train --help: the config keys)
  plot OUTPUT_DIR                           draw loss, eval metrics, learning rate, throughput
  run SCRIPT.py [ARGS ...]                  run a transformers / TRL script unchanged, on
                                            trainwright (also `run -m MODULE`; under torchrun too)

--debug: show the traceback of an error too (a mistake in the input prints one line without it, and
         exits 2 either way); also after demo / train / plot, where `--debug underflow_overflow`
         (or tpu_metrics_debug) is TrainingArguments' debug field instead
"""

# What a user's input causes: a value or field (ValueError, argparse's checks), a file or folder
# (FileNotFoundError, PermissionError, ...), a missing optional package (ImportError naming the extra).
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, ImportError)


def _demo(rest: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="trainwright demo")
    parser.add_argument("--output_dir", default="trainwright_demo")
    parser.add_argument("--max_steps", type=int, default=None, help="default: 600 (torch), 400 (tf)")
    parser.add_argument("--framework", choices=("torch", "tf"), default="torch")
    ns = parser.parse_args(rest)
    if ns.framework == "tf":  # TFTrainer on a small Keras model (needs the `tf` extra)
        from trainwright.tf.demo import run_tf_demo

        run_tf_demo(output_dir=ns.output_dir, max_steps=ns.max_steps or 400)
        return 0
    from trainwright.app.demo import run_demo

    run_demo(output_dir=ns.output_dir, max_steps=ns.max_steps or 600)
    return 0


def _train(rest: list[str]) -> int:
    from trainwright.app.train_script import run_train

    run_train(rest)
    return 0


def _plot(rest: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="trainwright plot")
    parser.add_argument("output_dir")
    ns = parser.parse_args(rest)
    from trainwright.app.plot import plot_run

    for path in plot_run(ns.output_dir):
        print(path)
    return 0


COMMANDS: dict[str, Callable[[list[str]], int]] = {"demo": _demo, "train": _train, "plot": _plot}


def is_user_error(exc: BaseException) -> bool:
    """Whether `exc` comes from the user's input (see USER_ERRORS) or a checkpoint that cannot be used."""
    if isinstance(exc, USER_ERRORS):
        return True
    from trainwright.checkpoint.files import CheckpointError
    from trainwright.core.output_lock import OutputDirError

    return isinstance(exc, (CheckpointError, OutputDirError))


def _debug_flag(argv: list[str]) -> tuple[bool, list[str]]:
    """trainwright's own `--debug`, and the command line without it: before the command, or after
    demo / train / plot where it is not TrainingArguments' `debug` (`--debug underflow_overflow`).
    After `run` everything is the script's."""
    debug = bool(argv) and argv[0] == "--debug"
    if debug:
        argv = argv[1:]
    if not argv or argv[0] not in COMMANDS:
        return debug, argv
    from trainwright.core.enums import DebugOption

    options = {o.value for o in DebugOption}
    rest = [argv[0]]
    for i, token in enumerate(argv[1:], 1):
        if token == "--":
            rest += argv[i:]
            break
        following = argv[i + 1].split() if i + 1 < len(argv) else []
        if token == "--debug" and not (following and following[0] in options):
            debug = True
        else:
            rest.append(token)
    return debug, rest


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug, argv = _debug_flag(argv)
    if argv and argv[0] in ("--version", "-V"):
        from trainwright.core.version import __version__

        print(f"trainwright {__version__}")
        return 0
    if argv and argv[0] == "run":  # the script's own logging, errors and exit code, as under python
        from trainwright.app.run_script import run_script

        return run_script(argv[1:])
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("trainwright").setLevel(logging.INFO)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    run = COMMANDS.get(command)
    if run is None:
        print(f"trainwright: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    try:
        return run(rest)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"trainwright {command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        several_processes = int(os.environ.get("WORLD_SIZE", "1") or 1) > 1
        if several_processes or not is_user_error(exc):
            raise
        if debug:  # the traceback as well; a mistake in the input still exits 2
            traceback.print_exc()
        print(f"trainwright {command}: error: {exc or type(exc).__name__}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
