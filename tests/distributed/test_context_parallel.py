"""Context parallelism (`parallelism_config` cp_size > 1): the parts that run without a GPU.

PyTorch's ring attention runs on CUDA only (`bench/cp_gpu.py` checks it against one process there).
Here: the batch bookkeeping (`context_parallel.prepare`) checked by simulating torch's head-tail split
on a real tiny Llama / GPT-2 whose full-attention outputs are sliced into the shards each process
would hold, so the shards' losses must add up to the unsplit loss; the models and arguments that are
refused, each by name; and, on 4 real gloo processes, the meshes FSDP2 shards over, gradient
clipping over them, torch's own sharding of a prepared batch inside the loop's micro-batch context,
and the refusal on CPU.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch
import transformers
from kit import ROOT, job
from kit.torchrun import torchrun
from torch.distributed.tensor.experimental._context_parallel._load_balancer import _HeadTailLoadBalancer
from transformers import BatchEncoding

from trainwright.args.parallelism import ParallelismSizes
from trainwright.args.training_args import TrainingArguments
from trainwright.core.runtime import Layout, Runtime
from trainwright.distributed import context_parallel
from trainwright.distributed.context_parallel import prepare
from trainwright.modeling.loss import count_items

VOCAB = 48


# ---------------------------------------------------------------------------------- models
def _decoder(kind: str, layers: int = 2, **extra) -> torch.nn.Module:
    """A tiny transformers `<kind>ForCausalLM` (Llama, Mistral, Mixtral) from its config, 4 heads over 2
    key-value heads, in eval mode."""
    config = getattr(transformers, f"{kind}Config")(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **extra,
    )
    torch.manual_seed(0)
    return getattr(transformers, f"{kind}ForCausalLM")(config).eval()


def _llama(**extra) -> torch.nn.Module:
    return _decoder("Llama", **extra)


def _gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def _padded_batch() -> dict[str, torch.Tensor]:
    """3 right-padded rows of 13, 9 and 5 tokens (length 13: not a multiple of 2 x cp_size)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (3, 13), generator=g)
    mask = torch.ones_like(ids)
    for row, n in enumerate((13, 9, 5)):
        mask[row, n:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


# ---------------------------------------------------------------------------------- the split, simulated
def _shards(batch: dict, cp_size: int) -> list[torch.Tensor]:
    """The sequence positions each of `cp_size` processes holds: torch's head-tail load balancer's
    order (rank r: chunks r and 2*cp_size-1-r), cut in cp_size equal parts."""
    length = batch["input_ids"].shape[1]
    order = _HeadTailLoadBalancer(length, cp_size, "cpu")._generate_indices()[0]
    return list(order.chunk(cp_size))


@pytest.mark.parametrize("cp_size", [2, 3])
@pytest.mark.parametrize("build", [_llama, _gpt2], ids=["llama", "gpt2"])
def test_the_shards_losses_add_up_to_the_unsplit_loss(build, cp_size):
    model, batch = build(), _padded_batch()
    with torch.no_grad():
        unsplit = model(**batch)
        prepared = prepare(batch, cp_size)
        whole = model(**{k: v for k, v in prepared.items() if k != "labels"})  # every shard's outputs at once
    length = prepared["input_ids"].shape[1]
    assert length % (2 * cp_size) == 0 and length >= 13
    real = batch["attention_mask"].bool()
    # dropping the right-padding mask leaves every real token's outputs as they were
    torch.testing.assert_close(whole.logits[:, :13][real], unsplit.logits[real], rtol=1e-4, atol=1e-5)
    targets = count_items(batch, shift=True)
    losses, counted = [], 0
    for positions in _shards(prepared, cp_size):
        shard = {k: prepared[k][:, positions].contiguous() for k in ("labels", "shift_labels")}
        counted += int(count_items(shard, shift=True))
        # what the model's own loss computes on a shard: `shift_labels` as given, over the step's targets
        loss = model.loss_function(
            logits=whole.logits[:, positions],
            labels=shard["labels"],
            vocab_size=VOCAB,
            num_items_in_batch=targets,
            shift_labels=shard["shift_labels"],
        )
        losses.append(loss)
    assert counted == int(targets)
    torch.testing.assert_close(sum(losses), unsplit.loss, rtol=1e-5, atol=1e-6)
    # shifting inside each shard instead (what the model does without shift_labels) loses targets
    assert (
        sum(int((prepared["labels"][:, p][:, 1:] != -100).sum()) for p in _shards(prepared, cp_size))
        < targets
    )


def test_prepare_shifts_the_labels_before_the_split_and_pads_the_end():
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    out = prepare({"input_ids": ids, "labels": ids.clone()}, cp_size=2)  # 6 -> 8 positions
    assert out["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10, 0, 0]]
    assert out["shift_labels"].tolist() == [[6, 7, 8, 9, 10, -100, -100, -100]]
    assert out["labels"].tolist() == [[5, 6, 7, 8, 9, 10, -100, -100]]
    assert out["position_ids"].tolist() == [list(range(8))]
    assert out["attention_mask"].tolist() == [[1] * 8]
    # rank 0 holds positions 0, 1 and 6, 7: its position 1's target (7) is the next shard's first label
    first = _shards(out, 2)[0]
    assert first.tolist() == [0, 1, 6, 7]
    assert out["shift_labels"][0, first].tolist() == [6, 7, -100, -100]


def test_prepare_keeps_given_positions_and_shift_labels_and_leaves_the_batch_as_it_was():
    ids = torch.arange(1, 9).reshape(2, 4)
    given = torch.tensor([[2, 3, 4, -100], [6, -100, 8, -100]])
    batch = BatchEncoding(
        {
            "input_ids": ids,
            "labels": ids.clone(),
            "shift_labels": given,
            "position_ids": torch.arange(4)[None],
        }
    )
    out = prepare(batch, cp_size=2)
    assert out["shift_labels"] is given
    assert out["position_ids"].tolist() == [[0, 1, 2, 3]] * 2
    assert set(batch) == {"input_ids", "labels", "shift_labels", "position_ids"}  # nothing added to it
    assert "attention_mask" not in batch and isinstance(out, dict)


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda b: b["attention_mask"].__setitem__((0, 0), 0), r"left padding.*padding_side='right'"),
        (lambda b: b["labels"].__setitem__((1, 11), 7), r"padding positions .* have a label target.*-100"),
        (
            lambda b: b.__setitem__(
                "position_ids", torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 6]] * 3)
            ),
            r"packed sequences.*padding_free",
        ),
        (
            lambda b: b.__setitem__("token_type_ids", torch.zeros(3, 13, dtype=torch.long)),
            r"'token_type_ids' has one entry per token",
        ),
        (lambda b: b.__setitem__("labels", b["labels"][:, :5]), r"labels have shape \(3, 5\)"),
        (lambda b: b.pop("labels"), r"no `labels`"),
        (lambda b: b.__setitem__("input_ids", b["input_ids"][0]), r"input_ids` of shape \(batch, sequence\)"),
    ],
    ids=["left_padding", "padding_target", "packed", "per_token_key", "label_shape", "no_labels", "1d_ids"],
)
def test_prepare_refuses_what_the_split_would_change(change, named):
    batch = _padded_batch()
    change(batch)
    with pytest.raises(ValueError, match=r"cp_size > 1 \(context parallelism\): .*" + named):
        prepare(batch, cp_size=2)


