"""Kubeflow Trainer reporter: a real Trainer posting its status to a real HTTPS server (a
self-signed certificate passed as the CA, as the controller injects it), read back request by request."""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import json
import logging
import ssl
import threading

import pytest
from conftest import RegressionDataset, RegressionModel
from kit.reporters import logged

from trainwright import Trainer, TrainingArguments
from trainwright.reporters import normalize_report_to
from trainwright.reporters.kubeflow import KubeflowCallback

ENV = ("KUBEFLOW_TRAINER_SERVER_URL", "KUBEFLOW_TRAINER_SERVER_CA_CERT", "KUBEFLOW_TRAINER_SERVER_TOKEN")


def _self_signed(tmp_path):
    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubeflow-trainer")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "ca.crt", tmp_path / "server.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


@pytest.fixture
def status_server(tmp_path):
    """An HTTPS server that records each POST (path, headers, JSON body) and answers 200."""
    cert_file, key_file = _self_signed(tmp_path)
    received: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's naming)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append({"path": self.path, "headers": dict(self.headers), "body": json.loads(body)})
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield {
            "url": f"https://127.0.0.1:{server.server_address[1]}/status",
            "ca": cert_file,
            "received": received,
        }
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def in_trainjob(monkeypatch, tmp_path, status_server):
    """The variables the Kubeflow controller injects into the training pod."""
    token = tmp_path / "token"
    token.write_text("tok-1\n")
    monkeypatch.delenv("DISABLE_KUBEFLOW_INTEGRATION", raising=False)
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", status_server["url"])
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_CA_CERT", str(status_server["ca"]))
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(token))
    return status_server


def _train(tmp_path, max_steps=4):
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=max_steps,
        logging_steps=2,
        per_device_train_batch_size=4,
        learning_rate=0.1,
        report_to="kubeflow",
        save_strategy="no",
        disable_tqdm=True,
        use_cpu=True,
    )
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=32))
    trainer.train()
    return trainer


def _metrics(status: dict) -> dict[str, str]:
    return {m["name"]: m["value"] for m in status.get("metrics", [])}


def test_progress_eta_and_metrics_are_posted_with_the_token(tmp_path, in_trainjob, monkeypatch):
    monkeypatch.setattr(KubeflowCallback, "_MIN_UPDATE_INTERVAL", 0.0)  # every step end posts
    trainer = _train(tmp_path)
    received = in_trainjob["received"]
    assert [r["path"] for r in received] == ["/status"] * 6  # begin, 4 step ends, end
    for r in received:
        assert r["headers"]["Authorization"] == "Bearer tok-1"
        assert r["headers"]["Content-Type"] == "application/json"
        datetime.datetime.fromisoformat(r["body"]["trainerStatus"]["lastUpdatedTime"])
    statuses = [r["body"]["trainerStatus"] for r in received]
    assert statuses[0]["progressPercentage"] == 0 and _metrics(statuses[0]) == {"total_steps": "4"}
    assert [s["progressPercentage"] for s in statuses[1:5]] == [25, 50, 75, 99]  # 100 only at the end
    assert all(s["estimatedRemainingSeconds"] >= 0 for s in statuses[1:5])
    step2, step3 = _metrics(statuses[2]), _metrics(statuses[3])
    assert (step2["current_step"], step2["total_steps"], step2["current_epoch"]) == ("2", "4", "0.25")
    # step 2's row is logged after its step end (as upstream): step 3's update carries it
    first_row = next(r for r in trainer.state.log_history if "loss" in r)
    assert "loss" not in step2 and step3["loss"] == str(first_row["loss"])
    assert statuses[-1]["progressPercentage"] == 100 and statuses[-1]["estimatedRemainingSeconds"] == 0
    assert "train_runtime" in _metrics(statuses[-1])


def test_updates_are_throttled(tmp_path, in_trainjob):
    _train(tmp_path)  # a sub-second run: only the forced first and last updates go out
    progress = [r["body"]["trainerStatus"]["progressPercentage"] for r in in_trainjob["received"]]
    assert progress == [0, 100]


def test_step_ends_inside_the_interval_are_not_queued_for_the_worker(tmp_path, in_trainjob):
    class Counting(KubeflowCallback):
        ran = 0

        def on_step_end(self, args, state, control, **kwargs):
            Counting.ran += 1  # on the worker thread: only step ends that were queued get here
            super().on_step_end(args, state, control, **kwargs)

    callback = Counting()
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=40, per_device_train_batch_size=4, report_to="none",
        save_strategy="no", disable_tqdm=True, use_cpu=True,
    )  # fmt: skip
    Trainer(
        model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=32), callbacks=[callback]
    ).train()
    assert callback.service_address() == in_trainjob["url"]  # events go through the worker thread
    assert Counting.ran == 0  # a sub-second run: every step end was inside the interval
    progress = [r["body"]["trainerStatus"]["progressPercentage"] for r in in_trainjob["received"]]
    assert progress[0] == 0 and progress[-1] == 100


def test_an_unreachable_or_untrusted_server_never_stops_training(tmp_path, in_trainjob, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="trainwright.reporters")
    monkeypatch.setattr(KubeflowCallback, "_MIN_UPDATE_INTERVAL", 0.0)
    monkeypatch.delenv("KUBEFLOW_TRAINER_SERVER_CA_CERT")  # the self-signed server is not trusted
    trainer = _train(tmp_path)
    assert trainer.state.global_step == 4
    assert in_trainjob["received"] == []  # TLS is verified: nothing reached the server
    warnings = logged(caplog, "Kubeflow")
    assert len(warnings) == 1 and "CERTIFICATE_VERIFY_FAILED" in warnings[0]  # once, not per step
    assert "training continues" in warnings[0]


def test_needs_the_server_url_and_can_be_disabled(monkeypatch, tmp_path):
    for name in (*ENV, "DISABLE_KUBEFLOW_INTEGRATION"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="KUBEFLOW_TRAINER_SERVER_URL"):
        KubeflowCallback()
    assert "kubeflow" not in normalize_report_to("all")
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "https://127.0.0.1:9/status")
    assert "kubeflow" in normalize_report_to("all")
    monkeypatch.setenv("DISABLE_KUBEFLOW_INTEGRATION", "true")
    assert "kubeflow" not in normalize_report_to("all")
    callback = KubeflowCallback()
    assert callback.disabled  # named explicitly but switched off: it stays silent
