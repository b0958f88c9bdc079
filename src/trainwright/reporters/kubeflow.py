"""Kubeflow Trainer: progress, time left and metrics posted to the TrainJob's status endpoint."""

from __future__ import annotations

import json
import logging
import os
import ssl
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from typing import Any, ClassVar

from trainwright.reporters.base import Reporter, as_scalar, env_flag

logger = logging.getLogger(__name__)


class KubeflowCallback(Reporter):
    """Reports training progress to a Kubeflow Trainer TrainJob (the `TrainJobRuntimeStatus`
    feature), as transformers' `KubeflowCallback` does.

    The Kubeflow controller injects, in the training pod: `KUBEFLOW_TRAINER_SERVER_URL` (the HTTPS
    endpoint, required), `KUBEFLOW_TRAINER_SERVER_CA_CERT` (CA file for TLS verification) and
    `KUBEFLOW_TRAINER_SERVER_TOKEN` (path of the service account token, re-read every 5 minutes).
    Each update is one POST of `{"trainerStatus": {"lastUpdatedTime", "progressPercentage",
    "estimatedRemainingSeconds", "metrics": [{"name", "value"}]}}` with `Authorization: Bearer
    <token>`: 0 % at the start of training, at most one every `_MIN_UPDATE_INTERVAL` seconds at
    step ends (capped at 99 %, with the latest logged numbers, current/total steps and epoch), and
    100 % at the end. A failed POST (network, HTTP error, missing token) is warned once and the next
    update is tried anyway: the controller being unreachable never stops training.
    `DISABLE_KUBEFLOW_INTEGRATION=true` turns the reporter off; `report_to="all"` includes it only
    when the server URL is set.
    """

    name = "kubeflow"
    requires = ()  # the standard library's urllib and ssl
    pip_name = ""

    _MIN_UPDATE_INTERVAL: ClassVar[float] = 5.0
    _TOKEN_CACHE_DURATION: ClassVar[float] = 300.0
    _ENV_SERVER_URL: ClassVar[str] = "KUBEFLOW_TRAINER_SERVER_URL"
    _ENV_CA_CERT: ClassVar[str] = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
    _ENV_TOKEN_PATH: ClassVar[str] = "KUBEFLOW_TRAINER_SERVER_TOKEN"

    def __init__(self) -> None:
        super().__init__()
        self.url = os.environ.get(self._ENV_SERVER_URL) or None
        if env_flag("DISABLE_KUBEFLOW_INTEGRATION"):
            self.disable("DISABLE_KUBEFLOW_INTEGRATION is set", logging.INFO)
        elif self.url is None:
            raise RuntimeError(
                f"report_to='kubeflow' needs {self._ENV_SERVER_URL}, which the Kubeflow Trainer controller sets "
                "inside a TrainJob with the TrainJobRuntimeStatus feature enabled"
            )
        self._metrics: dict[str, int | float] = {}
        self._start_time: float | None = None
        self._last_update = float("-inf")
        self._queued_at = float("-inf")  # when the training thread last queued an update
        self._token: str | None = None
        self._token_read_at = float("-inf")
        self._ssl_context: ssl.SSLContext | None = None
        self._warned_failure = False

    @classmethod
    def skip_reason(cls) -> str | None:
        if env_flag("DISABLE_KUBEFLOW_INTEGRATION"):
            return "DISABLE_KUBEFLOW_INTEGRATION is set"
        if not os.environ.get(cls._ENV_SERVER_URL):
            return f"not inside a Kubeflow TrainJob ({cls._ENV_SERVER_URL} is not set)"
        return None

    def service_address(self) -> str | None:
        return self.url  # posts run on the reporter's worker thread: a dead server never stalls a step

    def _queue_event(self, event: str, method: Any, args: tuple, kwargs: dict) -> None:
        # Most step ends fall inside the throttle interval: drop them here, on the training thread,
        # rather than snapshotting the state and waking the worker every step. This gate has its
        # own clock (the worker's may lag behind); the worker's check in _update stays the authority.
        now = time.monotonic()
        if event == "on_train_begin":
            self._queued_at = now
        elif event == "on_step_end":
            if now - self._queued_at < self._MIN_UPDATE_INTERVAL:
                return
            self._queued_at = now
        super()._queue_event(event, method, args, kwargs)

    # -- the status endpoint ------------------------------------------------------------------
    def _context(self) -> ssl.SSLContext | None:
        if self._ssl_context is None and self.url and self.url.startswith("https:"):
            ca_file = os.environ.get(self._ENV_CA_CERT) or None
            self._ssl_context = ssl.create_default_context(cafile=ca_file)
        return self._ssl_context

    def _read_token(self) -> str | None:
        now = time.monotonic()
        if self._token is not None and now - self._token_read_at < self._TOKEN_CACHE_DURATION:
            return self._token
        path = os.environ.get(self._ENV_TOKEN_PATH)
        if not path:
            raise OSError(f"{self._ENV_TOKEN_PATH} is not set, so there is no token to authenticate with")
        with open(path, encoding="utf-8") as f:  # the kubelet rotates it: re-read it now and then
            self._token = f.read().strip()
        self._token_read_at = now
        return self._token

    def _post(self, status: dict[str, Any]) -> bool:
        """POST one status; False (warned once) when it could not be delivered."""
        assert self.url is not None  # without it the reporter is disabled (or refused) in __init__
        try:
            token = self._read_token()
            body = json.dumps({"trainerStatus": status}).encode("utf-8")
            request = urllib.request.Request(
                self.url,
                data=body,
                method="POST",
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=5, context=self._context()) as response:
                if response.status != 200:
                    raise OSError(f"HTTP {response.status}")
            return True
        except (OSError, ssl.SSLError) as exc:  # URLError and HTTPError are OSErrors
            if not self._warned_failure:
                self._warned_failure = True
                logger.warning(
                    "Kubeflow: could not post the training status to %s (%s: %s); training continues and "
                    "later updates are still tried (warned once)",
                    self.url,
                    type(exc).__name__,
                    exc,
                )
            else:
                logger.debug("Kubeflow: status update failed", exc_info=True)
            return False

    def _update(
        self,
        progress: int | None = None,
        remaining_s: float | None = None,
        metrics: dict[str, Any] | None = None,
        force: bool = False,
    ) -> bool:
        now = time.monotonic()
        if not force and now - self._last_update < self._MIN_UPDATE_INTERVAL:
            return False
        self._last_update = now
        status: dict[str, Any] = {"lastUpdatedTime": datetime.now(timezone.utc).isoformat()}
        if progress is not None:
            status["progressPercentage"] = max(0, min(100, int(progress)))
        if remaining_s is not None:
            status["estimatedRemainingSeconds"] = max(0, int(remaining_s))
        if metrics:
            status["metrics"] = [{"name": str(k), "value": str(v)} for k, v in metrics.items()]
        return self._post(status)

    # -- events -------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        self._start_time = time.time()
        self._metrics = {}
        self._update(
            progress=0, metrics={"total_steps": state.max_steps} if state.max_steps else None, force=True
        )

    def on_log(self, args, state, control, logs=None, **kwargs):
        for key, value in (logs or {}).items():
            number = as_scalar(value)
            if number is not None and not isinstance(value, bool):
                self._metrics[key] = number

    def on_step_end(self, args, state, control, **kwargs):
        # Every step: one clock read unless an update is due.
        if self._start_time is None or not state.max_steps or state.max_steps <= 0:
            return
        if time.monotonic() - self._last_update < self._MIN_UPDATE_INTERVAL:
            return
        progress = min(int(state.global_step / state.max_steps * 100), 99)  # 100 only at the end
        remaining = None
        if state.global_step > 0:
            per_step = (time.time() - self._start_time) / state.global_step
            remaining = per_step * (state.max_steps - state.global_step)
        metrics: dict[str, Any] = {
            **self._metrics,
            "current_step": state.global_step,
            "total_steps": state.max_steps,
        }
        if state.epoch is not None:
            metrics["current_epoch"] = round(state.epoch, 2)
        self._update(progress=progress, remaining_s=remaining, metrics=metrics)

    def on_train_end(self, args, state, control, **kwargs):
        if self._start_time is None:
            return
        self._update(progress=100, remaining_s=0, metrics=self._metrics, force=True)
        self._start_time = None