# ---------------------------------------------------------------------------------- the model
def test_a_causal_llm_with_sdpa_is_accepted():
    context_parallel.check_model(_llama())
    context_parallel.check_model(_gpt2())


def _bert() -> torch.nn.Module:
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64
    )
    return transformers.BertForMaskedLM(config)


def _eager_llama() -> torch.nn.Module:
    model = _llama()
    model.config._attn_implementation = "eager"
    return model


def _mistral_window() -> torch.nn.Module:
    return _decoder("Mistral", layers=1, sliding_window=8)


def _mixtral_router() -> torch.nn.Module:
    return _decoder(
        "Mixtral",
        layers=1,
        num_local_experts=2,
        num_experts_per_tok=1,
        sliding_window=None,
        output_router_logits=True,
    )


def _no_items_llama() -> torch.nn.Module:
    model = _llama()
    model.accepts_loss_kwargs = False
    return model


@pytest.mark.parametrize(
    "build, named",
    [
        (_eager_llama, r"LlamaForCausalLM computes attention with 'eager'.*attn_implementation=\"sdpa\""),
        (_bert, r"BertForMaskedLM is not a causal LM"),
        (_mistral_window, r"MistralForCausalLM has attention layers of type \['sliding_attention'\]"),
        (
            _mixtral_router,
            r"MixtralForCausalLM adds a router load-balancing loss.*output_router_logits=False",
        ),
        (_no_items_llama, r"does not take num_items_in_batch"),
    ],
    ids=["eager", "bert", "sliding_window", "router_logits", "mean_loss"],
)
def test_models_ring_attention_cannot_run_exactly_are_refused_by_name(build, named):
    model = build()
    if model.config._attn_implementation != "eager":
        model.config._attn_implementation = "sdpa"
    with pytest.raises(ValueError, match=named):
        context_parallel.check_model(model)


