"""TFTrainer across processes and devices: resume in a new process (bit for bit), SIGKILL during a
save, MirroredStrategy on 2 logical CPU devices, MultiWorkerMirroredStrategy on 2 processes."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from tfkit import load_npz, reaped, run_job, start_job, worker_envs  # noqa: E402


def _ok(result):
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Uninterrupted 12-step runs: with dropout (resume tests) and without (device tests)."""
    root = tmp_path_factory.mktemp("reference")
    runs = [
        [str(root / "drop"), "--dropout", "0.2", "--weights", str(root / "drop.npz")],
        [
            str(root / "plain"),
            "--n",  # 36 samples: each epoch ends with a partial step of 4 (uneven replicas, micro-batches)
            "36",
            "--weights",
            str(root / "plain.npz"),
            "--predict",
            str(root / "plain-pred.npz"),
        ],
    ]
    procs = [start_job(argv) for argv in runs]  # the two at once: each is mostly TensorFlow's start-up
    for p in procs:
        stdout, stderr = p.communicate(timeout=240)
        assert p.returncode == 0, stderr[-4000:]
    return root


def test_resume_in_a_new_process_is_bit_exact(reference, tmp_path):
    out = str(tmp_path / "run")
    first = _ok(run_job(out, "--dropout", "0.2", "--save_steps", "5", "--stop_at", "5"))
    assert "DONE 5" in first.stdout and os.path.isdir(os.path.join(out, "checkpoint-5"))
    _ok(
        run_job(
            out, "--dropout", "0.2", "--save_steps", "5", "--resume", "--weights", str(tmp_path / "w.npz")
        )
    )
    for got, want in zip(load_npz(tmp_path / "w.npz"), load_npz(reference / "drop.npz")):
        assert np.array_equal(got, want)
    state = json.load(open(os.path.join(out, "checkpoint-10", "trainer_state.json")))
    assert state["global_step"] == 10 and [r["step"] for r in state["log_history"]] == [3, 6, 9]


@pytest.mark.parametrize(
    "moment",
    [
        "rename",  # every file written and flushed, the manifest too; killed before the folder is renamed
        pytest.param("tf_write", marks=pytest.mark.slow),  # half a TF checkpoint file written
        pytest.param("json", marks=pytest.mark.slow),  # TF files and trainer state written, no data state
    ],
)
def test_sigkill_during_a_save_leaves_the_previous_checkpoint(reference, tmp_path, moment):
    from trainwright import get_last_checkpoint

    out = str(tmp_path / "run")
    killed = run_job(out, "--dropout", "0.2", "--save_steps", "4", "--kill_in", moment, "--kill_save", "2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not os.path.exists(os.path.join(out, "checkpoint-8"))
    assert get_last_checkpoint(out) == os.path.join(out, "checkpoint-4")
    assert any(n.startswith(".checkpoint-8.tmp-") for n in os.listdir(out))  # the half-written save, hidden
    _ok(
        run_job(
            out, "--dropout", "0.2", "--save_steps", "4", "--resume", "--weights", str(tmp_path / "w.npz")
        )
    )
    assert not any(n.startswith(".") for n in os.listdir(out))  # the next save cleaned it up
    for got, want in zip(load_npz(tmp_path / "w.npz"), load_npz(reference / "drop.npz")):
        assert np.array_equal(got, want)


def test_mirrored_strategy_on_two_logical_devices_equals_one(reference, tmp_path):
    """2 replicas x 2 micro-batches of 2 == one device with batches of 8 (and the partial last step)."""
    result = _ok(
        run_job(
            str(tmp_path / "run"),
            "--devices", "2", "--bs", "2", "--ga", "2", "--n", "36",
            "--weights", str(tmp_path / "w.npz"), "--predict", str(tmp_path / "p.npz"),
        )
    )  # fmt: skip
    assert "DONE 12" in result.stdout
    for got, want in zip(load_npz(tmp_path / "w.npz"), load_npz(reference / "plain.npz")):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    got, want = np.load(tmp_path / "p.npz"), np.load(reference / "plain-pred.npz")
    np.testing.assert_allclose(got["predictions"], want["predictions"], rtol=1e-5, atol=1e-6)  # order kept
    assert float(got["loss"]) == pytest.approx(float(want["loss"]), rel=1e-6)


def _two_workers(out, tmp_path, *extra):
    """Run tf_job.py as 2 MultiWorkerMirroredStrategy workers on loopback; returns their stdouts."""
    procs = []
    for index, env in enumerate(worker_envs()):
        argv = [
            out,
            "--n",
            "36",
            "--bs",
            "4",
            "--save_steps",
            "6",
            "--predict",
            str(tmp_path / f"p{index}.npz"),
        ]
        if index == 0:
            argv += ["--weights", str(tmp_path / "w.npz")]
        procs.append(start_job([*argv, *extra], env))
    with reaped(*procs):
        results = [p.communicate(timeout=240) for p in procs]
    for p, (_stdout, stderr) in zip(procs, results):
        assert p.returncode == 0, stderr[-4000:]
    return [stdout for stdout, _ in results]


def test_multi_worker_mirrored_on_two_processes_equals_one(reference, tmp_path):
    out = str(tmp_path / "run")
    assert all("DONE 12" in stdout for stdout in _two_workers(out, tmp_path))
    for got, want in zip(load_npz(tmp_path / "w.npz"), load_npz(reference / "plain.npz")):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    pred = np.load(tmp_path / "p0.npz")
    np.testing.assert_allclose(
        pred["predictions"], np.load(reference / "plain-pred.npz")["predictions"], rtol=1e-5, atol=1e-6
    )
    assert not os.path.exists(tmp_path / "p1.npz")  # only the chief writes
    assert sorted(n for n in os.listdir(out) if n.startswith("checkpoint-")) == [
        "checkpoint-12",
        "checkpoint-6",
    ]


@pytest.mark.slow
def test_multi_worker_run_resumes_on_two_new_processes(reference, tmp_path):
    out = str(tmp_path / "run")
    assert all("DONE 6" in stdout for stdout in _two_workers(out, tmp_path, "--stop_at", "6"))
    assert all("DONE 12" in stdout for stdout in _two_workers(out, tmp_path, "--resume"))
    for got, want in zip(load_npz(tmp_path / "w.npz"), load_npz(reference / "plain.npz")):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
