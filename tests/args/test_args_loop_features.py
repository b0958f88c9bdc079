"""Arguments the loop honours (issue 8, point 5): neftune_noise_alpha, auto_find_batch_size,
use_liger_kernel, torch_empty_cache_steps, debug="underflow_overflow", include_tokens_per_second /
per-row tokens per second, past_index. Real models; GPU-only paths skip on the CPU."""

from __future__ import annotations

import importlib.util
import math
import os

import pytest
import torch
from conftest import DropoutMLP, RegressionDataset, RegressionModel, VectorDataset, tiny_gpt2
from torch import nn
from torch.utils.data import Dataset

from trainwright import Trainer, TrainerCallback
from trainwright.core import runtime as runtime_mod
from trainwright.distributed import device_cache
from trainwright.loop.batch_size_finder import should_reduce_batch_size
from trainwright.modeling.debug_underflow import UnderflowOverflowError

HAS_CUDA = torch.cuda.is_available()
HAS_LIGER = importlib.util.find_spec("liger_kernel") is not None


@pytest.fixture
def fresh_runtime(monkeypatch):
    """The runtime is a per-process singleton made by the first Trainer: a test that trains on
    another device than earlier tests starts a new one (the old one is put back afterwards)."""

    def reset():
        monkeypatch.setattr(runtime_mod, "_RUNTIME", None)

    reset()
    return reset


class TokenData(Dataset):
    """Random token sequences with labels (a causal LM's batch)."""

    def __init__(self, n: int = 16, seq: int = 12, vocab: int = 64, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


def final_params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


# ----------------------------------------------------------------------------------------- NEFTune


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


# ------------------------------------------------------------------------------ auto_find_batch_size


class BatchLimitedMLP(DropoutMLP):
    """Runs out of memory, for real, on batches larger than `limit`: it asks the allocator for 1 PiB
    (the CPU allocator's `DefaultCPUAllocator: can't allocate memory`), or raises torch's
    OutOfMemoryError as the CUDA caching allocator does."""

    def __init__(self, limit: int, kind: str = "cpu_allocator"):
        torch.manual_seed(0)
        super().__init__()
        self.limit, self.kind = limit, kind
        self.refused: list[int] = []

    def forward(self, x, labels=None):
        out = super().forward(x, labels)  # dropout draws random numbers before the failure
        if self.training and x.shape[0] > self.limit:
            self.refused.append(x.shape[0])
            if self.kind == "cpu_allocator":
                torch.empty(2**50, dtype=torch.uint8)  # raises: no machine has 1 PiB
            if self.kind == "cuda_allocator":
                torch.empty(2**50, dtype=torch.uint8, device=x.device)  # the CUDA caching allocator refuses
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {x.shape[0]} GiB. GPU 0 has a total capacity of 1 GiB"
            )
        return out


