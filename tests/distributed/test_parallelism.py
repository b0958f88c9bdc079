"""N-D parallelism (`parallelism_config`): real torchrun processes on gloo, a tiny Llama from its config.

Why the comparisons against one process are fair: the data-parallel ranks (processes that differ in
their dp_replicate / dp_shard coordinates) deal the epoch's order as DDP ranks do, and the
tensor-parallel peers of a rank read the same batch. With per-device batch b, accumulation g and D
data-parallel ranks, every optimizer step reads the same b*g*D = 8 samples as one process with batch
8, and the token-weighted loss divides by the step's label tokens summed over the data-parallel
ranks. So losses, gradient norms (clipped at max_grad_norm=1: they are above it) and weights must
agree with one process up to float summation order.

Two launches: a 2-process one (tp=2; dp_shard=2; tp=2 with tied embeddings) and a 4-process one
(tp=2 x dp_shard=2, saving at step 2; dp_replicate=2 x dp_shard=2; dp_replicate=2 x tp=2; then fresh
Trainers and models in the same processes that resume the step-2 checkpoint on the same layout and on
dp_shard=4). The step-2 checkpoint is also resumed here, in one unsharded process.
"""

from __future__ import annotations

import json
import logging
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from jobs import dist_job
from kit import ROOT
from kit.torchrun import SGD, assert_close_weights, launch_env, result, torchrun, weights

from trainwright.args.parallelism import ParallelismSizes, parse
from trainwright.args.training_args import TrainingArguments
from trainwright.distributed import parallelism
from trainwright.distributed.fsdp import MODEL_DIR, OPTIMIZER_DIR

TP2_SHARD2 = {"tp_size": 2, "dp_shard_size": 2}


def _task(name: str, parallel: dict | None, per_device: int, **extra) -> dict:
    args = {**SGD, "per_device_train_batch_size": per_device, "gradient_accumulation_steps": 2}
    if parallel is not None:
        args["parallelism_config"] = parallel
    args.update(extra.pop("args", {}))
    return {"name": name, "model": "llama", **extra, "args": args}


def probes(folder: str, n: int) -> list[dict]:
    out = []
    for rank in range(n):
        with open(os.path.join(folder, f"probe_{rank}.json")) as f:
            out.append(json.load(f))
    return out


@pytest.fixture(scope="module")
def two_procs(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("nd2"))
    tasks = [
        # rank 1 initialises its model differently: every process must start from rank 0's weights
        _task("tp2", {"tp_size": 2}, 4, init_seed_per_rank=True),
        _task("shard2", {"dp_shard_size": 2}, 2, init_seed_per_rank=True),
        _task("tp2_tied", {"tp_size": 2}, 4, model="llama_tied"),
    ]
    torchrun({"out": out, "tasks": tasks}, nproc=2)
    return out


@pytest.fixture(scope="module")
def four_procs(tmp_path_factory) -> tuple[str, str]:
    out = str(tmp_path_factory.mktemp("nd4"))
    saved = os.path.join(out, "tp2_shard2", "checkpoint-2")
    tasks = [
        _task("tp2_shard2", TP2_SHARD2, 2, predict=13, args={"save_strategy": "steps", "save_steps": 2}),
        _task("rep2_shard2", {"dp_replicate_size": 2, "dp_shard_size": 2}, 1),
        _task("rep2_tp2", {"dp_replicate_size": 2, "tp_size": 2}, 2),  # accelerate refuses it; HSDP does it
        _task("resumed_same_layout", TP2_SHARD2, 2, resume=saved),
        _task("resumed_shard4", {"dp_shard_size": 4}, 1, resume=saved),
    ]
    _, log = torchrun({"out": out, "level": 20, "tasks": tasks}, nproc=4, timeout=300)
    return out, log


