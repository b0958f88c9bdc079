"""Helpers the checkpoint tests share: small trained models, fake checkpoints, a folder's files, and a
regression run that saves checkpoints (for the tests that damage or edit them)."""

from __future__ import annotations

import os
import pathlib

import torch
from conftest import RegressionDataset, RegressionModel

import trainwright.checkpoint as ckpt
from trainwright import Trainer


# -- models ----------------------------------------------------------------------------------------------
def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def adamw(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.1, total_iters=10)
    return opt, sched


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def trained(width: int = 16, tied: bool = False) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A model and its AdamW after one step (so the optimizer has state to save)."""
    torch.manual_seed(0)
    if tied:
        model: torch.nn.Module = torch.nn.Sequential(torch.nn.Embedding(width, 8), torch.nn.Linear(8, width))
        model[1].weight = model[0].weight
        x = torch.arange(4)
    else:
        model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, 1))
        x = torch.randn(4, width)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(x).sum().backward()
    opt.step()
    return model, opt


class Touch:
    """Unpickling this creates `path`: the stand-in for a malicious payload."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (self.path,))


# -- folders ---------------------------------------------------------------------------------------------
def hidden_entries(folder) -> list[str]:
    return sorted(e for e in os.listdir(folder) if e.startswith("."))


def write_files(files: dict[str, bytes]):
    """A `write_fn` for write_checkpoint that writes `files` (name -> bytes)."""

    def write(tmp: str) -> None:
        for name, data in files.items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)

    return write


def fake_checkpoint(folder, step: int, content: bytes = b"x") -> str:
    return ckpt.write_checkpoint(
        folder,
        f"checkpoint-{step}",
        write_files({"model.safetensors": content, "trainer_state.json": b'{"global_step": 0}'}),
    )


def folder_files(folder) -> dict[str, bytes]:
    """Every file under `folder` (relative path -> bytes)."""
    out = {}
    for root, _, names in os.walk(folder):
        for n in names:
            full = os.path.join(root, n)
            with open(full, "rb") as f:
                out[os.path.relpath(full, folder)] = f.read()
    return out


def checkpoints(out) -> dict[str, dict[str, bytes]]:
    """The files of each checkpoint-* folder in `out`, in name order."""
    return {
        p: folder_files(os.path.join(out, p)) for p in sorted(os.listdir(out)) if p.startswith("checkpoint-")
    }


# -- a run to damage -------------------------------------------------------------------------------------
def run_regression(make_args, max_steps=6, resume=None, **kw):
    """Train RegressionModel saving every 2 steps; returns the trainer and its output_dir."""
    args = make_args(
        per_device_train_batch_size=4, max_steps=max_steps, save_strategy="steps", save_steps=2, **kw
    )
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=32))
    trainer.train(resume_from_checkpoint=resume)
    return trainer, args.output_dir


def flip_byte(path, offset_from_end=3):
    """Damage a file without changing its size: only a checksum can see it."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[-offset_from_end] ^= 0xFF
    with open(path, "wb") as f:
        f.write(bytes(data))
