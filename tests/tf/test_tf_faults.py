"""TFTrainer under the run-time faults the PyTorch Trainer handles (issue 18, item 7), with real
processes and signals: a preemption signal saves a checkpoint at the end of the step and exits 0,
the resume is bit for bit the uninterrupted run, and a second run into the same output_dir is refused
naming the first (one worker and two MultiWorkerMirroredStrategy workers)."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from tfkit import load_npz, reaped, run_job, start_job, worker_envs  # noqa: E402

import trainwright.checkpoint as ckpt  # noqa: E402

SLOW = ["--announce", "--step_sleep", "0.3"]


def _start(argv, env=None):
    return start_job(argv, env, start_new_session=True)  # a group of its own, signalled as a scheduler does


def _wait_for(proc, prefix: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if line.startswith(prefix):
            return
    proc.kill()
    raise AssertionError(f"no {prefix!r}: {seen[-5:]}; {proc.communicate()[1][-3000:]}")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """12 steps with dropout, no interruption: the weights a preempted and resumed run must end with."""
    root = tmp_path_factory.mktemp("tf-reference")
    result = run_job(str(root / "run"), "--dropout", "0.2", "--weights", str(root / "w.npz"))
    assert result.returncode == 0, result.stderr[-4000:]
    return root / "w.npz"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1], ids=lambda s: s.name)
def test_a_preemption_signal_saves_exits_0_and_the_resume_is_bit_exact(uninterrupted, tmp_path, sig):
    out = str(tmp_path / "run")
    proc = _start([out, "--dropout", "0.2", *SLOW])
    with reaped(proc):
        _wait_for(proc, "STEP 4")
        os.killpg(proc.pid, sig)  # the job's whole process group, as a scheduler (or Ctrl-C) does
        stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr[-4000:]
    assert f"Preempted by {sig.name}: checkpoint written, exiting." in stderr
    assert "DONE" not in stdout  # it stopped instead of going on
    last = ckpt.get_last_checkpoint(out)
    step = int(last.rsplit("-", 1)[1])
    assert 4 <= step < 12 and f"STEP {step + 1}" not in stdout
    assert ckpt.verify_checkpoint(last) == []
    assert sorted(os.listdir(out)) == [os.path.basename(last)]  # no lock or hidden folder left

    resumed = run_job(out, "--dropout", "0.2", "--resume", "--weights", str(tmp_path / "w.npz"))
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "DONE 12" in resumed.stdout
    for got, want in zip(load_npz(tmp_path / "w.npz"), load_npz(uninterrupted)):
        assert np.array_equal(got, want)


def test_the_preemption_arguments_are_honoured(tmp_path):
    from trainwright import TFTrainingArguments

    args = TFTrainingArguments(output_dir=str(tmp_path), preemption_signals=["SIGUSR1"])
    assert args.preemption_signals == ["SIGUSR1"]
    assert TFTrainingArguments(output_dir=str(tmp_path), enable_jit_checkpoint=False).preemption_signals == []
    assert TFTrainingArguments(output_dir=str(tmp_path)).preemption_signals == [
        "SIGTERM",
        "SIGUSR1",
        "SIGINT",
    ]


def test_a_second_run_into_the_same_output_dir_is_refused_naming_the_first(tmp_path):
    out = str(tmp_path / "run")
    first = _start([out, "--max_steps", "500", *SLOW])
    with reaped(first):
        _wait_for(first, "STEP 2")
        second = run_job(out, "--max_steps", "2", "--save_steps", "1")
        assert second.returncode != 0
        assert "OutputDirInUseError" in second.stderr
        assert f"is in use by another training run (pid {first.pid} on host" in second.stderr
        assert "No such file or directory" not in second.stderr
        assert os.listdir(out) == []  # the second run wrote nothing
        first.send_signal(signal.SIGTERM)
        _, stderr = first.communicate(timeout=180)
        assert first.returncode == 0, stderr[-4000:]
    assert ckpt.get_last_checkpoint(out) is not None


def test_two_workers_preempted_stop_at_the_same_step_and_save_once(tmp_path):
    """SIGTERM to both MultiWorkerMirroredStrategy workers (as a scheduler stops a job): they agree
    on one step, the chief writes its checkpoint, both exit 0; a resume on 2 new workers completes."""
    out = str(tmp_path / "run")

    def workers(*extra):
        return [_start([out, "--n", "36", "--bs", "4", *extra], env) for env in worker_envs()]

    procs = workers(*SLOW)
    with reaped(*procs):
        _wait_for(procs[0], "STEP 3")
        os.killpg(procs[0].pid, signal.SIGTERM)
        time.sleep(0.1)  # the other worker gets it a moment later, still inside its step (0.3 s)
        os.killpg(procs[1].pid, signal.SIGTERM)
        results = [p.communicate(timeout=180) for p in procs]
    for p, (_, stderr) in zip(procs, results):
        assert p.returncode == 0, stderr[-4000:]
        assert "Preempted by SIGTERM" in stderr
    saved = [n for n in os.listdir(out) if n.startswith("checkpoint-")]
    assert len(saved) == 1 and ckpt.verify_checkpoint(os.path.join(out, saved[0])) == []

    procs = workers("--resume")
    results = [p.communicate(timeout=240) for p in procs]
    for p, (stdout, stderr) in zip(procs, results):
        assert p.returncode == 0, stderr[-4000:]
        assert "DONE 12" in stdout