@pytest.fixture(scope="module")
def one_proc(tmp_path_factory) -> str:
    """The same global batch of 8 in this one process."""
    out = str(tmp_path_factory.mktemp("nd1"))
    one = {"gradient_accumulation_steps": 1}
    dist_job.run_task(_task("llama", None, 8, predict=13, args=one), out)
    dist_job.run_task(_task("llama_tied", None, 8, model="llama_tied", args=one), out)
    return out


def rows(folder: str) -> list[dict]:
    return result(folder)["rows"]


def assert_same_training(folder: str, reference: str) -> None:
    got, ref = rows(folder), rows(reference)
    assert [r["step"] for r in got] == [r["step"] for r in ref] == [1, 2, 3, 4]
    for key in ("loss", "grad_norm"):
        np.testing.assert_allclose([r[key] for r in got], [r[key] for r in ref], rtol=1e-5, err_msg=key)
    assert all(r["grad_norm"] > 1.0 for r in ref)  # clipped at max_grad_norm=1.0 in every step
    assert_close_weights(weights(folder), weights(reference), atol=1e-5)


# ------------------------------------------------------------------------------ the same losses as one process
@pytest.mark.parametrize("name", ["tp2", "shard2"])
def test_two_process_layouts_match_one_process(two_procs, one_proc, name):
    assert_same_training(os.path.join(two_procs, name), os.path.join(one_proc, "llama"))


def test_tied_embeddings_stay_one_parameter_under_tensor_parallel(two_procs, one_proc):
    # the input embeddings (embedding_rowwise) and the LM head (colwise_gather_output) are one weight
    assert_same_training(os.path.join(two_procs, "tp2_tied"), os.path.join(one_proc, "llama_tied"))


def test_tensor_parallel_peers_keep_identical_copies_of_replicated_weights(four_procs):
    # ranks 0 and 1 are tensor-parallel peers (same data-parallel rank) and hold the same FSDP shard of
    # the final norm, which no tensor-parallel rule splits: the clipped update must be the same bits
    first, peer, other, _ = probes(os.path.join(four_procs[0], "tp2_shard2"), 4)
    assert first["norm_weight"] == peer["norm_weight"]
    assert first["norm_weight"] != other["norm_weight"]  # the other data-parallel rank's shard


@pytest.mark.parametrize("name", ["tp2_shard2", "rep2_shard2", "rep2_tp2"])
def test_four_process_layouts_match_one_process(four_procs, one_proc, name):
    assert_same_training(os.path.join(four_procs[0], name), os.path.join(one_proc, "llama"))


def test_flops_are_counted_once_per_data_parallel_rank(two_procs, four_procs):
    # tp=2 x dp_shard=2 and dp_shard=2 deal the same batches to their 2 data-parallel ranks; the
    # tensor-parallel peers of a rank count its batch once, so the totals are the same (not 2x)
    shard2 = result(os.path.join(two_procs, "shard2"))["log_history"][-1]["total_flos"]
    tp2_shard2 = result(os.path.join(four_procs[0], "tp2_shard2"))["log_history"][-1]["total_flos"]
    assert tp2_shard2 == shard2 > 0
    live = "total_flos_at_step_end"  # TrainerState's, as callbacks see it at every step end
    nd = probes(os.path.join(four_procs[0], "tp2_shard2"), 4)
    assert nd[0][live] == probes(os.path.join(two_procs, "shard2"), 2)[0][live]
    assert [p["samples_run"] for p in nd] == [4 * 8] * 4  # 4 steps of 8 samples, not 8 of them


def test_tensor_parallel_evaluation_gathers_each_batch_once(four_procs, one_proc):
    nd, one = (
        np.load(os.path.join(four_procs[0], "tp2_shard2", "predictions.npz")),
        np.load(os.path.join(one_proc, "llama", "predictions.npz")),
    )
    assert nd["labels"].shape[0] == one["labels"].shape[0] == 13  # not 26: tp peers' copies dropped
    np.testing.assert_array_equal(nd["labels"], one["labels"])
    valid = nd["labels"] != -100
    np.testing.assert_allclose(nd["predictions"][valid], one["predictions"][valid], atol=1e-4)
    m_nd, m_one = (
        result(os.path.join(four_procs[0], "tp2_shard2"))["metrics"],
        result(os.path.join(one_proc, "llama"))["metrics"],
    )
    assert m_nd["test_token_accuracy"] == m_one["test_token_accuracy"]


