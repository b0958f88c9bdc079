"""CodeCarbon reporter: an offline emissions tracker from train begin to train end."""

from __future__ import annotations

import csv

import pytest
from kit.reporters import drive, make_args, make_state

pytest.importorskip("codecarbon")

from trainwright.reporters.codecarbon import CodeCarbonCallback  # noqa: E402


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("CODECARBON_COUNTRY_ISO_CODE", "CODECARBON_OUTPUT_DIR", "CODECARBON_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_emissions_written_to_output_dir_and_exposed(tmp_path, clean_env):
    clean_env.setenv("CODECARBON_COUNTRY_ISO_CODE", "fra")
    reporter = CodeCarbonCallback()
    drive(reporter, make_args(tmp_path / "out"), [(1, {"loss": 1.0})])
    assert reporter.tracker is None and reporter.last_emissions is not None and reporter.last_emissions >= 0
    with open(tmp_path / "out" / "emissions.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert row["country_iso_code"] == "FRA"
    assert float(row["emissions"]) == pytest.approx(reporter.last_emissions)
    assert float(row["duration"]) > 0


def test_runs_on_each_nodes_main_process_only(tmp_path):
    other_rank = make_state(is_world_process_zero=False, is_local_process_zero=False)
    reporter = CodeCarbonCallback()
    drive(reporter, make_args(tmp_path / "a"), [(1, {"loss": 1.0})], state=other_rank)
    assert reporter.last_emissions is None and not (tmp_path / "a" / "emissions.csv").exists()
    second_node_main = make_state(is_world_process_zero=False, is_local_process_zero=True)
    drive(reporter, make_args(tmp_path / "b"), [(1, {"loss": 1.0})], state=second_node_main)
    assert (tmp_path / "b" / "emissions.csv").exists()


def test_bad_country_code_is_rejected(clean_env):
    clean_env.setenv("CODECARBON_COUNTRY_ISO_CODE", "France")
    with pytest.raises(ValueError, match="CODECARBON_COUNTRY_ISO_CODE='FRANCE'"):
        CodeCarbonCallback()
