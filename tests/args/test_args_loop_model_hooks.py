"""Arguments the loop honours by changing the model while it trains (issue 8, point 5):
neftune_noise_alpha, use_liger_kernel, debug="underflow_overflow". Real models; GPU-only paths skip
on the CPU."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
from args_kit import (
    HAS_CUDA,
    TokenData,
    final_params,
    fresh_runtime_fixture,  # noqa: F401  (the fresh_runtime fixture)
)
from conftest import DropoutMLP, RegressionDataset, RegressionModel, VectorDataset, tiny_gpt2
from torch import nn

from trainwright import Trainer, TrainerCallback
from trainwright.modeling.debug_underflow import UnderflowOverflowError

HAS_LIGER = importlib.util.find_spec("liger_kernel") is not None


# -------------------------------------------------------------------------------------- NEFTune


class EmbeddingProbe(TrainerCallback):
    """Reads the input embeddings' output while training runs (the hook is on), in both modes."""

    def __init__(self, ids: torch.Tensor):
        self.ids = ids
        self.seen: dict[str, torch.Tensor] = {}

    def on_step_begin(self, args, state, control, model=None, **kw):
        if self.seen:
            return
        emb = model.get_input_embeddings()
        was_training = emb.training
        with torch.no_grad():
            emb.train()
            self.seen["train_a"], self.seen["train_b"] = emb(self.ids), emb(self.ids)
            emb.eval()
            self.seen["eval"] = emb(self.ids)
            self.seen["clean"] = emb.weight[self.ids].clone()
        emb.train(was_training)


def test_neftune_noise_in_training_only_bounded_and_removed_after_train(make_args):
    alpha = 5.0
    model = tiny_gpt2()
    ids = torch.randint(1, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    probe = EmbeddingProbe(ids)
    args = make_args(neftune_noise_alpha=alpha, max_steps=2, per_device_train_batch_size=4)
    trainer = Trainer(model=model, args=args, train_dataset=TokenData(), callbacks=[probe])
    trainer.train()

    emb = model.get_input_embeddings()
    clean = probe.seen["clean"]  # the embedding rows when they were read
    bound = alpha / math.sqrt(ids.shape[1] * emb.embedding_dim)
    noise_a = probe.seen["train_a"] - clean
    noise_b = probe.seen["train_b"] - clean
    assert noise_a.abs().max() <= bound + 1e-6
    assert noise_a.abs().max() > 0.9 * bound  # uniform over [-bound, bound]: the extremes are reached
    assert not torch.equal(noise_a, noise_b)  # fresh noise at each forward
    assert torch.equal(probe.seen["eval"], clean)  # evaluation / prediction see clean embeddings

    # after train() the hook is gone: training mode gives the plain embeddings again
    assert len(emb._forward_hooks) == 0
    emb.train()
    with torch.no_grad():
        assert torch.equal(emb(ids), emb.weight[ids])


def test_neftune_changes_training_and_seeded_runs_repeat(make_args):
    def run(alpha):
        model = tiny_gpt2(seed=3)
        args = make_args(neftune_noise_alpha=alpha, max_steps=3, per_device_train_batch_size=4, seed=7)
        Trainer(model=model, args=args, train_dataset=TokenData()).train()
        return final_params(model)

    first, second, plain = run(5.0), run(5.0), run(None)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert not all(torch.equal(a, b) for a, b in zip(first, plain))


def test_neftune_hook_removed_when_training_fails(make_args):
    class Boom(TrainerCallback):
        def on_step_end(self, *a, **kw):
            raise RuntimeError("stop here")

    model = tiny_gpt2()
    args = make_args(neftune_noise_alpha=5.0, max_steps=2, per_device_train_batch_size=4)
    trainer = Trainer(model=model, args=args, train_dataset=TokenData(), callbacks=[Boom()])
    with pytest.raises(RuntimeError, match="stop here"):
        trainer.train()
    assert len(model.get_input_embeddings()._forward_hooks) == 0


def test_neftune_refused_on_a_model_without_input_embeddings(make_args):
    args = make_args(neftune_noise_alpha=5.0, max_steps=1)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset())
    with pytest.raises(ValueError, match="neftune_noise_alpha.*get_input_embeddings"):
        trainer.train()
    assert not trainer.is_in_train  # the refusal ends the call cleanly


def test_neftune_alpha_validated(make_args):
    with pytest.raises(ValueError, match="neftune_noise_alpha"):
        make_args(neftune_noise_alpha=-1.0)


# -------------------------------------------------------------------------------- Liger kernels


@pytest.mark.skipif(HAS_LIGER, reason="liger-kernel is installed here")
def test_use_liger_kernel_without_the_package_is_a_clear_error(make_args):
    args = make_args(use_liger_kernel=True, max_steps=1, per_device_train_batch_size=4)
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=TokenData())
    with pytest.raises(ImportError, match=r"use_liger_kernel=True.*pip install liger-kernel"):
        trainer.train()


def tiny_llama(seed: int = 0):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(config)


