"""Crash safety of write_checkpoint: SIGKILL a saving process at many instants (saving in its own thread
or through the async writer), then resume.

A "zygote" subprocess imports torch once and forks one worker per trial (a fresh interpreter per
kill would cost ~2 s each). The worker saves checkpoints; once it is past two ungated saves, every
filesystem operation that changes what a reader sees (mkdir, rename, replace, fsync, unlink, rmdir, open
for writing) and every file its `write_fn` writes first prints `op <label>` and waits for the parent's
"go". The parent kills the worker exactly at a chosen operation, or lets it go on and kills it after a
short delay (in the middle of writing a file). Each trial then checks that the newest checkpoint is
complete and loadable, is not older than the last one the worker reported saved, and that the next
write cleans up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import torch
from checkpoint_kit import hidden_entries

import trainwright.checkpoint as ckpt

# The child's set-up: a model and an optimizer, the line protocol with the parent, gated os calls, and
# the checkpoint's files written each behind a gate.
_ZYGOTE_PREAMBLE = textwrap.dedent(
    """
    import builtins, os, sys, traceback
    import torch

    torch.set_num_threads(1)  # no thread pools: forking below stays safe
    import trainwright.checkpoint as ckpt

    WIDTH = int(sys.argv[1])

    def send(line):
        os.write(1, (line + "\\n").encode())

    def recv():
        data = b""
        while not data.endswith(b"\\n"):
            byte = os.read(0, 1)
            if not byte:
                os._exit(0)
            data += byte
        return data.decode().strip()

    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(3)])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.randn(2, WIDTH)).sum().backward()
        opt.step()
        return model, opt

    model, opt = build()
    gating = False

    def gate(label):
        if gating:
            send("op " + label)
            if recv() != "go":
                os._exit(3)

    def gated(name):
        real = getattr(os, name)

        def wrapper(*args, **kwargs):
            gate(name + " " + " ".join(os.path.basename(str(a)) for a in args if isinstance(a, (str, bytes))))
            return real(*args, **kwargs)

        return wrapper

    def begin(step, version):
        send(f"saving {step} {version}")
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(step * 10 + version)

    def write_gated(out, step, version, copy=None):
        # from the live model and optimizer, or from `copy`: a snapshot of them and of the RNG state
        def write(tmp):
            gate("write model")
            ckpt.save_model_weights(model, tmp, state_dict=copy["model"] if copy else None)
            gate("write optimizer")
            optimizer = copy["optimizer"] if copy else opt.state_dict()
            ckpt.save_torch_state(optimizer, os.path.join(tmp, ckpt.OPTIMIZER_NAME))
            gate("write rng")
            if copy:
                ckpt.save_torch_state(copy["rng"], ckpt.rng_state_file(tmp))
            else:
                ckpt.save_rng_state(tmp)
            gate("write trainer_state")
            ckpt.write_json(os.path.join(tmp, ckpt.TRAINER_STATE_NAME), {"global_step": step, "version": version})

        return ckpt.write_checkpoint(out, f"checkpoint-{step}", write)

    def saved(out, step, version):
        ckpt.rotate_checkpoints(out, save_total_limit=2)
        send(f"saved {step} {version}")
    """
)
# How the worker saves: `save(out, step, version)`, and `finish()` before it reports done.
_SAVES = {
    "sync": textwrap.dedent(
        """
        def save(out, step, version):
            begin(step, version)
            write_gated(out, step, version)
            saved(out, step, version)

        def finish():
            pass
        """
    ),
    # Through the async writer: the worker snapshots, goes on mutating the live weights while the
    # writer thread writes, and reports a save as done only when its on_done ran.
    "async": textwrap.dedent(
        """
        from trainwright.checkpoint.async_writer import AsyncCheckpointWriter

        writer = AsyncCheckpointWriter()

        def save(out, step, version):
            writer.wait()
            begin(step, version)
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": ckpt.capture_rng_state()}
            write_files = lambda copy: write_gated(out, step, version, copy)
            done = lambda path: saved(out, step, version)  # in the training thread
            writer.save(os.path.join(out, f"checkpoint-{step}"), state, write_files, done)
            # training goes on while the checkpoint is written: the live weights move away from it
            while writer.pending:
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(0.5)
                writer.poll()

        finish = writer.wait
        """
    ),
}
# The worker: two saves, then every operation gated for three more; the zygote forks one per "run".
_ZYGOTE_LOOP = textwrap.dedent(
    """

    def work(out):
        global gating
        save(out, 1, 1)
        save(out, 2, 1)
        for name in ("mkdir", "rename", "replace", "fsync", "unlink", "rmdir"):
            setattr(os, name, gated(name))
        real_open = builtins.open

        def gated_open(file, mode="r", *args, **kwargs):
            if any(c in mode for c in "wax+"):
                gate("open " + os.path.basename(str(file)))
            return real_open(file, mode, *args, **kwargs)

        builtins.open = gated_open
        gating = True
        save(out, 3, 1)
        save(out, 3, 2)  # the same step saved again replaces the folder
        save(out, 4, 1)
        finish()
        send("done")

    send("ready")
    while True:
        command = recv()
        if not command.startswith("run "):
            continue  # a "go" the killed worker never read
        pid = os.fork()
        if pid == 0:
            try:
                send(f"pid {os.getpid()}")
                work(command[4:])
            except BaseException:
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        send(f"exit {status}")
    """
)


class _Zygote:
    def __init__(self, tmp_path, width: int, saves: str) -> None:
        script = tmp_path / f"{saves}_zygote.py"
        script.write_text(_ZYGOTE_PREAMBLE + _SAVES[saves] + _ZYGOTE_LOOP)
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(width)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        assert self._line() == "ready"

    def _line(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"zygote died (exit code {self.proc.poll()})")
        return line.decode().strip()

    def _send(self, text: str) -> None:
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()

    def run(self, out, kill_at: int | None = None, delay: float = 0.0) -> dict:
        """Run one worker; kill it when it reaches operation number `kill_at` (after `delay` s of it)."""
        self._send(f"run {out}")
        pid = int(self._line().split()[1])
        ops: list[str] = []
        saving = saved = None
        killed = False
        while True:
            line = self._line()
            if line.startswith("exit "):
                status = int(line.split()[1])
                expected = signal.SIGKILL if killed else 0
                assert (
                    os.WIFSIGNALED(status) == killed
                    and (os.WTERMSIG(status) if killed else status) == expected
                )
                return {"ops": ops, "saving": saving, "saved": saved, "killed": killed}
            if killed:
                continue
            if line.startswith("op "):
                if len(ops) == kill_at:
                    if delay:
                        self._send("go")
                        time.sleep(delay)  # lets the operation run for a while, then kills it mid-way
                    os.kill(pid, signal.SIGKILL)
                    killed = True
                ops.append(line[3:])
                if not killed:
                    self._send("go")
            elif line.startswith("saving "):
                saving = tuple(int(x) for x in line.split()[1:])
            elif line.startswith("saved "):
                saved = tuple(int(x) for x in line.split()[1:])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _check_after_crash(out, result: dict, width: int) -> None:
    where = f"killed at op {len(result['ops']) - 1} ({result['ops'][-1]!r})"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        last = ckpt.get_last_checkpoint(out)
    assert not caught, f"{where}: {[str(w.message) for w in caught]}"
    assert last is not None, where
    state = ckpt.read_json(os.path.join(last, ckpt.TRAINER_STATE_NAME))
    found = (state["global_step"], state["version"])
    # Never older than what the worker had finished; at most the save that was in flight.
    assert result["saved"] <= found <= result["saving"], f"{where}: found {found}, result {result}"
    assert ckpt.verify_checkpoint(last) == [], where
    assert ckpt.check_checkpoint_files(last, need=("model", "optimizer", "trainer_state", "rng")) == [], where
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(3)])
    ckpt.load_model_weights(model, last)
    assert all(bool((p == found[0] * 10 + found[1]).all()) for p in model.parameters()), where
    assert len(ckpt.safe_torch_load(os.path.join(last, ckpt.OPTIMIZER_NAME))["state"]) == 6, where
    for path in ckpt.sort_checkpoints(out):  # no visible folder is half written or half deleted
        assert ckpt.verify_checkpoint(path) == [], f"{where}: {path}"

    ckpt.write_checkpoint(out, "checkpoint-100", lambda tmp: ckpt.write_json(os.path.join(tmp, "x.json"), {}))
    assert hidden_entries(out) == [], where
    assert os.path.isdir(os.path.join(out, f"checkpoint-{found[0]}")), where
    assert json.loads(open(os.path.join(out, f"checkpoint-{found[0]}", ckpt.TRAINER_STATE_NAME)).read())


def _crash_trials(tmp_path, width: int, exact: int | None, delayed: int, saves: str = "sync") -> int:
    zygote = _Zygote(tmp_path, width, saves)
    try:
        full = zygote.run(tmp_path / "calibrate")
        assert full["saved"] == (4, 1) and not full["killed"]
        ops = full["ops"]
        commits = [i for i, op in enumerate(ops) if op.startswith(("rename", "unlink", "rmdir"))]
        if exact is None:
            points = list(range(len(ops)))
        else:  # evenly spread, plus every rename / deletion step (where visibility changes)
            points = sorted(
                {round(i * (len(ops) - 1) / (exact - 1)) for i in range(exact)} | set(commits[::2])
            )
        trials = [(p, 0.0) for p in points]
        writes = [i for i, op in enumerate(ops) if op == "write model"]
        trials += [(writes[i % len(writes)], 0.002 * (i + 1)) for i in range(delayed)]
        for n, (point, delay) in enumerate(trials):
            out = tmp_path / f"trial-{n}"
            result = zygote.run(out, kill_at=point, delay=delay)
            assert result["killed"], (point, delay)
            _check_after_crash(out, result, width)
        return len(trials)
    finally:
        zygote.close()


def test_sigkill_during_saves_leaves_a_complete_checkpoint(tmp_path):
    assert _crash_trials(tmp_path, width=384, exact=20, delayed=4) >= 24


@pytest.mark.slow
def test_sigkill_at_every_operation(tmp_path):
    _crash_trials(tmp_path, width=1024, exact=None, delayed=20)


def test_sigkill_during_background_writes_leaves_the_previous_checkpoint(tmp_path):
    assert _crash_trials(tmp_path, width=384, exact=16, delayed=4, saves="async") >= 20
