"""`trainwright plot`: figures drawn from a trainer_state.json log history."""

from __future__ import annotations

import json
import logging
import os
import sys

import pytest

pytest.importorskip("matplotlib")
from matplotlib.image import imread  # noqa: E402

from trainwright.app import cli  # noqa: E402
from trainwright.app.plot import load_log_history, plot_run  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EVERY_FIGURE = {
    "plot_loss.png",
    "plot_eval_metrics.png",
    "plot_learning_rate.png",
    "plot_grad_norm.png",
    "plot_throughput.png",
}


def _history(steps: int = 20, eval_every: int = 5) -> list[dict]:
    rows: list[dict] = []
    for step in range(1, steps + 1):
        rows.append(
            {
                "loss": 2.0 / step,
                "grad_norm": 1.0 + 0.1 * step,
                "learning_rate": 1e-3 * (1 - step / steps),
                "epoch": step / 10,
                "step": step,
                "throughput/samples_per_sec": 100.0 + step,
                "throughput/device/samples_per_sec": 50.0 + step,
            }
        )
        if step % eval_every == 0:
            rows.append(
                {
                    "eval_loss": 2.5 / step,
                    "eval_accuracy": step / steps,
                    "eval_runtime": 0.5,
                    "eval_samples_per_second": 200.0,
                    "eval_steps_per_second": 20.0,
                    "epoch": step / 10,
                    "step": step,
                }
            )
    rows.append(
        {
            "train_runtime": 12.0,
            "train_samples_per_second": 110.0,
            "train_steps_per_second": 1.6,
            "total_flos": 1e9,
            "train_loss": 0.5,
            "epoch": 2.0,
            "step": steps,
        }
    )
    return rows


def _write_state(folder, history: list[dict]) -> str:
    os.makedirs(folder, exist_ok=True)
    state = {"global_step": 20, "epoch": 2.0, "log_history": history, "best_metric": None}
    with open(os.path.join(folder, "trainer_state.json"), "w") as f:
        json.dump(state, f)
    return str(folder)


def _check_png(path: str) -> None:
    with open(path, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE
    assert os.path.getsize(path) > 5_000
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image.std() > 0.01  # something was drawn, not a blank canvas


def test_plot_run_draws_every_figure_with_data(tmp_path):
    folder = _write_state(tmp_path / "run", _history())
    paths = plot_run(folder)
    assert {os.path.basename(p) for p in paths} == EVERY_FIGURE
    for p in paths:
        assert os.path.dirname(p) == folder
        _check_png(p)


def test_plot_run_draws_only_what_the_history_holds(tmp_path):
    # a run without evaluation, clipping or SpeedMonitor: loss and learning rate only
    rows = [{"loss": 1.0 / s, "learning_rate": 1e-3, "epoch": s / 4, "step": s} for s in range(1, 9)]
    folder = _write_state(tmp_path / "run", rows)
    names = {os.path.basename(p) for p in plot_run(folder)}
    assert names == {"plot_loss.png", "plot_learning_rate.png"}
    assert not os.path.exists(os.path.join(folder, "plot_eval_metrics.png"))


def test_eval_metrics_figure_leaves_out_timing_and_memory_keys(tmp_path):
    # eval rows with only loss and timings/memory: no eval-metrics figure, but loss has eval_loss
    rows = [
        {"loss": 1.0, "step": 1},
        {
            "eval_loss": 1.2,
            "eval_runtime": 0.1,
            "eval_samples_per_second": 9.0,
            "eval_mem_cpu_alloc_delta": 5,
            "step": 1,
        },
    ]
    folder = _write_state(tmp_path / "run", rows)
    names = {os.path.basename(p) for p in plot_run(folder)}
    assert names == {"plot_loss.png"}


def test_non_finite_and_non_numeric_values_are_skipped(tmp_path):
    rows = [
        {"loss": float("nan"), "step": 1},
        {"loss": 1.0, "step": 2},
        {"eval_accuracy": "n/a", "step": 2},
        {"eval_flag": True, "step": 2},
    ]
    folder = _write_state(tmp_path / "run", rows)
    assert {os.path.basename(p) for p in plot_run(folder)} == {"plot_loss.png"}


def test_empty_history_draws_nothing(tmp_path):
    folder = _write_state(tmp_path / "run", [])
    assert plot_run(folder) == []


def test_a_folder_without_any_state_file_is_a_clear_error(tmp_path):
    (tmp_path / "checkpoint-10").mkdir()  # checkpoint folders without their state: nothing to draw
    with pytest.raises(FileNotFoundError) as e:
        plot_run(str(tmp_path))
    assert str(e.value) == (
        f"{tmp_path / 'trainer_state.json'} does not exist, and no checkpoint of {tmp_path} holds one: "
        "Trainer.save_state() writes it, and each checkpoint has its own."
    )
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        plot_run(str(tmp_path / "nope"))


def test_a_run_that_saved_only_checkpoints_is_drawn_from_the_newest_into_its_folder(make_args, caplog):
    # the README's quick start: train() with checkpoints, save_model(), no save_state(): output_dir
    # has no trainer_state.json of its own, each checkpoint one
    from conftest import RegressionDataset
    from kit.runs import regression_trainer

    args = make_args(max_steps=8, logging_steps=2, save_strategy="steps", save_steps=3)
    trainer = regression_trainer(args, RegressionDataset(length=16, seed=1))
    trainer.train()
    trainer.save_model()
    out = args.output_dir
    assert not os.path.exists(os.path.join(out, "trainer_state.json"))
    caplog.set_level(logging.INFO, logger="trainwright.app.plot")
    assert cli.main(["plot", out]) == 0
    newest = os.path.join(out, "checkpoint-8")
    assert f"Plotting the log history of {os.path.join(newest, 'trainer_state.json')}" in caplog.text
    assert {os.path.basename(p) for p in plot_run(out)} == {
        "plot_loss.png",
        "plot_learning_rate.png",
        "plot_grad_norm.png",
    }
    assert [r["step"] for r in load_log_history(out) if "loss" in r] == [2, 4, 6, 8]  # not checkpoint-6's
    for checkpoint in ("checkpoint-6", "checkpoint-8"):  # nothing written into a checkpoint
        assert not [n for n in os.listdir(os.path.join(out, checkpoint)) if n.endswith(".png")]


def test_corrupt_state_file_is_a_clear_error(tmp_path):
    (tmp_path / "trainer_state.json").write_text("{not json")
    with pytest.raises(ValueError, match="trainer_state.json is not valid JSON: .* line 1 column 2"):
        load_log_history(str(tmp_path))
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 3}))
    with pytest.raises(ValueError, match="no 'log_history'"):
        load_log_history(str(tmp_path))


