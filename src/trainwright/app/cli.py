"""Command line: `trainwright demo`, `trainwright train CONFIG [--flags]`, `trainwright plot DIR`."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

USAGE = """usage: trainwright <command> [options]

commands:
  demo [--output_dir DIR] [--max_steps N]   train a small GPT on text that ships with Python
       [--framework tf]                     ... or a small Keras model with TFTrainer (extra `tf`)
  train CONFIG.yaml|json [--flag value ...] train a model from a config and local files
  plot OUTPUT_DIR                           draw loss, eval metrics, learning rate, throughput
"""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("trainwright").setLevel(logging.INFO)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "demo":
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
    if command == "train":
        from trainwright.app.train_script import run_train

        run_train(rest)
        return 0
    if command == "plot":
        parser = argparse.ArgumentParser(prog="trainwright plot")
        parser.add_argument("output_dir")
        ns = parser.parse_args(rest)
        from trainwright.app.plot import plot_run

        for path in plot_run(ns.output_dir):
            print(path)
        return 0
    print(f"trainwright: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
