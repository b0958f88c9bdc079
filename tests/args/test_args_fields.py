"""Behaviour tests for `TrainingArguments` fields that had none: each sets the field to a non-default
value and checks what a run does with it (the field-coverage test, test_args_coverage.py, points here)."""

from __future__ import annotations

import logging
import os
import signal

import numpy as np
import pytest
import torch
from kit import faults
from torch import nn

from trainwright import Trainer, TrainerCallback, TrainingArguments
from trainwright import data as data_utils
from trainwright.core.state import ExportableState


class Data(faults.Data):
    def __init__(self, n: int = 16):
        super().__init__(n, d=4)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 1)
        self.dtypes: list[torch.dtype] = []

    def forward(self, x, labels=None):
        self.dtypes.append(self.lin.weight.dtype)
        out = self.lin(x.to(self.lin.weight.dtype)).squeeze(-1).float()
        return (
            {"loss": nn.functional.mse_loss(out, labels), "logits": out}
            if labels is not None
            else {"logits": out}
        )


def make_args(tmp_path, **kw) -> TrainingArguments:
    base = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        max_steps=2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        learning_rate=0.01,
    )
    base.update(kw)
    return TrainingArguments(**base)


# ------------------------------------------------------------------- fields read by scripts only


def test_script_only_fields_read_back_and_do_not_change_training(tmp_path):
    """overwrite_output_dir / do_train / do_predict are read by scripts (upstream's Trainer ignores them
    too): they read back as set, survive to_dict, and train() runs whatever do_train says."""
    args = make_args(tmp_path, overwrite_output_dir=True, do_train=False, do_predict=True)
    assert (args.overwrite_output_dir, args.do_train, args.do_predict) == (True, False, True)
    again = TrainingArguments.from_dict(args.to_dict())
    assert (again.overwrite_output_dir, again.do_train, again.do_predict) == (True, False, True)
    assert Trainer(model=Net(), args=args, train_dataset=Data()).train().global_step == 2


def test_resume_from_checkpoint_argument_is_what_train_resumes_from(tmp_path):
    Trainer(
        model=Net(), args=make_args(tmp_path, save_strategy="steps", save_steps=2), train_dataset=Data()
    ).train()
    checkpoint = tmp_path / "out" / "checkpoint-2"
    args = make_args(tmp_path, max_steps=3, resume_from_checkpoint=checkpoint)
    assert args.resume_from_checkpoint == str(checkpoint)
    probe = SendSignal(at_step=0)  # records one entry per step run in this train() call
    trainer = Trainer(model=Net(), args=args, train_dataset=Data(), callbacks=[probe])
    trainer.train()  # no argument: args.resume_from_checkpoint is used
    assert len(probe.handlers) == 1 and trainer.state.global_step == 3  # steps 1-2 came from the checkpoint


# ------------------------------------------------------------------------- precision and model


@pytest.mark.parametrize(
    "field, dtype", [("bf16_full_eval", torch.bfloat16), ("fp16_full_eval", torch.float16)]
)
def test_full_eval_evaluates_in_half_precision_and_trains_in_fp32(tmp_path, field, dtype):
    model = Net()
    trainer = Trainer(
        model=model, args=make_args(tmp_path, **{field: True}), train_dataset=Data(), eval_dataset=Data(8)
    )
    trainer.train()
    assert set(model.dtypes) == {torch.float32}
    model.dtypes.clear()
    metrics = trainer.evaluate()
    assert set(model.dtypes) == {dtype} and np.isfinite(metrics["eval_loss"])


def test_use_cache_is_written_to_the_model_config(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=16)
    for value in (True, False):
        model = transformers.GPT2LMHeadModel(config)
        model.config.use_cache = not value
        Trainer(model=model, args=make_args(tmp_path, use_cache=value))
        assert model.config.use_cache is value


@pytest.fixture
def restore_tf32():
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.parametrize("value", [True, False])
def test_tf32_sets_torchs_matmul_and_cudnn_flags(tmp_path, restore_tf32, value):
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = not value
    Trainer(model=Net(), args=make_args(tmp_path, tf32=value))
    assert torch.backends.cuda.matmul.allow_tf32 is value and torch.backends.cudnn.allow_tf32 is value


