"""A tracking server that is down or never answers does not stall training (issue 9, item 13).

Real MLflow clients with their default retries and timeouts (MLFLOW_HTTP_REQUEST_MAX_RETRIES is not
touched: it would hide the stall), pointed at a loopback port nobody listens on and at a loopback
server that accepts connections and never answers; and a real local MLflow file store, written on
the training thread and through the worker thread, read back with MlflowClient. Before the worker
thread existed, a Trainer run against either dead server took minutes (start_run retrying).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import statistics
import threading
import time

import pytest
from conftest import DropoutMLP, VectorDataset
from kit.reporters import drive, logged, make_args, make_state

mlflow = pytest.importorskip("mlflow")
from kit import TESTS  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from mlflow_kit import client_for, history, isolated_mlflow, local_store, only_run  # noqa: E402, F401

from trainwright.core.events import TrainerCallback  # noqa: E402
from trainwright.loop.trainer import Trainer  # noqa: E402
from trainwright.reporters.base import TIMEOUT_ENV, Reporter, reporter_timeout  # noqa: E402
from trainwright.reporters.mlflow import MLflowCallback  # noqa: E402

DEADLINE = 3.0  # TRAINWRIGHT_REPORTER_TIMEOUT in the dead-server tests


class _Server:
    """A loopback TCP listener. `answer=False`: accepts connections and never reads or writes (a
    black hole). `answer=True`: replies 400 to every request, which MLflow does not retry; used at
    the end of a test so that the client stuck in the background gives up now, not minutes later."""

    def __init__(self, port: int = 0, answer: bool = False) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.answer = answer
        self.held: list[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.answer:
                threading.Thread(target=self._reply, args=(conn,), daemon=True).start()
            else:
                self.held.append(conn)

    @staticmethod
    def _reply(conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            conn.settimeout(10)
            conn.recv(65536)
            body = b'{"error_code": "BAD_REQUEST", "message": "test server: go away"}'
            conn.sendall(
                b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )

    def start_answering(self) -> None:
        """Answer the connections held so far and every later one."""
        self.answer = True
        held, self.held = self.held, []
        for conn in held:
            threading.Thread(target=self._reply, args=(conn,), daemon=True).start()

    def close(self) -> None:
        self.closed = True
        self.sock.close()
        for conn in self.held:
            conn.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StepClock(TrainerCallback):
    """When each optimizer step ended."""

    def __init__(self) -> None:
        self.step_ends: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.step_ends.append(time.monotonic())


def _mlflow_reporter(trainer: Trainer) -> MLflowCallback:
    (reporter,) = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, MLflowCallback)]
    return reporter


def _switch_off_warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("trainwright") and "mlflow" in r.getMessage()
    ]


@pytest.mark.parametrize("server", ["closed_port", "black_hole"])
def test_dead_tracking_server_delays_training_by_the_deadline_once(server, tmp_path, monkeypatch, caplog):
    black_hole = _Server() if server == "black_hole" else None
    port = black_hole.port if black_hole else _closed_port()
    uri = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv(TIMEOUT_ENV, str(DEADLINE))
    caplog.set_level(logging.WARNING)
    from trainwright.args.training_args import TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=8, logging_steps=1, per_device_train_batch_size=8,
        report_to=["mlflow"], disable_tqdm=True, save_strategy="no", use_cpu=True, seed=0,
    )  # fmt: skip
    clock = StepClock()
    trainer = Trainer(model=DropoutMLP(), args=args, train_dataset=VectorDataset(n=64), callbacks=[clock])
    reporter = _mlflow_reporter(trainer)
    answerer = None
    try:
        start = time.monotonic()
        trainer.train()
        finish = time.monotonic()
        elapsed = finish - start
        gaps = [b - a for a, b in zip([start, *clock.step_ends], clock.step_ends)]
        end_wait = finish - clock.step_ends[-1]  # the summary row, train_end and its flush
        print(
            f"\n[{server}] train() took {elapsed:.2f} s with {TIMEOUT_ENV}={DEADLINE:g} "
            f"(longest step incl. start-up {max(gaps):.3f} s, train-end wait {end_wait:.2f} s)"
        )
        assert trainer.state.global_step == 8
        # The steps never waited for the server, the end waited for it once, at most the deadline.
        assert max(gaps) < DEADLINE - 0.5  # the old code held the first step for minutes
        assert end_wait < DEADLINE + 2.0
        assert elapsed < 30.0
        assert reporter.disabled
        warnings = _switch_off_warnings(caplog)
        assert len(warnings) == 1, warnings
        assert "The mlflow reporter is disabled" in warnings[0]
        assert f"127.0.0.1:{port}" in warnings[0] and TIMEOUT_ENV in warnings[0]
        assert "on_train_begin" in warnings[0]  # it never got past starting the run
    finally:
        # Let the client stuck in the background fail now (a 400 is not retried) instead of
        # retrying for minutes in this process, then check that its thread ends.
        if black_hole is not None:
            black_hole.start_answering()
        else:
            answerer = _Server(port, answer=True)
        thread = reporter._worker.thread if reporter._worker is not None else None
        if thread is not None:
            thread.join(timeout=90)
        if black_hole is not None:
            black_hole.close()
        if answerer is not None:
            answerer.close()
    assert thread is None or not thread.is_alive()
    assert len(_switch_off_warnings(caplog)) == 1  # the late failure of the stuck call says nothing more


class WorkerMLflow(MLflowCallback):
    """The MLflow reporter as it runs against a server (events on the worker thread), here writing
    to a local file store so that what arrived can be read back."""

    def service_address(self) -> str | None:
        return "a local file store (the worker path, for this test)"


@pytest.mark.parametrize("path", ["training_thread", "worker_thread"])
def test_file_store_records_every_metric_in_order(path, make_args, tmp_path, monkeypatch):
    kwargs = {"report_to": ["mlflow"]} if path == "training_thread" else {"report_to": "none"}
    args = make_args(
        max_steps=12, logging_steps=1, eval_strategy="steps", eval_steps=4, per_device_train_batch_size=8,
        seed=0, **kwargs,
    )  # fmt: skip
    callbacks = [WorkerMLflow()] if path == "worker_thread" else None
    trainer = Trainer(
        model=DropoutMLP(),
        args=args,
        train_dataset=VectorDataset(n=64),
        eval_dataset=VectorDataset(n=16, seed=1),
        callbacks=callbacks,
    )
    reporter = _mlflow_reporter(trainer)
    trainer.train()
    assert (reporter._worker is not None) == (path == "worker_thread")
    assert not reporter.disabled

    client = client_for(tmp_path / "out")
    run = only_run(client)
    assert run.info.status == "FINISHED"
    assert run.data.params["max_steps"] == "12"
    for key in ("loss", "eval_loss", "learning_rate"):
        expected = [(row["step"], pytest.approx(row[key])) for row in trainer.state.log_history if key in row]
        assert len(expected) >= 3
        assert history(client, run.info.run_id, key, arrival_order=True) == expected
    assert "train_runtime" in run.data.metrics


class BlockedReporter(Reporter):
    """A reporter whose service never answers while `release` is unset (its on_log waits on it),
    listening to every step, as a progress reporter does."""

    name = "blocked"

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.delay = 0.0  # seconds each on_log takes once released
        self.rows: list[int] = []
        self.steps = 0

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.release.wait()
        time.sleep(self.delay)
        self.rows.append(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1


def test_queueing_costs_microseconds_per_event_and_keeps_order(tmp_path, monkeypatch, caplog):
    """What the training thread pays per event of a networked reporter, measured while its worker
    is stuck (so nothing is ever run inline); then everything arrives, in order."""
    monkeypatch.setenv(TIMEOUT_ENV, "60")
    caplog.set_level(logging.WARNING)
    reporter = BlockedReporter()
    args = make_args(tmp_path)
    state = make_state(max_steps=2000)
    state.log_history = [{"loss": 1.0, "step": i} for i in range(5000)]  # a long run's history
    from kit.reporters import handler_for

    from trainwright.core.state import TrainerControl

    handler, control = handler_for([reporter]), TrainerControl()
    handler.on_train_begin(args, state, control)
    log_costs, step_costs = [], []
    for step in range(1, 2001):
        state.global_step = step
        t0 = time.perf_counter()
        handler.on_step_end(args, state, control)
        t1 = time.perf_counter()
        handler.on_log(args, state, control, logs={"loss": 1.0 / step, "learning_rate": 1e-3})
        t2 = time.perf_counter()
        step_costs.append(t1 - t0)
        log_costs.append(t2 - t1)
    log_us = statistics.median(log_costs) * 1e6
    step_us = statistics.median(step_costs) * 1e6
    print(
        f"\nqueued on the training thread: on_log median {log_us:.1f} us (p99 "
        f"{sorted(log_costs)[int(0.99 * len(log_costs))] * 1e6:.1f} us), on_step_end median {step_us:.1f} us"
    )
    assert reporter.rows == []  # nothing ran inline: the worker is still stuck in the first on_log
    assert log_us < 500 and step_us < 500
    reporter.release.set()
    assert reporter.flush(timeout=30)
    assert reporter.rows == list(range(1, 2001))  # every row, in order, at the step it was logged at
    assert reporter.steps == 2000
    assert not reporter.disabled and not _switch_off_warnings(caplog)


def test_a_stuck_worker_is_switched_off_at_the_next_event_past_the_deadline(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(TIMEOUT_ENV, "0.5")
    caplog.set_level(logging.WARNING)
    reporter = BlockedReporter()
    args = make_args(tmp_path)
    drive(reporter, args, [(1, {"loss": 1.0}), (2, {"loss": 0.5})], train_end=False)
    assert not reporter.disabled  # within the deadline: waiting is fine
    time.sleep(0.7)
    start = time.monotonic()
    drive(reporter, args, [(3, {"loss": 0.25})], state=make_state(global_step=2), train_end=True)
    assert time.monotonic() - start < 0.5  # switched off when the event came, nothing waited
    messages = logged(caplog, "blocked reporter is disabled")
    assert (
        len(messages) == 1
        and "did not answer on_log within 0.5 s" in messages[0]
        and TIMEOUT_ENV in messages[0]
    )
    reporter.release.set()
    reporter._worker.thread.join(timeout=10)
    assert reporter.rows == [1]  # the stuck call finished; the queued ones were dropped, as warned


def test_timeout_setting(monkeypatch):
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert reporter_timeout() == 30.0
    monkeypatch.setenv(TIMEOUT_ENV, "2.5")
    assert reporter_timeout() == 2.5
    monkeypatch.setenv(TIMEOUT_ENV, "0")
    assert reporter_timeout() is None
    for bad in ("-1", "soon", "inf"):
        monkeypatch.setenv(TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=TIMEOUT_ENV):
            reporter_timeout()


def test_timeout_zero_runs_events_on_the_training_thread(tmp_path, monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, "0")
    reporter = BlockedReporter()
    reporter.release.set()
    drive(reporter, make_args(tmp_path), [(1, {"loss": 1.0})])
    assert reporter._worker is None and reporter.rows == [1]


# The other services' real clients against a black hole, each in its own process: their stuck
# start-up (wandb-core, comet's, clearml's and neptune's retries) stays behind in the background,
# and the process ends with os._exit instead of waiting for it.
_SERVICE_JOB = r"""
import base64, json, logging, os, socket, sys, tempfile, threading, time

srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(64)
held = []
threading.Thread(target=lambda: [held.append(srv.accept()[0]) for _ in iter(int, 1)], daemon=True).start()
url = "http://127.0.0.1:%d" % srv.getsockname()[1]
which = sys.argv[1]
if which == "wandb":
    os.environ.update(WANDB_BASE_URL=url, WANDB_API_KEY="x" * 40, WANDB_DIR=tempfile.mkdtemp(), WANDB_SILENT="true")
    from trainwright.reporters.wandb import WandbCallback as Callback
elif which == "comet_ml":
    os.environ.update(COMET_URL_OVERRIDE=url + "/clientlib/", COMET_API_KEY="x" * 20, COMET_MODE="online")
    from trainwright.reporters.comet import CometCallback as Callback
elif which == "clearml":
    os.environ.update(CLEARML_API_HOST=url, CLEARML_WEB_HOST=url, CLEARML_FILES_HOST=url,
                      CLEARML_API_ACCESS_KEY="key", CLEARML_API_SECRET_KEY="secret")
    from trainwright.reporters.clearml import ClearMLCallback as Callback
elif which == "neptune":
    token = {"api_address": url, "api_url": url, "api_key": "key"}
    os.environ.update(NEPTUNE_API_TOKEN=base64.b64encode(json.dumps(token).encode()).decode(),
                      NEPTUNE_PROJECT="workspace/project")
    from trainwright.reporters.neptune import NeptuneCallback as Callback