@pytest.mark.skipif(not (HAS_LIGER and HAS_CUDA), reason="liger-kernel's Triton kernels need a GPU")
def test_use_liger_kernel_patches_a_llama_and_trains(tmp_path, fresh_runtime):
    from trainwright import TrainingArguments
    from trainwright.modeling.liger import is_applied

    def run(use_liger):
        model = tiny_llama()
        args = TrainingArguments(
            output_dir=str(tmp_path / f"out{use_liger}"),
            report_to="none",
            disable_tqdm=True,
            save_strategy="no",
            use_liger_kernel=use_liger,
            liger_kernel_config={"rms_norm": True, "swiglu": True, "rope": True} if use_liger else None,
            max_steps=4,
            per_device_train_batch_size=4,
            logging_steps=1,
        )
        data = TokenData()
        trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data)
        trainer.train()
        losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
        return model, losses, trainer.evaluate()["eval_loss"]

    # the plain run first: Liger also swaps the classes in transformers' llama module for the process
    plain_model, plain_losses, plain_eval = run(False)
    assert "LigerRMSNorm" not in repr(plain_model.model.norm) and not is_applied(plain_model)
    model, losses, eval_loss = run(True)
    assert is_applied(model)
    assert "LigerRMSNorm" in repr(model.model.norm)  # Liger rebinds forward/repr on the instance
    # the kernels compute the same model: same losses to float tolerance
    assert losses == pytest.approx(plain_losses, rel=1e-3)
    assert eval_loss == pytest.approx(plain_eval, rel=1e-3)  # loss-only evaluation with skip_logits


@pytest.mark.skipif(not (HAS_LIGER and HAS_CUDA), reason="needs liger-kernel (and a GPU to get past import)")
def test_use_liger_kernel_refusals(make_args, tmp_path, fresh_runtime):
    from trainwright import TrainingArguments

    def gpu_args(**kw):
        return TrainingArguments(
            output_dir=str(tmp_path / "o"), report_to="none", disable_tqdm=True, save_strategy="no", **kw
        )

    cases = [
        (tiny_gpt2(), gpu_args(use_liger_kernel=True, max_steps=1), "no kernels for model_type='gpt2'"),
        (
            RegressionModel(),
            gpu_args(use_liger_kernel=True, max_steps=1),
            "not a transformers PreTrainedModel",
        ),
        (tiny_llama(), make_args(use_liger_kernel=True, max_steps=1), "trains on the CPU"),
        (
            tiny_llama(),
            gpu_args(use_liger_kernel=True, liger_kernel_config={"no_such_kernel": True}, max_steps=1),
            "liger_kernel_config",
        ),
    ]
    for model, args, message in cases:
        fresh_runtime()  # each case on the device its arguments ask for
        trainer = Trainer(model=model, args=args, train_dataset=TokenData())
        with pytest.raises(ValueError, match=message):
            trainer.train()


# ------------------------------------------------------------------- debug="underflow_overflow"


class Amplifier(nn.Module):
    """Multiplies by 1e12 more at each training forward: float32 overflows (> 3.4e38) at the 4th."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, h):
        if self.training:
            self.calls += 1
        return h * (1e12**self.calls)


class Overflowing(nn.Module):
    """The Tanh after the amplifier turns its inf into 1: the loss stays finite, the overflow hides."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.boost = Amplifier()
        self.squash = nn.Tanh()
        self.head = nn.Linear(8, 1)

    def forward(self, x, labels=None):
        out = self.head(self.squash(self.boost(self.body(x)))).squeeze(-1)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


def test_underflow_overflow_reports_the_first_module_with_inf(make_args):
    args = make_args(
        debug="underflow_overflow", max_steps=10, per_device_train_batch_size=4, learning_rate=0.0
    )
    model = Overflowing()
    trainer = Trainer(model=model, args=args, train_dataset=VectorDataset(n=64))
    with pytest.raises(UnderflowOverflowError) as info:
        trainer.train()
    message = str(info.value)
    assert "inf/nan in the forward of boost (Amplifier)" in message
    assert "batch_number=3" in message  # the 4th batch (0-based)
    assert trainer.state.global_step == 3  # three clean steps ran
    # the frames leading to it: the module before, then the bad output
    assert "body.1 Tanh" in message and "output has inf" in message
    frames = message.split("Last ")[1]
    assert frames.index("body.1 Tanh") < frames.index("boost Amplifier")


def test_without_debug_the_same_overflow_goes_unnoticed(make_args):
    args = make_args(max_steps=4, per_device_train_batch_size=4, learning_rate=0.0, logging_steps=1)
    model = Overflowing()
    trainer = Trainer(model=model, args=args, train_dataset=VectorDataset(n=64))
    trainer.train()  # the 4th step's amplifier output is inf, yet its loss is finite
    assert model.boost.calls == 4 and math.isfinite(trainer.state.log_history[3]["loss"])


def test_underflow_overflow_hooks_are_not_stacked_by_repeated_train(make_args):
    args = make_args(debug="underflow_overflow", max_steps=1, per_device_train_batch_size=4)
    model = DropoutMLP()
    trainer = Trainer(model=model, args=args, train_dataset=VectorDataset(n=16))
    trainer.train()
    trainer.train()
    assert len(model.net[0]._forward_hooks) == 1


def test_tpu_metrics_debug_is_refused(make_args):
    with pytest.raises(ValueError, match="tpu_metrics_debug.*TPU"):
        Trainer(model=DropoutMLP(), args=make_args(debug="tpu_metrics_debug"), train_dataset=VectorDataset())