@pytest.mark.parametrize(
    "kind",
    [
        "cpu_allocator",
        "cuda_oom_error",
        pytest.param("cuda_allocator", marks=pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")),
    ],
)
def test_auto_find_batch_size_shrinks_records_and_resumes_with_the_found_size(
    make_args, tmp_path, kind, fresh_runtime
):
    data = VectorDataset(n=40)
    args = make_args(
        use_cpu=kind != "cuda_allocator",
        auto_find_batch_size=True,
        per_device_train_batch_size=8,
        num_train_epochs=1,
        save_strategy="steps",
        save_steps=4,
        logging_steps=1,
        output_dir=str(tmp_path / "out"),
    )
    model = BatchLimitedMLP(limit=5, kind=kind)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    out = trainer.train()
    # accelerate's decay: 8 -> 7 -> 6 -> 5 (each x0.9, rounded down)
    assert model.refused == [8, 7, 6]
    assert trainer.state.train_batch_size == 5
    assert out.global_step == math.ceil(40 / 5) == trainer.state.max_steps
    assert args.per_device_train_batch_size == 8  # the caller's arguments are given back unchanged
    assert trainer._train_batch_size == 5
    final = final_params(model)

    # The retry trains exactly as a run started at the size found (same seed, same data order).
    direct_model = BatchLimitedMLP(limit=5, kind=kind)
    direct_args = make_args(
        use_cpu=kind != "cuda_allocator",
        per_device_train_batch_size=5,
        num_train_epochs=1,
        output_dir=str(tmp_path / "direct"),
    )
    Trainer(model=direct_model, args=direct_args, train_dataset=data).train()
    assert all(torch.equal(a, b) for a, b in zip(final, final_params(direct_model)))

    # A resume with auto_find_batch_size starts from the checkpoint's size: no out-of-memory try.
    ckpt = os.path.join(args.output_dir, "checkpoint-4")
    resumed_model = BatchLimitedMLP(limit=5, kind=kind)
    resumed = Trainer(model=resumed_model, args=args, train_dataset=data)
    out2 = resumed.train(resume_from_checkpoint=ckpt)
    assert resumed_model.refused == []
    assert out2.global_step == 8 and resumed.state.train_batch_size == 5
    assert all(torch.equal(a, b) for a, b in zip(final, final_params(resumed_model)))


def test_without_auto_find_batch_size_the_oom_error_propagates(make_args):
    args = make_args(per_device_train_batch_size=8, max_steps=2)
    trainer = Trainer(model=BatchLimitedMLP(limit=5), args=args, train_dataset=VectorDataset(n=40))
    with pytest.raises(RuntimeError, match="DefaultCPUAllocator"):
        trainer.train()


def test_auto_find_batch_size_does_not_retry_other_errors(make_args):
    class Broken(DropoutMLP):
        calls = 0

        def forward(self, x, labels=None):
            Broken.calls += 1
            raise RuntimeError("shape mismatch")

    args = make_args(auto_find_batch_size=True, per_device_train_batch_size=8, max_steps=2)
    trainer = Trainer(model=Broken(), args=args, train_dataset=VectorDataset(n=40))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        trainer.train()
    assert Broken.calls == 1


def test_auto_find_batch_size_gives_up_at_zero(make_args):
    args = make_args(auto_find_batch_size=True, per_device_train_batch_size=2, max_steps=2)
    model = BatchLimitedMLP(limit=0)
    trainer = Trainer(model=model, args=args, train_dataset=VectorDataset(n=40))
    with pytest.raises(RuntimeError, match="reached zero"):
        trainer.train()
    assert model.refused == [2, 1]


def test_evaluation_out_of_memory_is_not_a_reason_to_shrink_the_training_batch(make_args):
    class EvalHungry(DropoutMLP):
        def forward(self, x, labels=None):
            if not self.training:
                torch.empty(2**50, dtype=torch.uint8)
            return super().forward(x, labels)

    args = make_args(
        auto_find_batch_size=True,
        per_device_train_batch_size=4,
        max_steps=2,
        eval_strategy="steps",
        eval_steps=1,
    )
    data = VectorDataset(n=16)
    trainer = Trainer(model=EvalHungry(), args=args, train_dataset=data, eval_dataset=data)
    with pytest.raises(RuntimeError, match="Evaluation hit an out-of-memory error") as info:
        trainer.train()
    assert not should_reduce_batch_size(info.value)
    assert trainer.state.train_batch_size == 4


def test_auto_find_batch_size_refused_with_sharding(make_args):
    with pytest.raises(ValueError, match="auto_find_batch_size"):
        make_args(auto_find_batch_size=True, fsdp="full_shard")


def test_should_reduce_batch_size_recognises_allocator_errors():
    assert should_reduce_batch_size(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert should_reduce_batch_size(RuntimeError("XPU out of memory. Tried to allocate 2 GiB"))
    assert should_reduce_batch_size(RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"))
    assert should_reduce_batch_size(torch.OutOfMemoryError("anything"))
    assert not should_reduce_batch_size(RuntimeError("size mismatch"))
    assert not should_reduce_batch_size(ValueError("CUDA out of memory."))


# ----------------------------------------------------------------------------------- Liger kernels


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


# ------------------------------------------------------------------------------- torch_empty_cache_steps


@pytest.mark.parametrize("every, expected_calls", [(None, 0), (2, 6), (3, 4)])
def test_torch_empty_cache_steps_empties_the_cache_on_schedule(make_args, monkeypatch, every, expected_calls):
    calls: list[tuple[str, bool]] = []
    real = device_cache.empty_device_cache

    def spy(device, collect_garbage=False):
        calls.append((device.type, collect_garbage))
        real(device, collect_garbage)

    monkeypatch.setattr(device_cache, "empty_device_cache", spy)
    # 6 steps of 2 micro-batches; as upstream, each micro-batch of a step whose global_step (steps done
    # before it) is a multiple of N empties the cache: N=2 -> steps 0, 2, 4; N=3 -> steps 0, 3.
    args = make_args(
        torch_empty_cache_steps=every,
        max_steps=6,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
    )
    trainer = Trainer(model=DropoutMLP(), args=args, train_dataset=VectorDataset(n=64))
    trainer.train()
    assert len(calls) == expected_calls
    assert all(kind == trainer.runtime.device.type and not gc for kind, gc in calls)


def test_empty_device_cache_calls_the_device_backend(monkeypatch):
    called: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: called.append("cuda"))
    monkeypatch.setattr(torch.mps, "empty_cache", lambda: called.append("mps"))
    device_cache.empty_device_cache(torch.device("cuda"))
    device_cache.empty_device_cache(torch.device("mps"))
    device_cache.empty_device_cache(torch.device("cpu"))  # no cache on the CPU
    assert called == ["cuda", "mps"]


def test_torch_empty_cache_steps_after_each_training_forward(make_args, monkeypatch):
    """Every micro-batch of the steps whose global_step is a multiple of N empties the cache after its
    forward and before its backward (a forward hook of the run, off when the run ends); evaluation
    forwards do not."""
    calls: list[tuple[int, bool]] = []
    model = DropoutMLP()

    def record(device, collect_garbage=False):
        grads = model.net[0].weight.grad
        calls.append((trainer.state.global_step, grads is None or not grads.any()))

    monkeypatch.setattr(device_cache, "empty_device_cache", record)
    args = make_args(
        torch_empty_cache_steps=2,
        max_steps=4,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        eval_strategy="steps",
        eval_steps=1,
    )
    data = VectorDataset(n=64)
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data)
    trainer.train()
    # steps 0 and 2 (global_step before them), both micro-batches; the first micro-batch has no
    # gradient yet (the backward comes after), and no evaluation forward counts
    assert [step for step, _ in calls] == [0, 0, 2, 2]
    assert [fresh for _, fresh in calls[::2]] == [True, True]
    trainer.evaluate()
    model.train()
    model(torch.zeros(2, 8))
    assert len(calls) == 4  # the hook came off with the run


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
def test_torch_empty_cache_steps_on_cuda(make_args, monkeypatch, fresh_runtime):
    calls: list[int] = []
    real = torch.cuda.empty_cache

    def counting():
        calls.append(torch.cuda.memory_reserved())
        real()

    monkeypatch.setattr(torch.cuda, "empty_cache", counting)
    args = make_args(use_cpu=False, torch_empty_cache_steps=2, max_steps=4, per_device_train_batch_size=4)
    trainer = Trainer(model=DropoutMLP(), args=args, train_dataset=VectorDataset(n=64))
    trainer.train()
    assert trainer.runtime.device.type == "cuda"
    assert len(calls) == 2  # global_step 0 and 2


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
def test_empty_device_cache_releases_cuda_memory():
    x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    del x
    reserved = torch.cuda.memory_reserved()
    assert reserved >= 256 * 2**20
    device_cache.empty_device_cache(torch.device("cuda"))
    assert torch.cuda.memory_reserved() < reserved


# ---------------------------------------------------------------------------- debug="underflow_overflow"


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


# ------------------------------------------------------------------------------------ tokens per second


def assert_rate(rate: float, runtime: float, tokens: int) -> None:
    """rate == tokens / runtime up to the rounding of the logged values (runtime to 4 decimals, rate to 3)."""
    assert runtime > 0
    assert abs(rate * runtime - tokens) <= rate * 5e-5 + runtime * 5e-4 + 1e-9


def test_include_tokens_per_second_is_tokens_over_runtime(make_args):
    data = TokenData(n=16, seq=12)
    args = make_args(include_tokens_per_second=True, num_train_epochs=2, per_device_train_batch_size=4)
    out = Trainer(model=tiny_gpt2(), args=args, train_dataset=data).train()
    tokens = 2 * 16 * 12
    assert_rate(out.metrics["train_tokens_per_second"], out.metrics["train_runtime"], tokens)

    plain = Trainer(model=tiny_gpt2(), args=make_args(max_steps=1), train_dataset=data).train()
    assert "train_tokens_per_second" not in plain.metrics


def test_per_row_tokens_per_second_counts_this_call_only(make_args, tmp_path):
    data = TokenData(n=16, seq=12)
    args = make_args(
        include_num_input_tokens_seen="all",
        per_device_train_batch_size=4,
        num_train_epochs=1,
        logging_steps=1,
        save_strategy="steps",
        save_steps=2,
        output_dir=str(tmp_path / "out"),
    )
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=data)
    trainer.train()
    rows = [r for r in trainer.state.log_history if "loss" in r]
    assert [r["num_input_tokens_seen"] for r in rows] == [48, 96, 144, 192]
    for r in rows:
        assert_rate(r["train_tokens_per_second"], r["train_runtime"], r["num_input_tokens_seen"])

    resumed = Trainer(model=tiny_gpt2(), args=args, train_dataset=data)
    resumed.train(resume_from_checkpoint=os.path.join(args.output_dir, "checkpoint-2"))
    rows = [r for r in resumed.state.log_history if "loss" in r and r["step"] > 2]
    assert [r["num_input_tokens_seen"] for r in rows] == [144, 192]
    for r in rows:  # only the tokens of this call, over this call's time
        assert_rate(r["train_tokens_per_second"], r["train_runtime"], r["num_input_tokens_seen"] - 96)