def test_torch_compile_backend_and_mode_reach_torch_compile(tmp_path, monkeypatch):
    calls = []
    real = torch.compile

    def recording(model, **kw):
        calls.append(kw)
        return real(model, backend="eager")  # the recorded mode needs inductor; eager keeps this fast

    monkeypatch.setattr(torch, "compile", recording)
    args = make_args(tmp_path, torch_compile_backend="aot_eager", torch_compile_mode="reduce-overhead")
    assert args.torch_compile is True
    trainer = Trainer(model=Net(), args=args, train_dataset=Data())
    trainer.train()
    assert calls == [{"backend": "aot_eager", "mode": "reduce-overhead"}]
    assert type(trainer.model_wrapped).__name__ == "OptimizedModule"


def test_activation_checkpointing_and_its_kwargs_reach_the_model(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=16)
    model = transformers.GPT2LMHeadModel(config)
    seen = []
    name = next(
        n for n in ("activation_checkpointing_enable", "gradient_checkpointing_enable") if hasattr(model, n)
    )
    original = getattr(model, name)  # the v5 name when transformers has it (it calls the old one itself)
    setattr(model, name, lambda **kw: seen.append(kw) or original(**kw))
    ids = torch.randint(0, 32, (8, 6))
    data = [{"input_ids": r, "labels": r} for r in ids]
    args = make_args(
        tmp_path, activation_checkpointing=True, activation_checkpointing_kwargs={"use_reentrant": False}
    )
    assert args.gradient_checkpointing is True and args.gradient_checkpointing_kwargs == {
        "use_reentrant": False
    }
    Trainer(model=model, args=args, train_dataset=data).train()
    assert len(seen) == 1 and {"use_reentrant": False} in seen[0].values()
    assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing


# ------------------------------------------------------------------------------------ evaluation


def test_eval_on_start_evaluates_before_the_first_step(tmp_path):
    args = make_args(tmp_path, eval_on_start=True, eval_strategy="steps", eval_steps=10)
    trainer = Trainer(model=Net(), args=args, train_dataset=Data(), eval_dataset=Data(8))
    trainer.train()
    evals = [r for r in trainer.state.log_history if "eval_loss" in r]
    assert evals and evals[0]["step"] == 0
    plain = Trainer(
        model=Net(),
        args=make_args(tmp_path, eval_strategy="steps", eval_steps=10),
        train_dataset=Data(),
        eval_dataset=Data(8),
    )
    plain.train()
    assert all(r["step"] > 0 for r in plain.state.log_history if "eval_loss" in r)


def test_eval_do_concat_batches_false_returns_the_batches(tmp_path):
    data = Data(10)
    out = Trainer(model=Net(), args=make_args(tmp_path, eval_do_concat_batches=False)).predict(data)
    assert isinstance(out.predictions, list) and [len(p) for p in out.predictions] == [4, 4, 2]
    joined = Trainer(model=Net(), args=make_args(tmp_path)).predict(data).predictions
    np.testing.assert_allclose(np.concatenate(out.predictions), joined)


class IdsData(Data):
    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.x[i], "labels": self.y[i]}


class IdsNet(Net):
    def forward(self, input_ids, labels=None):
        return super().forward(input_ids, labels)


def test_include_for_metrics_passes_inputs_and_losses_to_compute_metrics(tmp_path):
    seen = {}

    def compute_metrics(p):
        seen["inputs"], seen["losses"] = p.inputs, p.losses
        return {}

    data = IdsData(8)
    args = make_args(tmp_path, include_for_metrics=["inputs", "loss"])
    Trainer(model=IdsNet(), args=args, compute_metrics=compute_metrics).evaluate(data)
    np.testing.assert_allclose(seen["inputs"], data.x.numpy())
    assert np.asarray(seen["losses"]).shape[0] == 8
    Trainer(model=IdsNet(), args=make_args(tmp_path), compute_metrics=compute_metrics).evaluate(data)
    assert seen["inputs"] is None and seen["losses"] is None


# ------------------------------------------------------------------------------ reproducibility


