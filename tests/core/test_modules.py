"""`core.modules.unwrap_model`: the one function that finds the user's module behind DDP,
DataParallel and torch.compile, used by data columns, reporters, FLOP counting and weights."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from trainwright.core.modules import unwrap_model


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 2)
        self.config = {"hidden": 4}

    def forward(self, input_ids, labels=None):
        return self.proj(input_ids)


@pytest.fixture
def one_process_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_ddp_module_is_unwrapped(one_process_group):
    net = _Net()
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    assert unwrap_model(ddp) is net
    assert unwrap_model(torch.nn.DataParallel(net)) is net


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # raised by torch.compile's imports
def test_compiled_and_nested_wrappers_are_unwrapped(one_process_group):
    net = _Net()
    compiled = torch.compile(net)
    assert type(compiled).__name__ == "OptimizedModule" and unwrap_model(compiled) is net
    ddp_of_compiled = torch.nn.parallel.DistributedDataParallel(compiled)
    assert unwrap_model(ddp_of_compiled) is net
    assert unwrap_model(torch.compile(torch.nn.parallel.DistributedDataParallel(net))) is net
    assert unwrap_model(torch.compile(torch.nn.DataParallel(torch.compile(net)))) is net


def test_other_objects_are_returned_as_they_are():
    net = _Net()
    assert unwrap_model(net) is net and unwrap_model(None) is None
    assert unwrap_model(torch.nn.Sequential(net))[0] is net  # a container is the user's own module
    odd = _Net()
    odd._orig_mod = "not a module"  # only a module behind `_orig_mod` is a compile wrapper
    assert unwrap_model(odd) is odd


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_every_user_sees_through_the_wrappers():
    from trainwright.checkpoint.weights import model_state_dict
    from trainwright.data.columns import forward_arg_names
    from trainwright.modeling.loss import is_causal_lm
    from trainwright.observe.flops import FlopsEstimator
    from trainwright.reporters.helpers import model_config_dict

    net = _Net()
    net.label_shift = True
    wrapped = torch.compile(torch.nn.DataParallel(net))
    assert set(model_state_dict(wrapped)) == {"proj.weight", "proj.bias"}
    assert {"input_ids", "labels"} <= forward_arg_names(wrapped)
    assert model_config_dict(wrapped) == {"hidden": 4}
    assert is_causal_lm(wrapped)
    assert FlopsEstimator(wrapped).module is net
