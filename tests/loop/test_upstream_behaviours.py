"""Behaviours transformers' own trainer tests check, each written here by us against trainwright."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from conftest import RegressionDataset, RegressionModel, regression_with_eval, tiny_t5

from trainwright import Seq2SeqTrainer, Seq2SeqTrainingArguments, Trainer, TrainingArguments
from trainwright.data import default_data_collator

transformers = pytest.importorskip("transformers")


def test_predict_with_batch_eval_metrics_still_returns_predictions(make_args):
    seen = []

    def metrics(pred, compute_result):
        seen.append(compute_result)
        return {"mean_pred": float(torch.as_tensor(pred.predictions).mean())} if compute_result else {}

    args = make_args(batch_eval_metrics=True, per_device_eval_batch_size=4)
    trainer = Trainer(model=RegressionModel(a=1.0), args=args, compute_metrics=metrics)
    out = trainer.predict(RegressionDataset(length=10))
    assert out.predictions.shape == (10,) and out.label_ids.shape == (10,)
    assert seen == [False, False, True] and "test_mean_pred" in out.metrics
    assert trainer.evaluate(RegressionDataset(length=10))["eval_mean_pred"] == pytest.approx(
        out.metrics["test_mean_pred"]
    )


class BareLoader:
    """A loader of the kind users write by hand: iterable with a length, no .dataset, no .batch_size."""

    def __init__(self, dataset, batch_size):
        self.dataset_ = dataset
        self.size = batch_size

    def __len__(self):
        return len(self.dataset_) // self.size

    def __iter__(self):
        for start in range(0, len(self), 1):
            rows = [self.dataset_[i] for i in range(start * self.size, (start + 1) * self.size)]
            yield default_data_collator(rows)


def test_custom_dataloader_without_dataset_or_batch_size(make_args):
    data = RegressionDataset(length=16)

    class T(Trainer):
        def get_train_dataloader(self):
            return BareLoader(data, 4)

        def get_eval_dataloader(self, eval_dataset=None):
            return BareLoader(data, 4)

    args = make_args(num_train_epochs=2, per_device_train_batch_size=4, per_device_eval_batch_size=4)
    trainer = T(model=RegressionModel(), args=args, train_dataset=data, eval_dataset=data)
    out = trainer.train()
    assert out.global_step == 8 and trainer.cursor.samples_seen == 32
    metrics = trainer.evaluate()
    assert metrics["eval_loss"] > 0 and metrics["eval_samples_per_second"] > 0


def test_label_smoothing_is_off_for_multi_label_classification(make_args):
    from kit import hf

    sizes = dict(num_hidden_layers=1, hidden_size=16, intermediate_size=16, vocab_size=32, dropout=0.1)
    model = hf.bert("cls", seed=None, num_labels=3, problem_type="multi_label_classification", **sizes)
    config = model.config
    args = make_args(label_smoothing_factor=0.1)
    with warnings.catch_warnings(record=True) as caught:  # upstream: test_trainer_data.py
        warnings.simplefilter("always")  # `test_label_smoothing_multi_label_incompatibility`: one warning
        trainer = Trainer(model=model, args=args)
    assert len(caught) == 1 and caught[0].category is UserWarning
    assert "Label smoothing is not compatible with multi-label classification" in str(caught[0].message)
    assert trainer.label_smoother is None
    single = transformers.BertForSequenceClassification(
        transformers.BertConfig(**{**config.to_dict(), "problem_type": "single_label_classification"})
    )
    assert Trainer(model=single, args=make_args(label_smoothing_factor=0.1)).label_smoother is not None


def seq2seq_args(tmp_path, **kw):
    return Seq2SeqTrainingArguments(
        output_dir=str(tmp_path / "o"), report_to="none", use_cpu=True, disable_tqdm=True, **kw
    )


def test_generation_config_as_dict_folder_file_or_object(tmp_path):
    GenerationConfig = transformers.GenerationConfig
    for given in (
        {"max_length": 7, "num_beams": 2},
        GenerationConfig(max_length=7, num_beams=2),
    ):
        trainer = Seq2SeqTrainer(model=tiny_t5(), args=seq2seq_args(tmp_path, generation_config=given))
        assert trainer.model.generation_config.max_length == 7
        assert trainer.model.generation_config.num_beams == 2
    folder = tmp_path / "gen"
    GenerationConfig(max_length=9).save_pretrained(folder)
    for given in (str(folder), str(folder / "generation_config.json")):
        trainer = Seq2SeqTrainer(model=tiny_t5(), args=seq2seq_args(tmp_path, generation_config=given))
        assert trainer.model.generation_config.max_length == 9
    (tmp_path / "bad.json").write_text(json.dumps({"num_beams": 1, "early_stopping": True}))
    with pytest.raises(FileNotFoundError, match="generation_config"):
        Seq2SeqTrainer(model=tiny_t5(), args=seq2seq_args(tmp_path, generation_config=str(tmp_path / "none")))


def test_generated_ids_are_padded_to_the_generation_length(tmp_path):
    class Features(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return {"input_ids": torch.tensor([3, 4, 5, 1]), "labels": torch.tensor([6, 7, 1])}

    args = seq2seq_args(tmp_path, predict_with_generate=True, per_device_eval_batch_size=2)
    trainer = Seq2SeqTrainer(model=tiny_t5(), args=args)
    out = trainer.predict(Features(), max_new_tokens=3)
    # padded to the width the call asked for (decoder start + 3 new tokens); labels too
    assert out.predictions.shape == (4, 4) and out.label_ids.shape == (4, 4)
    assert trainer.predict(Features(), max_length=9).predictions.shape == (4, 9)
    assert trainer.predict(Features()).predictions.shape[1] >= 20  # generate's own default length


class GrowingMemory(torch.nn.Module):
    """A model whose buffer grows while it trains and which resizes it when a state dict is loaded."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(0.0))
        self.register_buffer("memory", torch.zeros(0))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        saved = state_dict.get(prefix + "memory")
        if saved is not None:
            self.memory = torch.empty_like(saved)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, input_x, labels=None):
        if self.training:
            self.memory = torch.cat([self.memory, input_x.detach()[:1]])
        y = input_x * self.a
        return (torch.nn.functional.mse_loss(y, labels), y)


