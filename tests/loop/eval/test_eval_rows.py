"""Evaluation with a collator that gives several rows per sample (DPO's chosen and rejected, reward
pairs, sentence pairs), beside transformers.Trainer: each batch's loss weighs as its samples, not its
rows, so no batch is cut as if it were padding; predictions keep every row, as transformers' do; the
speed metrics count the dataset's samples."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

transformers = pytest.importorskip("transformers")

import trainwright  # noqa: E402
from trainwright.data import ResumableSampler  # noqa: E402


class Values(Dataset):
    """Sample i is {"x": 1.0} for the first `ones` samples, {"x": 3.0} after."""

    def __init__(self, n: int, ones: int) -> None:
        self.n, self.ones = n, ones

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"x": 1.0 if i < self.ones else 3.0}


def two_rows_each(samples: list[dict]) -> dict:
    """Each sample twice (say, chosen then rejected): 2 rows per sample."""
    x = torch.tensor([s["x"] for s in samples])
    return {"x": torch.cat([x, x]).unsqueeze(-1), "labels": torch.cat([x, -x])}


class MeanOfX(nn.Module):
    """Its loss is the batch mean of x; its predictions are x (one per row)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, x, labels=None):
        pred = (x * self.w).squeeze(-1)
        return {"loss": x.mean() * self.w.sum(), "logits": pred}


def evaluate(lib: str, tmp_path, data, metrics=None, trainer_cls=None) -> tuple[dict, object]:
    mod = transformers if lib == "transformers" else trainwright
    args = mod.TrainingArguments(
        output_dir=str(tmp_path / lib),
        per_device_eval_batch_size=8,
        report_to="none",
        use_cpu=True,
        remove_unused_columns=False,
    )
    cls = trainer_cls or mod.Trainer
    trainer = cls(
        model=MeanOfX(), args=args, eval_dataset=data, data_collator=two_rows_each, compute_metrics=metrics
    )
    return trainer.evaluate(), trainer


@pytest.mark.parametrize("n,ones", [(16, 8), (12, 8)])
def test_each_batch_weighs_as_its_samples_as_in_transformers(tmp_path, n, ones):
    theirs, _ = evaluate("transformers", tmp_path, Values(n, ones))
    ours, _ = evaluate("trainwright", tmp_path, Values(n, ones))
    expected = (1.0 * 8 + 3.0 * (n - 8)) / n  # batches of 8 and n - 8 samples
    assert theirs["eval_loss"] == pytest.approx(expected)
    assert ours["eval_loss"] == pytest.approx(theirs["eval_loss"])
    # samples per second over the dataset's samples, not the rows (twice as many). The rate is taken over
    # the exact runtime, `eval_runtime` is it rounded to 4 decimals: their product is n within that rounding
    # (over 5% for a millisecond's evaluation on an idle machine), far from the rows' 2n
    runtime = ours["eval_runtime"]
    assert runtime > 0.0002, runtime  # else the rounding could not tell n from 2n
    rounding = 0.00005 / (runtime - 0.00005) + 0.0005 / ours["eval_samples_per_second"]  # its largest error
    assert ours["eval_samples_per_second"] * runtime == pytest.approx(n, rel=rounding + 1e-6)


def test_predictions_keep_every_row_as_transformers(tmp_path):
    seen = {}

    def metrics(p):
        seen.setdefault("calls", []).append(np.asarray(p.predictions).copy())
        return {"rows": float(len(p.predictions)), "sum": float(np.sum(p.predictions))}

    theirs, _ = evaluate("transformers", tmp_path, Values(16, 8), metrics)
    ours, _ = evaluate("trainwright", tmp_path, Values(16, 8), metrics)
    assert ours["eval_rows"] == theirs["eval_rows"] == 32
    np.testing.assert_array_equal(seen["calls"][1], seen["calls"][0])
    assert ours["eval_loss"] == pytest.approx(theirs["eval_loss"]) == pytest.approx(2.0)


class RankOneOfTwo(trainwright.Trainer):
    """Evaluates as process 1 of 2 would: the sampler pads the dataset to an even split with a repeat
    of the first sample, which falls to this process."""

    def _get_eval_sampler(self, eval_dataset):
        return ResumableSampler(len(eval_dataset), shuffle=False, num_replicas=2, rank=1)


def test_a_repeated_sample_among_several_rows_is_left_out_exactly(tmp_path):
    # 11 samples over 2 processes: this one gets samples 1, 3, 5, 7, 9 and a repeat of sample 0
    seen = {}

    def metrics(p):
        seen["rows"] = len(p.predictions)
        return {}

    result, _ = evaluate("trainwright", tmp_path, Values(11, 6), metrics, trainer_cls=RankOneOfTwo)
    assert result["eval_loss"] == pytest.approx((1 + 1 + 1 + 3 + 3) / 5)  # with the repeat: 10 / 6
    assert seen["rows"] == 10  # 2 rows for each of the 5 real samples