from kit.reporters import drive, make_args

logging.basicConfig(level=logging.WARNING, format="LOG %(name)s %(levelname)s %(message)s")
reporter = Callback()
start = time.monotonic()
drive(reporter, make_args(tempfile.mkdtemp()), [(2, {"loss": 1.0}), (4, {"loss": 0.5})])
print("RESULT", json.dumps({"seconds": time.monotonic() - start, "disabled": reporter.disabled, "url": url}), flush=True)
os._exit(0)
"""


@pytest.mark.parametrize("service", ["wandb", "comet_ml", "clearml", "neptune"])
def test_other_services_online_against_a_black_hole(service, tmp_path):
    import json
    import subprocess
    import sys

    pytest.importorskip({"comet_ml": "comet_ml"}.get(service, service))
    # the parent's settings for these services are not the test's (clearml's in-process offline mode
    # also exports TRAINS_OFFLINE_MODE, which an earlier test leaves behind)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("WANDB_", "COMET_", "CLEARML_", "TRAINS_", "NEPTUNE_"))
    }
    env.update(
        {TIMEOUT_ENV: str(DEADLINE), "HOME": str(tmp_path), "PYTHONPATH": str(TESTS)},
    )
    proc = subprocess.run(
        [sys.executable, "-c", _SERVICE_JOB, service],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    (result,) = [
        json.loads(line[len("RESULT ") :]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")
    ]
    print(f"\n[{service}] black hole: events took {result['seconds']:.2f} s with {TIMEOUT_ENV}={DEADLINE:g}")
    assert result["disabled"], output[-3000:]
    assert result["seconds"] < DEADLINE + 2.0, output[-3000:]
    ours = [line for line in output.splitlines() if line.startswith("LOG trainwright")]
    assert len(ours) == 1, output[-3000:]
    assert f"The {service} reporter is disabled" in ours[0] and TIMEOUT_ENV in ours[0]
    assert "on_train_begin" in ours[0]
    if service != "neptune":  # neptune's address is inside its token
        assert result["url"] in ours[0]


def test_events_outside_training_are_delivered_before_the_call_returns(tmp_path, monkeypatch):
    """evaluate()/predict() outside train(): each event is waited for (bounded by the deadline), so
    a user's `wandb.finish()` right after `trainer.evaluate()` does not race the worker."""
    monkeypatch.setenv(TIMEOUT_ENV, "10")
    reporter = BlockedReporter()
    reporter.release.set()
    reporter.delay = 0.3
    args = make_args(tmp_path)
    from kit.reporters import handler_for

    from trainwright.core.state import TrainerControl

    handler, control = handler_for([reporter]), TrainerControl()
    drive(reporter, args, [(1, {"loss": 1.0})])  # a training run: its rows are flushed at train_end
    assert reporter.rows == [1]
    handler.on_log(args, make_state(global_step=1), control, logs={"eval_loss": 0.5})  # evaluate() after
    assert reporter.rows == [1, 1]
    assert reporter._worker is not None and not reporter.disabled