def test_full_determinism_turns_on_deterministic_algorithms(tmp_path):
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(False)
        Trainer(model=Net(), args=make_args(tmp_path, full_determinism=True))
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    finally:
        torch.use_deterministic_algorithms(before)


class Counter(TrainerCallback, ExportableState):
    def __init__(self, limit: int = 0):
        self.limit, self.count = limit, 0

    def on_step_end(self, args, state, control, **kw):
        self.count += 1

    def state(self) -> dict:
        return {"args": {"limit": self.limit}, "attributes": {"count": self.count}}


@pytest.mark.parametrize("full", [True, False])
def test_restore_callback_states_from_checkpoint_restores_constructor_args(tmp_path, full):
    args = make_args(tmp_path, save_strategy="steps", save_steps=2)
    Trainer(model=Net(), args=args, train_dataset=Data(), callbacks=[Counter(limit=5)]).train()
    args = make_args(tmp_path, max_steps=3, restore_callback_states_from_checkpoint=full)
    trainer = Trainer(model=Net(), args=args, train_dataset=Data(), callbacks=[Counter(limit=9)])
    trainer.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    (counter,) = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, Counter)]
    assert counter.limit == (5 if full else 9)
    assert counter.count == 3  # 2 restored + 1 step after the resume


# ------------------------------------------------------------------------------------- data loading


def test_length_column_name_is_the_column_length_grouping_reads(tmp_path):
    n_tok = [3, 9, 1, 7, 5, 8, 2, 6]
    items = [{"x": 0, "n_tok": n, "length": 10 - n} for n in n_tok]  # "length" orders them the other way
    for column, key in (("n_tok", lambda i: n_tok[i]), ("length", lambda i: 10 - n_tok[i])):
        args = make_args(
            tmp_path,
            train_sampling_strategy="group_by_length",
            length_column_name=column,
            per_device_train_batch_size=8,
        )
        sampler = data_utils.build_sampler(items, args, Trainer(model=Net(), args=args).runtime, train=True)
        got = [key(i) for i in sampler]
        assert got == sorted(got, reverse=True) and sorted(got) == sorted(key(i) for i in range(8)), column


def test_dataloader_multiprocessing_context_reaches_the_workers(tmp_path):
    if "spawn" not in torch.multiprocessing.get_all_start_methods():
        pytest.skip("no spawn start method")
    args = make_args(tmp_path, dataloader_num_workers=1, dataloader_multiprocessing_context="spawn")
    loader = Trainer(model=Net(), args=args, train_dataset=Data()).get_train_dataloader()
    assert loader.multiprocessing_context.get_start_method() == "spawn"
    assert len(list(loader)) == 4  # the spawned worker really loads the batches
    with pytest.raises(ValueError, match="dataloader_multiprocessing_context.*dataloader_num_workers > 0"):
        make_args(tmp_path, dataloader_multiprocessing_context="spawn")


def test_dataloader_in_order_false_reaches_the_loader_with_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trainwright"):
        args = make_args(tmp_path, dataloader_num_workers=1, dataloader_in_order=False)
    assert "dataloader_in_order=False" in caplog.text
    loader = Trainer(model=Net(), args=args, train_dataset=Data()).get_train_dataloader()
    assert loader.in_order is False
    assert sorted(float(v) for b in loader for v in b["labels"]) == sorted(float(v) for v in Data().y)
    default = Trainer(model=Net(), args=make_args(tmp_path, dataloader_num_workers=1), train_dataset=Data())
    assert default.get_train_dataloader().in_order is True


# ----------------------------------------------------------------------------- processes and signals


