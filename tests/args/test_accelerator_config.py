"""`accelerator_config`: upstream's AcceleratorConfig read by attribute and as a dict; the settings
trainwright honours (non_blocking, gradient_accumulation_kwargs num_steps / sync_each_batch, checked
with real torchrun processes; the data settings split_batches, dispatch_batches, even_batches and
use_seedable_sampler, in test_accelerator_data.py) and the ones it refuses, each with the key named."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from args_kit import make

from trainwright import Trainer, TrainingArguments
from trainwright.args.accelerator_config import AcceleratorConfig
from trainwright.core.runtime import Runtime

# ------------------------------------------------------------------------------- reading it


def test_read_by_attribute_and_as_a_dict_with_upstream_defaults():
    cfg = make().accelerator_config
    assert isinstance(cfg, AcceleratorConfig)
    assert cfg.split_batches is False and cfg["split_batches"] is False
    assert cfg.dispatch_batches is None and cfg.even_batches is True and cfg.use_seedable_sampler is True
    assert cfg.non_blocking is False and cfg.gradient_accumulation_kwargs is None
    assert cfg.get("even_batches") is True and "non_blocking" in cfg and "bogus" not in cfg
    assert dict(cfg) == cfg.to_dict() and cfg == {**cfg.to_dict()}
    assert json.loads(make().to_json_string())["accelerator_config"] == cfg.to_dict()


def test_transformers_accelerator_config_and_round_trip():
    hf = pytest.importorskip("transformers.trainer_pt_utils")
    a = make(accelerator_config=hf.AcceleratorConfig(non_blocking=True))
    assert a.accelerator_config.non_blocking is True
    assert TrainingArguments.from_dict(a.to_dict()).accelerator_config == a.accelerator_config


def test_num_steps_sets_gradient_accumulation_steps_as_upstream():
    a = make(accelerator_config={"gradient_accumulation_kwargs": {"num_steps": 4}})
    assert a.gradient_accumulation_steps == 4
    assert TrainingArguments.from_dict(a.to_dict()).gradient_accumulation_steps == 4  # round trip
    with pytest.raises(ValueError, match="gradient_accumulation_steps.*num_steps=4"):
        make(
            gradient_accumulation_steps=2,
            accelerator_config={"gradient_accumulation_kwargs": {"num_steps": 4}},
        )


@pytest.mark.parametrize(
    "config, key",
    [
        ({"non_blocking": "yes"}, "non_blocking"),
        ({"split_batches": 1}, "split_batches"),
        ({"dispatch_batches": "sometimes"}, "dispatch_batches"),
        ({"gradient_accumulation_kwargs": {"num_steps": 0}}, "gradient_accumulation_kwargs"),
        ({"gradient_accumulation_kwargs": {"bogus": 1}}, "gradient_accumulation_kwargs"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_refused_settings_name_the_key(config, key):
    with pytest.raises(ValueError, match=f"accelerator_config.*{key}"):
        make(accelerator_config=config)


def test_settings_without_effect_in_transformers_are_accepted():
    """transformers' Trainer steps its scheduler itself and decides where a step ends, so
    adjust_scheduler and sync_with_dataloader change nothing there: they are accepted here too."""
    kwargs = {"adjust_scheduler": False, "sync_with_dataloader": False}
    cfg = make(accelerator_config={"gradient_accumulation_kwargs": kwargs}).accelerator_config
    assert cfg.gradient_accumulation_kwargs == kwargs


@pytest.fixture
def accelerate_state():
    """accelerate's PartialState of this process, made for the test and forgotten after it."""
    state = pytest.importorskip("accelerate.state")
    state.PartialState._reset_state()
    yield state
    state.PartialState._reset_state()


def test_use_configured_state_needs_an_accelerate_state_made_first(accelerate_state, tmp_path):
    """As transformers: without an accelerate PartialState the arguments are refused; with one they
    are taken, and a Trainer runs on its processes (sentence-transformers builds such arguments)."""
    with pytest.raises(ValueError, match="use_configured_state.*PartialState"):
        make(accelerator_config={"use_configured_state": True})
    accelerate_state.PartialState(cpu=True)
    args = make(output_dir=str(tmp_path), accelerator_config={"use_configured_state": True}, report_to="none")
    assert args.accelerator_config.use_configured_state is True
    trainer = Trainer(model=_Net(), args=args)
    assert trainer.runtime.device.type == "cpu"