def test_missing_matplotlib_names_the_extra(tmp_path, monkeypatch):
    folder = _write_state(tmp_path / "run", _history())
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install 'trainwright\[plot\]'"):
        plot_run(folder)


def test_cli_plot_prints_the_paths(tmp_path, capsys):
    folder = _write_state(tmp_path / "run", _history())
    assert cli.main(["plot", folder]) == 0
    printed = capsys.readouterr().out.split()
    assert sorted(printed) == sorted(
        os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".png")
    )
    assert len(printed) == 5


def test_run_average_rates_overlay_the_matching_windowed_rate():
    from trainwright.app.plot import _figures

    figures = {name: panels for name, _, panels in _figures(_history())}
    throughput = dict(figures["plot_throughput.png"])
    # the per-process rate comes before the per-device one; the run average is a flat line on it
    assert list(throughput)[:2] == ["throughput/samples_per_sec", "throughput/device/samples_per_sec"]
    steps, values = throughput["throughput/samples_per_sec"]["train_samples_per_second (run average)"]
    assert steps == [1.0, 20.0] and values == [110.0, 110.0]
    # no SpeedMonitor batches rate in this history: the steps/s average (one number) is not drawn
    assert "train_steps_per_second" not in throughput
    assert "train_samples_per_second" not in throughput
    loss_panel = dict(figures["plot_loss.png"])["loss"]
    assert set(loss_panel) == {"loss", "eval_loss"}
    assert [t for t, _ in figures["plot_eval_metrics.png"]] == ["eval_accuracy"]


def _throughput_titles(history: list[dict]) -> list[str]:
    from trainwright.app.plot import _figures

    figures = {name: panels for name, _, panels in _figures(history)}
    return [title for title, _ in figures.get("plot_throughput.png", [])]