@pytest.mark.parametrize("nested", [False, True])
def test_worker_sees_the_training_threads_active_run(nested, tmp_path, monkeypatch):
    """mlflow keeps the active run per thread: the worker must join (or nest under) the run that is
    active on the training thread, not start an unrelated one."""
    uri = local_store(monkeypatch, tmp_path)
    if nested:
        monkeypatch.setenv("MLFLOW_NESTED_RUN", "true")
    reporter = WorkerMLflow()
    with mlflow.start_run(run_name="outer") as outer:
        drive(reporter, make_args(tmp_path, run_name="inner"), [(2, {"loss": 1.5}), (4, {"loss": 1.0})])
        assert reporter._worker is not None and not reporter.disabled
        assert mlflow.active_run().info.run_id == outer.info.run_id  # the training thread's run untouched
    client = MlflowClient(uri)
    runs = {r.info.run_name: r for r in client.search_runs(["0"])}
    if nested:
        assert set(runs) == {"outer", "inner"}
        inner = runs["inner"]
        assert inner.data.tags["mlflow.parentRunId"] == outer.info.run_id
        assert inner.info.status == "FINISHED"
        assert history(client, inner.info.run_id, "loss", arrival_order=True) == [(2, 1.5), (4, 1.0)]
    else:
        assert set(runs) == {"outer"}
        assert history(client, outer.info.run_id, "loss", arrival_order=True) == [(2, 1.5), (4, 1.0)]