def test_use_configured_state_on_another_device_than_the_run_is_refused(accelerate_state, tmp_path):
    accelerate_state.PartialState(cpu=True)
    args = make(output_dir=str(tmp_path), accelerator_config={"use_configured_state": True}, report_to="none")
    state = accelerate_state.PartialState()
    state.__dict__["device"] = torch.device("meta")  # a state configured for another device
    with pytest.raises(ValueError, match="configured accelerate state trains on meta"):
        Trainer(model=_Net(), args=args)


def test_true_false_strings_from_a_dict_are_booleans():
    """As transformers reads a command line's JSON (`_convert_str_dict`): "True"/"false" are booleans."""
    cfg = make(
        accelerator_config={
            "split_batches": "True",
            "dispatch_batches": "FALSE",
            "even_batches": "false",
            "use_seedable_sampler": " true ",
            "non_blocking": "False",
            "gradient_accumulation_kwargs": {"sync_each_batch": "true", "num_steps": "2"},
        }
    ).accelerator_config
    assert (cfg.split_batches, cfg.dispatch_batches, cfg.even_batches) == (True, False, False)
    assert (cfg.use_seedable_sampler, cfg.non_blocking, cfg.sync_each_batch) == (True, False, True)
    assert cfg.gradient_accumulation_kwargs["num_steps"] == 2
    cli = make(accelerator_config='{"split_batches": "true", "even_batches": "False"}').accelerator_config
    assert (cli.split_batches, cli.even_batches) == (True, False)


def test_data_settings_that_other_arguments_contradict_are_refused():
    with pytest.raises(ValueError, match="data_seed.*use_seedable_sampler=False"):
        make(data_seed=3, accelerator_config={"use_seedable_sampler": False})
    with pytest.raises(ValueError, match="even_batches'\\]=False is not supported with fsdp"):
        make(fsdp="full_shard", accelerator_config={"even_batches": False})


def test_accepted_values_equal_to_the_defaults():
    cfg = make(
        accelerator_config={
            "split_batches": False,
            "dispatch_batches": False,
            "even_batches": True,
            "use_seedable_sampler": True,
            "gradient_accumulation_kwargs": {"adjust_scheduler": True, "sync_with_dataloader": True},
        }
    ).accelerator_config
    assert cfg.dispatch_batches is False and cfg.sync_each_batch is False


# ------------------------------------------------------------------------------- non_blocking


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)

    def forward(self, x, labels=None):
        return {"logits": self.lin(x)}


@pytest.mark.parametrize("non_blocking", [False, True])
def test_non_blocking_reaches_the_host_to_device_copy(monkeypatch, tmp_path, non_blocking):
    """On a CUDA device each batch tensor is copied with `non_blocking` as configured (the copy itself
    is recorded, not made, so this runs without a GPU)."""
    args = make(output_dir=str(tmp_path), accelerator_config={"non_blocking": non_blocking}, report_to="none")
    trainer = Trainer(model=_Net(), args=args)
    trainer.runtime = Runtime(device=torch.device("cuda", 0))
    calls = []
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **kw: calls.append((a, kw)) or self)
    trainer._prepare_inputs({"x": torch.ones(2, 2), "labels": [torch.zeros(2)]})
    assert calls == [((torch.device("cuda", 0),), {"non_blocking": non_blocking})] * 2


def test_a_batch_encoding_reaches_the_device_as_a_batch_encoding(tmp_path):
    """The accelerator path keeps a tokenizer's BatchEncoding (and nested tuples, and non-tensors) as given."""
    transformers = pytest.importorskip("transformers")
    trainer = Trainer(model=_Net(), args=make(output_dir=str(tmp_path), report_to="none"))
    trainer.runtime = Runtime(device=torch.device("meta"))  # not the CPU: the copy path runs
    batch = transformers.BatchEncoding(
        {"input_ids": torch.ones(2, 3, dtype=torch.long), "pair": (torch.zeros(2), "kept"), "n": 3}
    )
    moved = trainer._prepare_inputs(batch)
    assert type(moved) is transformers.BatchEncoding and list(moved) == ["input_ids", "pair", "n"]
    assert moved["input_ids"].device.type == "meta" and moved["input_ids"].dtype == torch.long
    assert (
        type(moved["pair"]) is tuple and moved["pair"][0].device.type == "meta" and moved["pair"][1] == "kept"
    )
    assert moved["n"] == 3 and batch["input_ids"].device.type == "cpu"  # the loader's batch is untouched