def test_per_device_rates_are_drawn_only_with_several_processes():
    # two processes: the per-device rate is half the whole-run one, so it has its own panel
    assert _throughput_titles(_history()) == [
        "throughput/samples_per_sec",
        "throughput/device/samples_per_sec",
    ]
    # one process: the per-device rates repeat the whole-run ones; MFU (per device only) stays
    rows = [
        {
            "loss": 1.0,
            "step": s,
            "throughput/samples_per_sec": 10.0 * s,
            "throughput/device/samples_per_sec": 10.0 * s,
            "throughput/tokens_per_sec": 640.0 * s,
            "throughput/device/tokens_per_sec": 640.0 * s,
            "throughput/device/mfu": 0.01 * s,
        }
        for s in range(1, 6)
    ]
    assert _throughput_titles(rows) == [
        "throughput/samples_per_sec",
        "throughput/tokens_per_sec",
        "throughput/device/mfu",
    ]


def test_no_throughput_figure_without_speed_monitor_rows(tmp_path, caplog):
    # the end-of-run averages alone (one number each) make no figure; the log says why
    rows = [{"loss": 1.0 / s, "step": s} for s in range(1, 5)]
    rows.append(
        {"train_runtime": 2.0, "train_samples_per_second": 8.0, "train_steps_per_second": 2.0, "step": 4}
    )
    folder = _write_state(tmp_path / "run", rows)
    caplog.set_level(logging.INFO, logger="trainwright.app.plot")
    names = {os.path.basename(p) for p in plot_run(folder)}
    assert names == {"plot_loss.png"}
    assert any(
        "plot_throughput.png not drawn" in r.getMessage() and "SpeedMonitor" in r.getMessage()
        for r in caplog.records
    )


def test_plot_of_a_real_training_run(make_args):
    import numpy as np
    from conftest import RegressionDataset
    from kit.runs import regression_trainer

    from trainwright.callbacks.speed_monitor import SpeedMonitor

    def mae(pred):
        return {"mae": float(np.abs(pred.predictions - pred.label_ids).mean())}

    args = make_args(max_steps=8, logging_steps=2, eval_strategy="steps", eval_steps=4)
    trainer = regression_trainer(
        args,
        RegressionDataset(length=16, seed=1),
        compute_metrics=mae,
        callbacks=[SpeedMonitor(window_size=1)],  # a full window (two step ends) at every log row
    )
    trainer.train()
    trainer.save_state()
    paths = plot_run(args.output_dir)
    assert {os.path.basename(p) for p in paths} == EVERY_FIGURE
    for p in paths:
        _check_png(p)
    # one process: the SpeedMonitor's per-device rates equal the whole-run ones and are not drawn
    titles = _throughput_titles(load_log_history(args.output_dir))
    assert "throughput/samples_per_sec" in titles
    assert not any(t.startswith("throughput/device/") for t in titles)


def test_a_figure_has_one_title_axis_labels_and_its_legend_beside_the_curves(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    drawn = {}
    real_savefig = Figure.savefig

    def keep(fig, path, *args, **kwargs):
        drawn[os.path.basename(path)] = fig
        real_savefig(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    for path in plot_run(_write_state(tmp_path, _history())):
        _check_png(path)  # the real PNG
    loss = drawn["plot_loss.png"]
    (ax,) = loss.axes
    assert loss._suptitle is None and ax.get_title() == "Loss"  # not "Loss" over "loss"
    assert ax.get_xlabel() == "step" and ax.get_ylabel() == "loss"
    loss.canvas.draw()
    legend, plot_area = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.x0 >= plot_area.x1  # beside the curves, not over them
    rates = drawn["plot_throughput.png"]  # several panels: the figure's title, each panel its own
    assert len(rates.axes) > 1 and rates._suptitle.get_text() == "Throughput"
    assert [a.get_ylabel() for a in rates.axes] == [a.get_title() for a in rates.axes]


def test_a_resumed_run_is_drawn_from_its_full_log_with_the_row_logged_at_a_preemption(tmp_path):
    history = _history()
    folder = _write_state(tmp_path, [r for r in history if r["step"] != 10 or "loss" not in r])
    with open(os.path.join(folder, "logs.jsonl"), "w") as f:  # the JSONL reporter's record of every row
        for row in history:
            f.write(json.dumps(row) + "\n")
    steps = [r["step"] for r in load_log_history(folder) if "loss" in r]
    assert 10 in steps and steps == sorted(steps)
    stale = tmp_path / "stale"  # a logs.jsonl that stops before the state: not this run's record
    folder = _write_state(stale, history)
    with open(os.path.join(folder, "logs.jsonl"), "w") as f:
        f.write(json.dumps(history[0]) + "\n")
    assert load_log_history(folder) == history
