"""Callbacks shipped with trainwright."""

from trainwright.callbacks.divergence import DivergenceCallback
from trainwright.callbacks.early_stopping import EarlyStoppingCallback
from trainwright.callbacks.flow import DefaultFlowCallback
from trainwright.callbacks.jit_checkpoint import JITCheckpointCallback
from trainwright.callbacks.progress import PrinterCallback, ProgressCallback
from trainwright.callbacks.speed_monitor import SpeedMonitor

DEFAULT_CALLBACKS: list = [DefaultFlowCallback]

__all__ = [
    "DEFAULT_CALLBACKS",
    "DefaultFlowCallback",
    "DivergenceCallback",
    "EarlyStoppingCallback",
    "JITCheckpointCallback",
    "PrinterCallback",
    "ProgressCallback",
    "SpeedMonitor",
]