def test_non_blocking_without_pinned_memory_warns(caplog):
    with caplog.at_level("WARNING", logger="trainwright"):
        make(accelerator_config={"non_blocking": True}, dataloader_pin_memory=False)
    assert "non_blocking=True but dataloader_pin_memory=False" in caplog.text


# ------------------------------------------------------------- gradient accumulation, 2 processes


def test_sync_each_batch_num_steps_eval_use_gather_object_find_unused_with_two_processes(tmp_path):
    """Two gloo processes, 4 optimizer steps of 2 micro-batches. By default gradients are all-reduced
    once per step (4 syncs); sync_each_batch=True all-reduces every micro-batch (8) and gives the same
    weights; num_steps=2 is the same run as gradient_accumulation_steps=2."""
    from kit import job
    from kit.torchrun import torchrun, weights

    common = {"per_device_train_batch_size": 2, "max_steps": 4}
    tasks = [
        {"name": "ga", "predict": 13, "args": {**common, "gradient_accumulation_steps": 2}},
        {
            "name": "gather_object",
            "predict": 13,
            "args": {**common, "gradient_accumulation_steps": 2, "eval_use_gather_object": True},
        },
        {
            "name": "sync_each",
            "args": {
                **common,
                "gradient_accumulation_steps": 2,
                "accelerator_config": {"gradient_accumulation_kwargs": {"sync_each_batch": True}},
            },
        },
        {"name": "find_unused", "args": {**common, "ddp_find_unused_parameters": True}},
        {
            "name": "num_steps",
            "args": {**common, "accelerator_config": {"gradient_accumulation_kwargs": {"num_steps": 2}}},
        },
    ]
    torchrun({"out": str(tmp_path), "tasks": tasks}, script=job("accelerator_job.py"))

    def syncs(name):
        return [json.load(open(tmp_path / name / f"syncs_{r}.json")) for r in range(2)]

    assert syncs("ga") == [4, 4]
    assert syncs("sync_each") == [8, 8]
    assert syncs("num_steps") == [4, 4]
    # ddp_find_unused_parameters reaches the DDP wrapper (not given: transformers' default, on for a
    # model that is not a transformers model checkpointing activations)
    ddp = [
        json.load(open(tmp_path / name / "ddp_0.json"))["find_unused_parameters"]
        for name in ("ga", "find_unused")
    ]
    assert ddp == [True, True]
    # eval_use_gather_object: the per-process outputs are gathered as Python objects (trainwright always
    # does) and come back whole and in dataset order, as without it
    with (
        np.load(tmp_path / "ga" / "predictions.npz") as plain,
        np.load(tmp_path / "gather_object" / "predictions.npz") as obj,
    ):
        assert obj["predictions"].shape == (13,)
        np.testing.assert_allclose(obj["predictions"], plain["predictions"])
        np.testing.assert_allclose(obj["labels"], plain["labels"])
    ga = weights(str(tmp_path / "ga"))
    for name in ("sync_each", "num_steps"):
        other = weights(str(tmp_path / name))
        for k in ga:
            np.testing.assert_allclose(other[k].numpy(), ga[k].numpy(), atol=2e-6, rtol=1e-5, err_msg=k)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: copies to the CPU are not made")
def test_non_blocking_training_on_cuda_matches_blocking_copies(tmp_path):
    from test_args_fields import Data, Net, make_args

    weights = []
    for non_blocking in (False, True):
        model = Net()
        args = make_args(
            tmp_path / str(non_blocking),
            use_cpu=False,
            max_steps=4,
            dataloader_pin_memory=True,
            accelerator_config={"non_blocking": non_blocking},
        )
        trainer = Trainer(model=model, args=args, train_dataset=Data(32))
        assert trainer.runtime.device.type == "cuda"
        trainer.train()
        weights.append(model.lin.weight.detach().cpu())
    torch.testing.assert_close(weights[0], weights[1])
