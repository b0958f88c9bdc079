"""Memory arguments the loop honours (issue 8, point 5): auto_find_batch_size shrinks the batch on a
real out-of-memory error, torch_empty_cache_steps empties the device cache on schedule. GPU-only
paths skip on the CPU."""

from __future__ import annotations

import math
import os

import pytest
import torch
from args_kit import (
    HAS_CUDA,
    evaluating_trainer_fixture,  # noqa: F401  (the evaluating_trainer fixture)
    final_params,
    fresh_runtime_fixture,  # noqa: F401  (the fresh_runtime fixture)
)
from conftest import DropoutMLP, VectorDataset

from trainwright import Trainer
from trainwright.distributed import device_cache
from trainwright.loop.batch_size_finder import should_reduce_batch_size

# ------------------------------------------------------------------------- auto_find_batch_size


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


def test_evaluation_out_of_memory_is_not_a_reason_to_shrink_the_training_batch(evaluating_trainer):
    class EvalHungry(DropoutMLP):
        def forward(self, x, labels=None):
            if not self.training:
                torch.empty(2**50, dtype=torch.uint8)
            return super().forward(x, labels)

    trainer = evaluating_trainer(1, EvalHungry(), VectorDataset(n=16), auto_find_batch_size=True, max_steps=2)
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


# ---------------------------------------------------------------------- torch_empty_cache_steps


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


def test_torch_empty_cache_steps_after_each_training_forward(evaluating_trainer, monkeypatch):
    """Every micro-batch of the steps whose global_step is a multiple of N empties the cache after its
    forward and before its backward (a forward hook of the run, off when the run ends); evaluation
    forwards do not."""
    calls: list[tuple[int, bool]] = []
    model = DropoutMLP()

    def record(device, collect_garbage=False):
        grads = model.net[0].weight.grad
        calls.append((trainer.state.global_step, grads is None or not grads.any()))

    monkeypatch.setattr(device_cache, "empty_device_cache", record)
    trainer = evaluating_trainer(
        1, model, VectorDataset(n=64), torch_empty_cache_steps=2, max_steps=4, gradient_accumulation_steps=2
    )
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
