"""evaluate / predict: losses, metrics, shapes, padding, several datasets, metric files."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from conftest import RegressionDataset, RegressionModel
from kit.runs import regression_trainer
from torch import nn
from torch.utils.data import Dataset

from trainwright import EvalPrediction, Trainer


def almost_accuracy(p: EvalPrediction) -> dict:
    preds, labels = p
    return {"accuracy": float((np.abs(preds - labels) <= 0.25).mean())}


def test_evaluate_loss_and_metrics_exact(make_args):
    data = RegressionDataset(length=66)
    trainer = Trainer(
        model=RegressionModel(a=1.5, b=2.5),
        args=make_args(per_device_eval_batch_size=8),
        eval_dataset=data,
        compute_metrics=almost_accuracy,
    )
    metrics = trainer.evaluate()
    pred = 1.5 * data.x + 2.5
    assert metrics["eval_loss"] == pytest.approx(float(((pred - data.ys[0]) ** 2).mean()), rel=1e-5)
    assert metrics["eval_accuracy"] == pytest.approx(float((np.abs(pred - data.ys[0]) <= 0.25).mean()))
    for key in ("eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "epoch"):
        assert key in metrics
    assert trainer.state.log_history[-1]["eval_loss"] == metrics["eval_loss"]


def test_preprocess_logits_and_batch_eval_metrics(make_args):
    data = RegressionDataset(length=40)
    plain = Trainer(
        model=RegressionModel(1.5, 2.5), args=make_args(), eval_dataset=data, compute_metrics=almost_accuracy
    ).evaluate()
    shifted = Trainer(
        model=RegressionModel(1.5, 2.5),
        args=make_args(),
        eval_dataset=data,
        compute_metrics=almost_accuracy,
        preprocess_logits_for_metrics=lambda logits, labels: logits + 1,
    ).evaluate()
    assert shifted["eval_accuracy"] != plain["eval_accuracy"]

    class Batched:
        def __init__(self):
            self.hits = self.n = 0

        def __call__(self, p, compute_result=False):
            preds, labels = p
            self.hits += int((torch.abs(preds - labels) <= 0.25).sum())
            self.n += len(labels)
            if compute_result:
                return {"accuracy": self.hits / self.n}
            return {}

    batched = Trainer(
        model=RegressionModel(1.5, 2.5),
        args=make_args(batch_eval_metrics=True),
        eval_dataset=data,
        compute_metrics=Batched(),
    ).evaluate()
    assert batched["eval_accuracy"] == pytest.approx(plain["eval_accuracy"])


def test_predict_outputs_and_labels(make_args):
    data = RegressionDataset(length=30, label_names=["labels", "labels_2"])

    class TwoLabels(RegressionModel):
        def forward(self, input_x, labels=None, labels_2=None):
            return super().forward(input_x, labels)

    trainer = Trainer(
        model=TwoLabels(1.5, 2.5, double_output=True),
        args=make_args(per_device_eval_batch_size=8, label_names=["labels", "labels_2"]),
    )
    out = trainer.predict(data)
    assert isinstance(out.predictions, tuple) and len(out.predictions) == 2
    assert np.allclose(out.predictions[0], 1.5 * data.x + 2.5)
    assert np.array_equal(out.label_ids[0], data.ys[0]) and np.array_equal(out.label_ids[1], data.ys[1])
    assert "test_loss" in out.metrics and "epoch" not in out.metrics


class VarLen(Dataset):
    def __init__(self, n=10):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"length": i}


class SeqModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))

    def forward(self, input_ids, labels=None):
        logits = input_ids.float() * self.w
        loss = ((logits - labels.float()) ** 2).mean() if labels is not None else None
        return {"loss": loss, "logits": logits} if loss is not None else {"logits": logits}


def var_collate(items):
    # batch i holds sequences of length (i % 3) + 2: predictions differ in length across batches
    length = items[0]["length"] // 2 % 3 + 2
    ids = torch.stack([torch.arange(length) + it["length"] for it in items])
    return {"input_ids": ids, "labels": ids.clone()}


@pytest.mark.parametrize("eval_accumulation_steps", [None, 2])
def test_predictions_of_different_lengths_are_padded(make_args, eval_accumulation_steps):
    args = make_args(
        per_device_eval_batch_size=2,
        eval_accumulation_steps=eval_accumulation_steps,
        remove_unused_columns=False,
    )
    trainer = Trainer(model=SeqModel(), args=args, data_collator=var_collate)
    out = trainer.predict(VarLen(10))
    assert out.predictions.shape == (10, 4)
    assert out.predictions[0, 2] == -100 and out.predictions[2, 2] == 4  # batch 0 len 2, batch 1 len 3
    assert np.array_equal(out.label_ids, out.predictions)


def test_several_eval_datasets_are_prefixed(make_args):
    trainer = Trainer(
        model=RegressionModel(1.0, 1.0),
        args=make_args(),
        eval_dataset={"data1": RegressionDataset(length=16), "data2": RegressionDataset(length=24, seed=1)},
    )
    metrics = trainer.evaluate()
    assert "eval_data1_loss" in metrics and "eval_data2_loss" in metrics
    assert metrics["eval_data1_loss"] != metrics["eval_data2_loss"]


def test_eval_during_training_and_prediction_loss_only(make_args):
    args = make_args(max_steps=4, eval_strategy="steps", eval_steps=3, prediction_loss_only=True)
    trainer = regression_trainer(args, RegressionDataset(length=16), compute_metrics=almost_accuracy)
    trainer.train()
    evals = [r for r in trainer.state.log_history if "eval_loss" in r]
    assert [r["step"] for r in evals] == [3, 4]  # the final step is evaluated too
    assert "eval_accuracy" not in evals[0]


def test_log_and_save_metrics_files(make_args, capsys):
    args = make_args(max_steps=3)
    trainer = regression_trainer(args, RegressionDataset(length=16))
    out = trainer.train()
    trainer.log_metrics("train", out.metrics)
    printed = capsys.readouterr().out
    assert "***** train metrics *****" in printed and "train_loss" in printed
    trainer.save_metrics("train", out.metrics)
    trainer.save_metrics("eval", trainer.evaluate())
    trainer.save_state()
    folder = args.output_dir
    with open(os.path.join(folder, "all_results.json")) as f:
        merged = json.load(f)
    assert "train_loss" in merged and "eval_loss" in merged
    with open(os.path.join(folder, "trainer_state.json")) as f:
        assert json.load(f)["global_step"] == 3


def test_interleave_shards_restores_dataset_order_and_trims_padding():
    from trainwright.data import ResumableSampler
    from trainwright.loop.eval.accumulate import nested_truncate
    from trainwright.loop.eval.gather import interleave_shards

    n, world = 7, 3
    samplers = [ResumableSampler(n, shuffle=False, num_replicas=world, rank=r) for r in range(world)]
    assert samplers[0].num_padding == 2
    shards = [np.array(list(s)) * 10 for s in samplers]  # "predictions" of each process
    pairs = [(a, np.stack([a, a], 1)[:, : 1 + r]) for r, a in enumerate(shards)]  # nested, ragged widths
    merged = nested_truncate(interleave_shards(pairs), n)
    assert merged[0].tolist() == [i * 10 for i in range(n)]
    assert merged[1].shape == (n, 2) and merged[1][0, 1] == -100 and merged[1][2, 1] == 20


class _CachingModel(RegressionModel):
    """A model without a config whose dict output carries a key/value cache under both names."""

    def forward(self, input_x, labels=None):
        y = input_x * self.a + self.b
        out = {"logits": y, "cache": y + 1, "past_key_values": y + 2}
        return {"loss": nn.functional.mse_loss(y, labels), **out} if labels is not None else out


def test_prediction_drops_the_cache_key_the_installed_transformers_names(make_args):
    """Without `config.keys_to_ignore_at_inference`, predictions leave out the output key that the
    installed transformers gives the cache (`cache` since 5.24, `past_key_values` before), as upstream."""
    transformers = pytest.importorskip("transformers")
    from packaging.version import Version

    dropped = "cache" if Version(transformers.__version__) >= Version("5.24") else "past_key_values"
    kept = 2 if dropped == "cache" else 1  # the offset of the other key (past_key_values: 2, cache: 1)
    trainer = Trainer(model=_CachingModel(a=1.0), args=make_args(), eval_dataset=RegressionDataset(length=8))
    logits, other = trainer.predict(RegressionDataset(length=8)).predictions
    np.testing.assert_allclose(other, logits + kept)
