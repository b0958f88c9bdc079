"""Helpers shared by the tests of tests/args/: building arguments, the fixtures and data of the
loop-feature tests, and the dataclasses the HfArgumentParser tests parse."""

# String annotations on purpose: the parser's dataclasses below go through typing.get_type_hints.
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Literal, Optional, Union

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

import trainwright.args.aliases as aliases_mod
from trainwright import Trainer
from trainwright.args.parser import HfArg, HfArgumentParser
from trainwright.args.training_args import TrainingArguments
from trainwright.core import runtime as runtime_mod

# ------------------------------------------------------------------------- building arguments


def make(**kwargs) -> TrainingArguments:
    kwargs.setdefault("output_dir", "out")
    return TrainingArguments(**kwargs)


def future_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, FutureWarning)]


@pytest.fixture(autouse=True)
def fresh_old_name_warnings(monkeypatch):
    """Autouse where imported: old-name warnings are emitted once per process, so every test gets a
    fresh record (and leaves the process's record as it found it)."""
    monkeypatch.setattr(aliases_mod, "_WARNED", set())


# ------------------------------------------------------------------------ loop-feature runs

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture(name="fresh_runtime")  # imported under its function name: no clash with the argument
def fresh_runtime_fixture(monkeypatch):
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


@pytest.fixture(name="evaluating_trainer")  # imported under its function name, as fresh_runtime
def evaluating_trainer_fixture(make_args):
    """`evaluating_trainer(eval_steps, model, data, **args)`: a Trainer with batches of 4 that trains on
    `data` and evaluates on it every `eval_steps` steps."""

    def build(eval_steps: int, model: nn.Module, data: Dataset, **kw) -> Trainer:
        kw.setdefault("per_device_train_batch_size", 4)
        args = make_args(eval_strategy="steps", eval_steps=eval_steps, **kw)
        return Trainer(model=model, args=args, train_dataset=data, eval_dataset=data)

    return build


# ------------------------------------------------------------------- HfArgumentParser inputs


class Color(Enum):
    RED = "red"
    GREEN = "green"


class Level(Enum):
    LOW = 1
    HIGH = 2


class Mode(str, Enum):
    FAST = "fast"
    SLOW = "slow"


@dataclass
class Scalars:
    name: str
    steps: int = 10
    ratio: float = 0.5
    path: Optional[Path] = None
    count: int | None = None


@dataclass
class Flags:
    bare: bool = HfArg(help="no default: an off-by-default flag")
    debug: bool = False
    verbose: bool = True
    maybe: Optional[bool] = None
    maybe_on: bool | None = True
    tokens: Union[bool, str] = False
    seen: Union[str, bool] = "no"
    debug_opts: Union[str, list[Color]] = ""


@dataclass
class Choices:
    color: Color = Color.RED
    level: Level = Level.LOW
    mode: Union[Mode, str] = "fast"
    speed: Mode = Mode.SLOW  # a str-mixin member default goes through the converter as a str
    opt: Literal["a", "b", 3] = "a"
    palette: list[Color] = field(default_factory=lambda: [Color.RED])


@dataclass
class Containers:
    tags: list[str] = field(default_factory=lambda: ["x"])
    sizes: Optional[list[int]] = None
    extra: dict = field(default_factory=dict)
    cfg: Union[dict, str, None] = None
    budget: Union[int, str] = 5


@dataclass
class Model:
    _argument_group_name = "Model options"
    hidden: int = HfArg(default=32, aliases=["--width", "-w"], help="hidden size")
    dropout: float = HfArg(default=0.1, metadata={"metavar": "P", "other_tool_key": 1})


@dataclass
class Train:
    learning_rate: float = 1e-3
    epochs: int = 1
    run_name: str = HfArg(default="run")
    internal: int = field(default=7, init=False)


def parse(dtypes, argv, **kwargs):
    return HfArgumentParser(dtypes).parse_args_into_dataclasses(argv, look_for_args_file=False, **kwargs)
