"""Callbacks shipped with trainwright."""

from .divergence import DivergenceCallback
from .early_stopping import EarlyStoppingCallback
from .flow import DefaultFlowCallback
from .progress import PrinterCallback, ProgressCallback
from .speed_monitor import SpeedMonitor

DEFAULT_CALLBACKS: list = [DefaultFlowCallback]

__all__ = [
    "DEFAULT_CALLBACKS",
    "DefaultFlowCallback",
    "DivergenceCallback",
    "EarlyStoppingCallback",
    "PrinterCallback",
    "ProgressCallback",
    "SpeedMonitor",
]
