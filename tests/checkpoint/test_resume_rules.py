"""What a resume refuses, and what it keeps from the checkpoint (with a warning naming the fields)."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from conftest import DropoutMLP, VectorDataset

from trainwright import Trainer


def args_for(make_args, **kw):
    base = dict(
        per_device_train_batch_size=4,
        max_steps=10,
        save_strategy="steps",
        save_steps=5,
        learning_rate=0.05,
        warmup_steps=2,
        seed=1,
        logging_steps=1,
    )
    return make_args(**{**base, **kw})


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train(make_args, resume=None, **kw):
    torch.manual_seed(0)
    model = DropoutMLP(p=0.0)
    trainer = Trainer(model=model, args=args_for(make_args, **kw), train_dataset=VectorDataset(n=40))
    trainer.train(resume_from_checkpoint=resume)
    return trainer, weights(model)


def ckpt(make_args, step=5):
    return os.path.join(args_for(make_args).output_dir, f"checkpoint-{step}")


def test_changed_seed_keeps_the_checkpoints_data_order(make_args, caplog):
    _, straight = train(make_args)
    with caplog.at_level(logging.WARNING, logger="trainwright"):
        trainer, resumed = train(make_args, resume=ckpt(make_args), seed=2)
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k
    assert "seed=2 now, the checkpoint's data order was drawn with 1" in caplog.text
    assert trainer.get_train_dataloader().sampler.seed == 2  # a new run uses the new seed


def test_changed_data_seed_is_named_too(make_args, caplog):
    _, straight = train(make_args)
    with caplog.at_level(logging.WARNING, logger="trainwright"):
        _, resumed = train(make_args, resume=ckpt(make_args), data_seed=7)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    assert "data_seed=7 now" in caplog.text


def test_a_checkpoint_without_optimizer_is_refused_unless_opted_in(make_args):
    train(make_args)
    os.remove(os.path.join(ckpt(make_args), "optimizer.pt"))
    with pytest.raises(ValueError, match="no optimizer.pt.*save_only_model=True"):
        train(make_args, resume=ckpt(make_args))
    trainer, _ = train(make_args, resume=ckpt(make_args), save_only_model=True)
    # the scheduler state that is present was restored: warm-up did not start over at step 6
    rows = [r for r in trainer.state.log_history if "learning_rate" in r and r["step"] == 6]
    straight, _ = train(make_args, output_dir=os.path.join(args_for(make_args).output_dir, "straight"))
    expected = [r for r in straight.state.log_history if "learning_rate" in r and r["step"] == 6]
    assert rows[0]["learning_rate"] == pytest.approx(expected[0]["learning_rate"])


def test_switching_optimizer_on_resume_is_refused_naming_the_file_and_optim(make_args):
    train(make_args)
    for optim in ("sgd", "adafactor"):
        with pytest.raises(ValueError, match=r"optimizer\.pt.*optim='adamw_torch\w*'.*optim='" + optim):
            train(make_args, resume=ckpt(make_args), optim=optim)


def test_changed_schedule_arguments_keep_the_checkpoints_schedule(make_args, caplog):
    straight, straight_w = train(make_args)
    with caplog.at_level(logging.WARNING, logger="trainwright"):
        resumed, resumed_w = train(
            make_args, resume=ckpt(make_args), learning_rate=0.5, warmup_steps=8, lr_scheduler_type="cosine"
        )
    assert all(torch.equal(straight_w[k], resumed_w[k]) for k in straight_w)
    lrs = [(r["step"], r["learning_rate"]) for r in resumed.state.log_history if "learning_rate" in r]
    assert lrs == [
        (r["step"], r["learning_rate"]) for r in straight.state.log_history if "learning_rate" in r
    ]
    for field in (
        "learning_rate (0.5 now, 0.05",
        "warmup_steps (8 now, 2",
        "lr_scheduler_type ('cosine' now, 'linear'",
    ):
        assert field in caplog.text