def test_save_model_writes_weights_from_pretrained_loads(four_procs, one_proc):
    import transformers

    final = os.path.join(four_procs[0], "tp2_shard2", "final")
    model = transformers.LlamaForCausalLM.from_pretrained(final)
    reference = weights(os.path.join(one_proc, "llama"))
    loaded = {k: v for k, v in model.state_dict().items() if k in reference}
    assert set(loaded) == set(reference)
    assert_close_weights(loaded, reference, atol=1e-5)


# ------------------------------------------------------------------------------ checkpoints
def test_checkpoints_are_dcp_folders_in_the_checksummed_layout(four_procs):
    import trainwright.checkpoint as ckpt

    checkpoint = os.path.join(four_procs[0], "tp2_shard2", "checkpoint-2")
    assert not ckpt.verify_checkpoint(checkpoint)  # the manifest covers every file
    for sub in (MODEL_DIR, OPTIMIZER_DIR):
        names = os.listdir(os.path.join(checkpoint, sub))
        assert ".metadata" in names and len([n for n in names if n.endswith(".distcp")]) == 4, names
    assert not os.path.exists(os.path.join(checkpoint, "model.safetensors"))
    with open(os.path.join(checkpoint, "data_state.json")) as f:
        assert json.load(f)["world_size"] == 2  # the position is per data-parallel rank
    with open(os.path.join(checkpoint, "training_args.json")) as f:
        saved = json.load(f)["parallelism_config"]
    assert (saved["tp_size"], saved["dp_shard_size"]) == (2, 2)


def test_resume_on_the_same_layout_is_bit_identical(four_procs):
    out, _ = four_procs
    full, resumed = os.path.join(out, "tp2_shard2"), os.path.join(out, "resumed_same_layout")
    # the saved log history, then steps 3 and 4: every logged loss, grad norm and rate, exactly
    assert [r["step"] for r in rows(resumed)] == [1, 2, 3, 4]
    assert rows(resumed) == rows(full)
    full_w, res_w = weights(full), weights(resumed)
    for k in full_w:
        assert torch.equal(res_w[k], full_w[k]), k


def test_resume_on_dp_shard_4_reshards_and_continues_with_the_same_loss(four_procs):
    out, log = four_procs
    full, resumed = rows(os.path.join(out, "tp2_shard2")), rows(os.path.join(out, "resumed_shard4"))
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]  # the saved log history, then steps 3 and 4
    np.testing.assert_allclose([r["loss"] for r in resumed[2:]], [r["loss"] for r in full[2:]], rtol=1e-5)
    assert_close_weights(
        weights(os.path.join(out, "resumed_shard4")), weights(os.path.join(out, "tp2_shard2")), atol=1e-5
    )
    assert "written by dp_shard=2 x tp=2 (4 processes), into dp_shard=4 (4 processes)" in log
    assert "no longer bit-for-bit" in log


def test_resume_in_one_process_reshards_and_continues_with_the_same_loss(four_procs, tmp_path, caplog):
    out, _ = four_procs
    saved = os.path.join(out, "tp2_shard2", "checkpoint-2")
    with caplog.at_level(logging.WARNING, logger="trainwright"):
        with pytest.warns(UserWarning, match="RNG state not restored"):  # rng_state.pth: one process's file
            dist_job.run_task(
                _task("one", None, 8, resume=saved, args={"gradient_accumulation_steps": 1}), str(tmp_path)
            )
    full = rows(os.path.join(out, "tp2_shard2"))
    resumed = rows(os.path.join(tmp_path, "one"))
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]  # the saved log history, then steps 3 and 4
    np.testing.assert_allclose([r["loss"] for r in resumed[2:]], [r["loss"] for r in full[2:]], rtol=1e-5)
    assert_close_weights(
        weights(os.path.join(tmp_path, "one")), weights(os.path.join(out, "tp2_shard2")), atol=1e-5
    )
    assert "written by dp_shard=2 x tp=2 (4 processes), into one process" in caplog.text