def test_a_loss_function_is_refused_and_a_measured_mean_loss_named():
    context_parallel.check_loss_function(None)
    with pytest.raises(ValueError, match=r"compute_loss_func gets the labels of a sequence shard"):
        context_parallel.check_loss_function(lambda outputs, labels, num_items_in_batch=None: outputs.loss)
    assert "MyLM ignores num_items_in_batch" in str(context_parallel.refuse_mean_loss("MyLM"))


# ---------------------------------------------------------------------------------- the arguments
@pytest.mark.parametrize(
    "extra",
    [
        {"label_smoothing_factor": 0.1},
        {"average_tokens_across_devices": False},
        {"fused_linear_cross_entropy": True},
        {"padding_free": True},
        {"lean_activations": True},
        {"torch_compile": True},
    ],
    ids=lambda e: next(iter(e)),
)
def test_arguments_the_sequence_split_cannot_honour_are_refused_by_name(extra):
    (name,) = extra
    with pytest.raises(ValueError, match=rf"{name}=.* is invalid: not with parallelism_config cp_size=2"):
        TrainingArguments("out", parallelism_config={"cp_size": 2}, **extra)
    TrainingArguments("out", parallelism_config={"tp_size": 2}, **extra)  # fine without context parallelism


def test_the_rotation_is_read_from_accelerates_cp_handler():
    args = TrainingArguments(
        "out", parallelism_config={"cp_size": 2, "cp_handler": {"cp_comm_strategy": "alltoall"}}
    )
    assert args.parallelism_config.cp_comm_strategy == "alltoall"
    with pytest.raises(ValueError, match=r"cp_comm_strategy='ring'"):
        TrainingArguments("out", parallelism_config={"cp_size": 2, "cp_comm_strategy": "ring"})


def test_gradients_are_averaged_over_the_data_and_context_parallel_processes():
    sizes = ParallelismSizes(dp_shard_size=2, cp_size=2, tp_size=2)
    layout = Layout(
        mesh=None, sizes=sizes.sizes, data_rank=0, data_world_size=2, data_group=None, data_leaders=(0, 4)
    )
    runtime = Runtime(device=torch.device("cpu"), world_size=8, layout=layout)
    assert (
        runtime.gradient_average_size == 4
    )  # dp_shard x cp: FSDP2 over "dp_shard_cp"; tp peers hold one copy
    assert runtime.data_world_size == 2
    assert Runtime(device=torch.device("cpu"), world_size=3).gradient_average_size == 3


def test_cp_size_is_accepted_on_cuda_and_refused_on_cpu():
    from trainwright.distributed import parallelism

    args = TrainingArguments("out", parallelism_config={"cp_size": 2})
    cuda = SimpleNamespace(world_size=2, device=torch.device("cuda", 0), layout=None)
    assert parallelism.requested(args, cuda).cp_size == 2  # accepted on CUDA
    cpu = SimpleNamespace(world_size=2, device=torch.device("cpu"), layout=None)
    with pytest.raises(ValueError, match=r"cp_size=2 on cpu"):
        parallelism.requested(args, cpu)