def test_local_rank_must_agree_with_LOCAL_RANK(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert make_args(tmp_path, local_rank=0).local_rank == 0  # what the runtime uses without a launcher
    with pytest.raises(ValueError, match="local_rank=1 is invalid.*LOCAL_RANK"):
        make_args(tmp_path, local_rank=1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert make_args(tmp_path, local_rank=1).local_rank == 1
    with pytest.raises(ValueError, match="local_rank=0 is invalid.*'1'"):
        make_args(tmp_path, local_rank=0)


class SendSignal(TrainerCallback):
    def __init__(self, at_step: int):
        self.at_step, self.handlers = at_step, []

    def on_step_end(self, args, state, control, **kw):
        self.handlers.append(signal.getsignal(signal.SIGTERM))
        if state.global_step == self.at_step and args.preemption_signals:
            os.kill(os.getpid(), signal.SIGTERM)


def test_enable_jit_checkpoint_saves_on_sigterm_and_stops(tmp_path):
    args = make_args(tmp_path, max_steps=6, enable_jit_checkpoint=True)
    assert "SIGTERM" in args.preemption_signals
    trainer = Trainer(model=Net(), args=args, train_dataset=Data(64), callbacks=[SendSignal(at_step=2)])
    with pytest.raises(SystemExit) as exit_info:
        trainer.train()
    assert exit_info.value.code == 0
    assert "checkpoint-2" in os.listdir(tmp_path / "out")
    assert trainer.state.global_step == 2


def test_without_enable_jit_checkpoint_sigterm_is_not_handled(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    probe = SendSignal(at_step=0)
    args = make_args(tmp_path, enable_jit_checkpoint=False)  # said explicitly: the default keeps it on
    assert args.preemption_signals == []
    assert "SIGTERM" in make_args(tmp_path).preemption_signals
    Trainer(model=Net(), args=args, train_dataset=Data(), callbacks=[probe]).train()
    assert probe.handlers and all(h is before for h in probe.handlers)
    # named explicitly, preemption_signals wins over enable_jit_checkpoint=False
    named = make_args(tmp_path, preemption_signals=["SIGTERM"])
    probe = SendSignal(at_step=0)
    Trainer(model=Net(), args=named, train_dataset=Data(), callbacks=[probe]).train()
    assert probe.handlers and all(h is not before for h in probe.handlers)


# ------------------------------------------------------------------------------------------ logging


def test_log_level_sets_trainwright_and_transformers_levels(tmp_path):
    hf_logging = pytest.importorskip("transformers.utils.logging")
    old_hf, old_tw = hf_logging.get_verbosity(), logging.getLogger("trainwright").level
    try:
        hf_logging.set_verbosity_warning()
        Trainer(model=Net(), args=make_args(tmp_path, log_level="info"))
        assert hf_logging.get_verbosity() == logging.INFO
        assert logging.getLogger("trainwright").level == logging.INFO
        Trainer(model=Net(), args=make_args(tmp_path, log_level="error"))
        assert hf_logging.get_verbosity() == logging.ERROR
    finally:
        hf_logging.set_verbosity(old_hf)
        logging.getLogger("trainwright").setLevel(old_tw)


# ------------------------------------------------------------------------------ optimization and console


def test_max_grad_norm_clips_the_update(tmp_path):
    def update(**kw):
        model = Net()
        before = model.lin.weight.detach().clone()
        args = make_args(tmp_path, max_steps=1, optim="sgd", learning_rate=1.0, **kw)
        Trainer(model=model, args=args, train_dataset=Data()).train()
        return float((model.lin.weight.detach() - before).norm())

    assert update(max_grad_norm=0) > 0.01  # unclipped: the step of lr x gradient
    assert update(max_grad_norm=1e-3) <= 1e-3 * 1.0001  # the whole gradient (weight + bias) has norm 1e-3


def test_lr_scheduler_kwargs_reach_the_schedule(tmp_path):
    args = make_args(
        tmp_path, max_steps=4, lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr": 0.004}
    )
    trainer = Trainer(model=Net(), args=args, train_dataset=Data())
    trainer.train()
    assert trainer.lr_scheduler.get_last_lr()[0] == pytest.approx(0.004)
    rows = [r["learning_rate"] for r in trainer.state.log_history if "learning_rate" in r]
    assert rows[0] == pytest.approx(0.01) and min(rows) > 0.004 - 1e-9


@pytest.mark.parametrize("disable", [True, False])
def test_disable_tqdm_picks_the_printer_or_the_progress_bars(tmp_path, disable):
    from trainwright.callbacks import PrinterCallback, ProgressCallback

    trainer = Trainer(model=Net(), args=make_args(tmp_path, disable_tqdm=disable))
    kinds = {type(cb) for cb in trainer.callback_handler.callbacks}
    assert (PrinterCallback in kinds, ProgressCallback in kinds) == (disable, not disable)