# ------------------------------------------------------------------------------ arguments
def test_parallelism_config_from_accelerate_a_dict_or_json():
    from accelerate import ParallelismConfig

    want = ParallelismSizes(dp_replicate_size=1, dp_shard_size=2, tp_size=2, cp_size=1)
    assert parse(ParallelismConfig(dp_shard_size=2, tp_size=2)) == want
    assert parse({"dp_shard_size": 2, "tp_size": 2}) == want
    args = TrainingArguments("out", parallelism_config='{"dp_shard_size": 2, "tp_size": 2}')
    assert args.parallelism_config == want
    saved = args.to_dict()["parallelism_config"]
    assert saved["tp_size"] == 2 and TrainingArguments.from_dict(args.to_dict()).parallelism_config == want


@pytest.mark.parametrize(
    "value, named",
    [
        ({"tp_size": 0}, "tp_size=0"),
        ({"dp_shard_size": "2"}, "dp_shard_size='2'"),
        ({"tp_sizes": 2}, "unknown key(s) ['tp_sizes']"),
        ({"sp_size": 2}, "sp_size=2"),
        ({"cp_backend": "ring"}, "cp_backend='ring'"),
        ({"tp_size": 2, "tp_handler": {"enable_async_tp": True}}, "enable_async_tp"),
        (object(), "got a object"),
    ],
)
def test_parallelism_config_values_that_cannot_be_honoured_are_refused(value, named):
    with pytest.raises(ValueError, match="parallelism_config") as info:
        TrainingArguments("out", parallelism_config=value)
    assert named in str(info.value)


@pytest.mark.parametrize(
    "extra, named",
    [
        ({"deepspeed": {"train_batch_size": "auto"}}, "deepspeed"),
        ({"fsdp": "hybrid_shard"}, "hybrid_shard"),
        ({"auto_find_batch_size": True}, "auto_find_batch_size"),
    ],
)
def test_parallelism_config_is_refused_with_what_contradicts_it(extra, named):
    with pytest.raises(ValueError, match=f"parallelism_config=.*{named}"):
        TrainingArguments("out", parallelism_config={"dp_shard_size": 2}, **extra)


def _runtime(world: int, device: str = "cpu") -> SimpleNamespace:
    return SimpleNamespace(world_size=world, device=torch.device(device), layout=None)


def test_sizes_must_multiply_to_the_world_size():
    args = TrainingArguments("out", parallelism_config={"tp_size": 2, "dp_shard_size": 2})
    with pytest.raises(ValueError, match=r"dp_shard_size=2 x cp_size=1 x tp_size=2 = 4 processes.*has 2"):
        parallelism.requested(args, _runtime(2))
    assert parallelism.requested(args, _runtime(4)) == parse(TP2_SHARD2)
    # all sizes 1 is accelerate's plain DDP over every process: no mesh, the plain engine
    assert parallelism.requested(TrainingArguments("out", parallelism_config={}), _runtime(4)) is None


def test_context_parallel_is_refused_on_cpu_saying_why():
    args = TrainingArguments("out", parallelism_config={"cp_size": 2})
    with pytest.raises(ValueError, match=r"cp_size=2 on cpu.*_scaled_dot_product_flash_attention_for_cpu"):
        parallelism.requested(args, _runtime(2))


# ------------------------------------------------------------------------------ the model's plan
def _llama() -> torch.nn.Module:
    return dist_job.build_model("llama")