# ------------------------------------------------------------------------------------------ past_index


class MemoryModel(nn.Module):
    """Returns (loss, prediction, memory); the memory names the forward that made it, and every
    forward records the memory it was given."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))
        self.calls = 0
        self.received: list[tuple[str, float | None]] = []

    def forward(self, input_x, labels=None, mems=None):
        self.calls += 1
        phase = "train" if self.training else "eval"
        self.received.append((phase, None if mems is None else float(mems)))
        y = input_x * self.w + (0.0 if mems is None else 0.0 * mems)
        memory = torch.tensor(float(self.calls))
        if labels is None:
            return (y, memory)
        return (nn.functional.mse_loss(y, labels), y, memory)


def test_past_index_feeds_outputs_back_as_mems_and_resets(make_args):
    data = RegressionDataset(length=12)
    args = make_args(
        past_index=2,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=6,
        num_train_epochs=2,
        eval_strategy="steps",
        eval_steps=2,
    )
    model = MemoryModel()
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data)
    trainer.train()
    # steps 1-3 are epoch 1, 4-6 epoch 2; evaluations (2 batches) after steps 2, 4 and 6
    assert model.received == [
        ("train", None),  # step 1 (call 1)
        ("train", 1.0),  # step 2 gets call 1's memory
        ("eval", None),  # an evaluation starts with no memory (call 3)...
        ("eval", 3.0),
        ("train", 2.0),  # ...and leaves the training memory as it was (step 3)
        ("train", None),  # a new epoch starts with no memory (step 4, call 6)
        ("eval", None),
        ("eval", 7.0),
        ("train", 6.0),  # step 5
        ("train", 9.0),  # step 6
        ("eval", None),
        ("eval", 11.0),
    ]


def test_past_index_without_labels_reads_one_place_earlier(make_args):
    class Unlabelled(Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return {"input_x": torch.tensor(float(i))}

    args = make_args(past_index=2, per_device_eval_batch_size=2)
    model = MemoryModel()
    trainer = Trainer(model=model, args=args)
    trainer.predict(Unlabelled())  # outputs (prediction, memory): the memory is at past_index - 1
    assert model.received == [("eval", None), ("eval", 1.0), ("eval", 2.0)]


def test_past_index_off_passes_no_mems(make_args):
    model = MemoryModel()
    args = make_args(per_device_train_batch_size=4, max_steps=3)
    Trainer(model=model, args=args, train_dataset=RegressionDataset(length=12)).train()
    assert all(m is None for _, m in model.received)
