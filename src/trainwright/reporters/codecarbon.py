"""CodeCarbon: measure the energy and CO2 of training with an offline emissions tracker."""

from __future__ import annotations

import os
import re
from typing import Any

from trainwright.reporters.base import Reporter


class CodeCarbonCallback(Reporter):
    """Tracks emissions from the start to the end of training on each node's main process, with
    `codecarbon.OfflineEmissionsTracker` (no network): country `CODECARBON_COUNTRY_ISO_CODE`
    (default "USA"), results appended to `emissions.csv` in `output_dir` (or `CODECARBON_OUTPUT_DIR`);
    other `CODECARBON_*` settings are read by codecarbon. After training, `last_emissions` holds the
    run's emissions in kg CO2-eq.
    """

    name = "codecarbon"
    requires = ("codecarbon",)
    pip_name = "codecarbon"
    process_zero = "local"

    def __init__(self) -> None:
        super().__init__()
        country = os.environ.get("CODECARBON_COUNTRY_ISO_CODE", "USA").strip().upper()
        if not re.fullmatch(r"[A-Z]{3}", country):
            raise ValueError(
                f"environment variable CODECARBON_COUNTRY_ISO_CODE={country!r}: expected a 3-letter ISO code like USA"
            )
        self.country_iso_code = country
        self.tracker: Any = None
        self.last_emissions: float | None = None

    def service_address(self) -> str | None:
        return None  # the offline tracker writes a local CSV file

    def on_train_begin(self, args, state, control, **kwargs):
        if self.tracker is not None:
            return
        from codecarbon import OfflineEmissionsTracker

        options: dict[str, Any] = {"country_iso_code": self.country_iso_code}
        if not os.environ.get("CODECARBON_OUTPUT_DIR"):
            os.makedirs(args.output_dir, exist_ok=True)
            options["output_dir"] = args.output_dir
        if not os.environ.get("CODECARBON_LOG_LEVEL"):
            options["log_level"] = "warning"
        self.tracker = OfflineEmissionsTracker(**options)
        self.tracker.start()

    def on_train_end(self, args, state, control, **kwargs):
        if self.tracker is None:
            return
        tracker, self.tracker = self.tracker, None
        self.last_emissions = tracker.stop()

    def close_after_failure(self) -> None:
        if self.tracker is not None:
            self.tracker.stop()
            self.tracker = None