# ---------------------------------------------------------------------------------- 4 gloo processes
@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory) -> list[dict]:
    out = str(tmp_path_factory.mktemp("cp4"))
    torchrun({"out": out}, nproc=4, script=job("cp_job.py"))
    seen = []
    for rank in range(4):
        with open(os.path.join(out, f"rank_{rank}.json")) as f:
            seen.append(json.load(f))
    return seen


def test_fsdp_shards_over_the_flattened_dp_shard_cp_mesh(four_ranks):
    for rank, seen in enumerate(four_ranks):
        shard = seen["meshes"]["shard2_cp2"]  # mesh (1, 2, 2, 1): rank = 2 x dp_shard + cp
        assert shard["names"] == ["dp_shard_cp"] and shard["ranks"] == [0, 1, 2, 3]
        assert shard["group"] == [0, 1, 2, 3]
        assert shard["data_rank"] == rank // 2  # the cp peers of a data-parallel rank read one batch
        hsdp = seen["meshes"]["rep2_cp2"]  # mesh (2, 1, 2, 1): replicas outside, shards over cp inside
        assert hsdp["names"] == ["dp_replicate", "dp_shard_cp"] and hsdp["ranks"] == [[0, 1], [2, 3]]
        assert hsdp["group"] == ([0, 1] if rank < 2 else [2, 3])
        assert hsdp["data_rank"] == rank // 2


def test_clipping_counts_each_shard_once_on_flattened_meshes(four_ranks):
    for rank, seen in enumerate(four_ranks):
        sharded, hsdp = seen["clip"]["shard2_cp2"], seen["clip"]["rep2_cp2"]
        assert sharded["counts_here"]  # 4 different shards
        assert hsdp["counts_here"] == (rank < 2)  # the first replica's copies
        for clip in (sharded, hsdp):
            assert clip["clip_norm"] == pytest.approx(clip["full_norm"], rel=1e-6)


def test_torch_shards_the_prepared_batch_head_and_tail_in_the_micro_batch_context(four_ranks):
    ids = torch.arange(1, 13).reshape(2, 6)
    prepared = prepare({"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}, 2)
    for seen in four_ranks:
        split = seen["split"]
        positions = _shards(prepared, 2)[split["cp_rank"]]
        want = {k: v[:, positions].tolist() for k, v in prepared.items()}
        assert split["shard"] == want
        for kind in ("dict", "BatchEncoding"):
            assert split["inside"][kind] == want  # the micro-batch context yields the shard
            assert split["restored"][kind]  # the loop's batch keeps its contents (and type) throughout


def test_cp_size_2_is_refused_on_cpu_processes_under_torchrun(four_ranks):
    for seen in four_ranks:
        assert "cp_size=2 on cpu" in seen["refused"]
        assert "_scaled_dot_product_flash_attention_for_cpu" in seen["refused"]


# ---------------------------------------------------------------------------------- the GPU check script
def test_the_gpu_check_plans_its_layouts_and_skips_without_two_gpus(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import cp_gpu

    assert cp_gpu.main(["--plan", "--gpus", "4", "--hsdp"]) == 0
    assert "one process, then cp=2, dp_shard=2 x cp=2, dp_replicate=2 x cp=2" in capsys.readouterr().out
    assert cp_gpu.main(["--gpus", "1"]) == 0  # nothing to compare on one GPU: says so, runs nothing
    assert "1 CUDA GPU(s) here" in capsys.readouterr().out
    gap = cp_gpu.compare([{"loss": 1.0, "grad_norm": 2.2}], [{"loss": 1.0, "grad_norm": 2.0}])
    assert gap == pytest.approx(0.1)
    with pytest.raises(SystemExit):
        cp_gpu.parse_arguments(["--global-batch", "3"])