def test_the_llama_plan_maps_onto_torch_parallel_styles():
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = parallelism.tensor_parallel_plan(_llama(), 2)
    assert len(plan) == 2 * 7 + 2  # 7 projections per layer, the embeddings, the LM head
    assert type(plan["model.layers.1.self_attn.q_proj"]) is ColwiseParallel
    assert type(plan["model.layers.0.mlp.down_proj"]) is RowwiseParallel
    assert plan["lm_head"].output_layouts == (Replicate(),)  # colwise_gather_output
    assert plan["model.embed_tokens"].input_layouts == (Replicate(),)  # embedding_rowwise


def test_a_model_without_a_plan_is_refused_by_name():
    with pytest.raises(ValueError, match="tp_size=2, but TinyGPT has no tensor-parallel plan"):
        parallelism.tensor_parallel_plan(dist_job.build_model("lm"), 2)


def test_plan_styles_torch_cannot_honour_are_refused():
    model = _llama()
    model._tp_plan = {**model.tp_plan, "model.layers.*.mlp.up_proj": "packed_colwise"}
    with pytest.raises(ValueError, match="model.layers.0.mlp.up_proj the style 'packed_colwise'"):
        parallelism.tensor_parallel_plan(model, 2)
    with pytest.raises(ValueError, match="tp_size=4 does not divide the model's num_key_value_heads=2"):
        parallelism.tensor_parallel_plan(_llama(), 4)


def test_each_trainer_has_its_own_layout_and_the_process_runtime_none(monkeypatch):
    """The layout is the Trainer's: a view of the process runtime holding it; a Trainer built later
    with another layout does not change an earlier one's (no guard needed at train())."""
    from trainwright.core.runtime import Runtime

    process = Runtime(device=torch.device("cpu"), world_size=4, _owns_group=True)
    monkeypatch.setattr(parallelism, "layout_of", lambda sizes, runtime: SimpleNamespace(sizes=sizes.sizes))
    first = parallelism.with_layout(TrainingArguments("out", parallelism_config=TP2_SHARD2), process)
    second = parallelism.with_layout(
        TrainingArguments("out", parallelism_config={"dp_shard_size": 4}), process
    )
    plain = parallelism.with_layout(TrainingArguments("out"), process)
    assert first.layout.sizes == parse(TP2_SHARD2).sizes and first.parallel_size("tp") == 2
    assert second.layout.sizes["dp_shard"] == 4 and second.parallel_size("tp") == 1
    assert plain is process and process.layout is None  # the process's runtime never holds a layout
    assert not first._owns_group and process._owns_group  # the group stays the process runtime's to end
    assert (first.world_size, first.device) == (process.world_size, process.device)


def test_a_model_sharded_by_transformers_at_load_is_refused_with_the_fix():
    from trainwright.distributed.engines import build_engine

    model = _llama()
    model._is_distributed_loading_by_transformers = True  # what from_pretrained(tp_plan="auto") sets
    args = TrainingArguments("out", parallelism_config={"tp_size": 2})
    with pytest.raises(ValueError, match=r"sharded when it was loaded.*parallelism_config=\{\"tp_size\""):
        build_engine(args, _runtime(2), model)


def test_the_worked_example_runs_as_written(tmp_path):
    """docs/parallelism.md's script, under torchrun with 4 CPU processes."""
    import re
    import subprocess

    import transformers
    from kit.torchrun import torchrun_command

    doc = (ROOT / "docs" / "parallelism.md").read_text()
    (tmp_path / "train.py").write_text(re.findall(r"```python\n(.*?)```", doc, flags=re.S)[0])
    cmd = [*torchrun_command(4), "train.py"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=launch_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "trained 20 steps; tensor parallel size 2" in proc.stdout
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out-nd" / "final")
    assert model.config.hidden_size == 64
    for step in (10, 20):
        assert (tmp_path / "out-nd" / f"checkpoint-{step}" / MODEL_DIR / ".metadata").is_file()
