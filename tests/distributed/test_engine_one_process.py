"""The engine in one process, without a launcher: the settings it chooses where the arguments leave
them unset (as transformers decides them), the FSDP wrap plan, and the errors that name what to fix."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from jobs import dist_job
from kit import hf
from kit.torchrun import launch_env

from trainwright.distributed.engine import find_unused_default
from trainwright.distributed.fsdp import _wrap_units, fsdp2_supported


def test_find_unused_parameters_defaults_as_transformers_decides_it():
    args = SimpleNamespace(activation_checkpointing=False)
    assert find_unused_default(args, torch.nn.Linear(2, 2)) is True  # not a transformers model: on
    model = hf.gpt2()
    assert find_unused_default(args, model) is True
    model.gradient_checkpointing_enable()
    assert find_unused_default(args, model) is False  # checkpointed activations: off
    assert find_unused_default(SimpleNamespace(activation_checkpointing=True), hf.gpt2()) is False


def test_fsdp2_needs_a_recent_torch_by_name(monkeypatch):
    """FSDP2 on a torch below fsdp.FSDP2_MIN_TORCH is refused before any sharding, naming the torch
    and the fix (the floor's torch for real; a newer one told it is 2.6)."""
    from trainwright.distributed import fsdp

    if fsdp2_supported():
        monkeypatch.setattr(torch, "__version__", "2.6.0+cpu")
    assert not fsdp2_supported()
    with pytest.raises(
        RuntimeError, match=r"needs torch>=2\.9; this is torch 2\.\d+\.\d+.*pip install 'torch>=2\.9'"
    ):
        fsdp.shard_model(torch.nn.Linear(2, 2), None, None)


def test_fsdp_auto_wrap_picks_layers_innermost_first():
    model = dist_job.build_model("lm")
    units = _wrap_units(model, ["full_shard", "auto_wrap"], {"transformer_layer_cls_to_wrap": ["_Block"]})
    assert units == [model.blocks[1], model.blocks[0]]
    # the size rule shards children before their parents, each parameter in one unit
    sized = _wrap_units(model, ["full_shard"], {"min_num_params": 1100})
    assert sized.index(model.blocks[0].mlp) < sized.index(model.blocks[0])
    assert model.blocks[0].attn not in sized  # 1088 parameters: left to its block
    assert _wrap_units(model, ["full_shard"], {}) == []


def test_fsdp_auto_wrap_errors_name_the_setting():
    model = dist_job.build_model("lm")
    with pytest.raises(ValueError, match=r"no submodule of class \['GPT2Block'\].*_Block"):
        _wrap_units(model, ["auto_wrap"], {"transformer_layer_cls_to_wrap": ["GPT2Block"]})
    with pytest.raises(ValueError, match="transformer_layer_cls_to_wrap.*min_num_params"):
        _wrap_units(model, ["auto_wrap"], {})


def test_one_process_with_fsdp_trains_unsharded(make_args, caplog):
    from trainwright.core.runtime import get_runtime
    from trainwright.distributed.engine import Engine
    from trainwright.distributed.engines import build_engine

    runtime = get_runtime(use_cpu=True)
    model = dist_job.build_model("mlp")
    with caplog.at_level("WARNING", logger="trainwright.distributed.engines"):
        engine = build_engine(make_args(fsdp="full_shard"), runtime, model)
    assert runtime.world_size == 1 and type(engine) is Engine and engine.wrap(model) is model
    assert "this is one process: training without sharding" in caplog.text


def test_an_engine_step_before_start_is_an_error_not_a_silent_skip(make_args):
    """The step's parts are bound in start(): before it, backward/clip/step raise instead of doing nothing."""
    from trainwright.core.runtime import get_runtime
    from trainwright.distributed.engines import build_engine

    engine = build_engine(
        make_args(max_grad_norm=1.0), get_runtime(use_cpu=True), dist_job.build_model("mlp")
    )
    for call in (
        lambda: engine.backward(torch.ones((), requires_grad=True)),
        engine.clip,
        lambda: engine.step(None),
    ):
        with pytest.raises(RuntimeError, match=r"before Engine.start\(\)"):
            call()


def test_fsdp_refuses_a_prebuilt_optimizer(make_args):
    from trainwright.loop.trainer import Trainer

    model = dist_job.build_model("mlp")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="optimizer_cls_and_kwargs"):
        Trainer(model=model, args=make_args(fsdp="full_shard"), optimizers=(optimizer, None))


def test_world_size_without_a_rendezvous_address_is_a_clear_error():
    env = {**launch_env(), "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}
    env.pop("MASTER_ADDR", None)
    code = "from trainwright.core.runtime import get_runtime; get_runtime(use_cpu=True)"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "MASTER_ADDR and MASTER_PORT is not set: launch with torchrun" in proc.stderr


def test_uncaught_errors_reach_torchelastics_error_file(tmp_path, monkeypatch):
    from trainwright.core import runtime
    from trainwright.core.runtime import _error_file_hook

    monkeypatch.setattr(runtime, "_FAILED", False)  # the hook marks the process as failing
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    seen = []
    hook = _error_file_hook(lambda *exc: seen.append(exc[0]))
    try:
        raise KeyError("lost")
    except KeyError as exc:
        hook(type(exc), exc, exc.__traceback__)
    message = json.loads(path.read_text())["message"]
    assert message["message"] == "KeyError: 'lost'"
    assert "raise KeyError" in message["extraInfo"]["py_callstack"]
    assert seen == [KeyError]  # the usual report still runs
    assert runtime._FAILED  # so the exit handler leaves the process group alone