def test_resume_loads_weights_through_the_models_own_load_state_dict(make_args, tmp_path):
    data = RegressionDataset(length=16)
    args = make_args(per_device_train_batch_size=4, max_steps=4, save_strategy="steps", save_steps=2)
    Trainer(model=GrowingMemory(), args=args, train_dataset=data).train()
    resumed = GrowingMemory()
    trainer = Trainer(model=resumed, args=args, train_dataset=data)
    trainer.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert resumed.memory.shape == (4,)  # 2 from the checkpoint + 2 more steps

    class Plain(torch.nn.Module):  # no resizing: torch's own size-mismatch error, with the file named
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.tensor(0.0))
            self.register_buffer("memory", torch.zeros(0))

    from trainwright.checkpoint import CheckpointError, load_model_weights

    with pytest.raises(CheckpointError, match="size mismatch for memory"):
        load_model_weights(Plain(), tmp_path / "out" / "checkpoint-2")


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a GPU: use_cpu only changes the device there"
)
def test_use_cpu_is_honoured_by_a_later_trainer_in_the_same_process(tmp_path):
    from trainwright import TrainingArguments

    def trainer(use_cpu):
        args = TrainingArguments(output_dir=str(tmp_path / str(use_cpu)), use_cpu=use_cpu, report_to="none")
        return Trainer(model=RegressionModel(), args=args)

    assert trainer(False).runtime.device.type == "cuda"
    assert trainer(True).runtime.device.type == "cpu"
    assert trainer(False).runtime.device.type == "cuda"


def test_get_eval_dataloader_with_a_dict_of_datasets_asks_for_a_name(make_args):
    data = {"a": RegressionDataset(length=8), "b": RegressionDataset(length=4)}
    trainer = Trainer(model=RegressionModel(), args=make_args(), eval_dataset=data)
    with pytest.raises(ValueError, match=r"dict of datasets \['a', 'b'\]: name one"):
        trainer.get_eval_dataloader()
    assert len(trainer.get_eval_dataloader("b").dataset) == 4
    assert set(trainer.evaluate()) >= {"eval_a_loss", "eval_b_loss"}


def test_model_card_of_a_relative_output_dir_is_named_after_the_folder(make_args, tmp_path, monkeypatch):
    folder = tmp_path / "my-run"
    folder.mkdir()
    monkeypatch.chdir(folder)
    trainer = Trainer(model=RegressionModel(), args=make_args(output_dir="."))
    trainer.create_model_card()
    card = (folder / "README.md").read_text()
    assert "# my-run" in card and "# None" not in card


def reduce_lr_on_plateau_run(trainer_class, make_args):
    """Ten epochs of `trainer_class` on the regression task, the rate cut on a plateau of eval_loss."""
    args = make_args(
        lr_scheduler_type="reduce_lr_on_plateau",
        eval_strategy="epoch",
        metric_for_best_model="eval_loss",
        num_train_epochs=10,
        learning_rate=0.2,
    )
    trainer = regression_with_eval(trainer_class, args)
    trainer.train()
    return trainer


def test_reduce_lr_on_plateau_with_a_log_override_sees_only_evaluation_rows_until_the_last(make_args):
    """transformers' own test_reduce_lr_on_plateau: a `log` override adds the learning rate, and every
    log row but the final one is an evaluation's (the last steps' loss is in the final row)."""

    class WithRates(Trainer):
        def log(self, logs, start_time=None):
            if hasattr(self.lr_scheduler, "_last_lr"):
                logs["learning_rate"] = self.lr_scheduler._last_lr[0]
            super().log(logs)

    trainer = reduce_lr_on_plateau_run(WithRates, make_args)
    rows = trainer.state.log_history
    assert len(rows) == 11 and all("eval_loss" in row for row in rows[:-1])
    assert {"loss", "train_loss", "learning_rate"} <= set(rows[-1])


@pytest.mark.parametrize("max_grad_norm", [0.0, 1.0])
def test_grad_norm_is_logged_with_or_without_clipping_as_upstream(tmp_path, max_grad_norm):
    """transformers measures the gradient norm at every step even with max_grad_norm=0 (no
    clipping) and logs it; the logged norms are the same on both trainers."""
    from conftest import RegressionDataset as Data

    def norms(trainer_cls, args_cls, name):
        args = args_cls(
            output_dir=str(tmp_path / name),
            max_steps=3,
            per_device_train_batch_size=8,
            logging_steps=1,
            max_grad_norm=max_grad_norm,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            learning_rate=0.1,
        )
        trainer = trainer_cls(model=RegressionModel(), args=args, train_dataset=Data(length=24))
        trainer.train()
        return [row["grad_norm"] for row in trainer.state.log_history if "loss" in row]

    theirs = norms(transformers.Trainer, transformers.TrainingArguments, "hf")
    ours = norms(Trainer, TrainingArguments, "tw")
    assert len(ours) == 3 and ours == pytest.approx(theirs, rel=1e-6)
