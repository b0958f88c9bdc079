"""`trainwright run` reaches the Python processes the script starts: a `multiprocessing` "spawn"
child and a `subprocess` of the same Python train on trainwright's Trainer too; a Python without
trainwright that imports transformers is refused, naming the interpreter, instead of training on
transformers unnoticed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from kit import library_runs as lr

pytest.importorskip("transformers")

SCRIPT = textwrap.dedent(
    """
    import json, multiprocessing, subprocess, sys

    def child(queue):
        import transformers
        queue.put(transformers.Trainer.__module__)

    if __name__ == "__main__":
        import transformers
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        process = context.Process(target=child, args=(queue,))
        process.start()
        spawned = queue.get()
        process.join()
        code = "import transformers; print(transformers.Trainer.__module__)"
        sub = subprocess.run([sys.argv[1], "-c", code], capture_output=True, text=True)
        print(json.dumps({"parent": transformers.Trainer.__module__, "spawned": spawned,
                          "subprocess": (sub.stdout.strip().splitlines() or [""])[-1], "stderr": sub.stderr[-2000:]}))
    """
)


def _run(tmp_path, python: str) -> dict:
    script = tmp_path / "parent.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-m", "trainwright", "run", str(script), python],
        capture_output=True,
        text=True,
        timeout=600,
        env=lr.env(),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_spawned_and_started_processes_train_on_trainwright(tmp_path):
    seen = _run(tmp_path, sys.executable)
    assert seen["parent"] == seen["spawned"] == seen["subprocess"] == "trainwright.loop.trainer", seen


def test_a_python_without_trainwright_is_refused_when_it_imports_transformers(tmp_path):
    base = getattr(sys, "_base_executable", None) or shutil.which("python3")
    probe = subprocess.run([base, "-c", "import trainwright"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip(f"{base} has trainwright installed")
    seen = _run(tmp_path, base)
    assert seen["subprocess"] == ""
    assert "was started under `trainwright run`, but trainwright is not installed" in seen["stderr"]
    assert os.path.basename(base) in seen["stderr"]
