"""TFTrainingArguments: the TF fields, refusals of what TFTrainer does not do, schedule parity."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tensorflow")
torch = pytest.importorskip("torch")

from trainwright import TFTrainingArguments, get_scheduler  # noqa: E402
from trainwright.tf.schedule import make_schedule  # noqa: E402


@pytest.mark.parametrize(
    "field,value",
    [
        ("fsdp", "full_shard"),
        ("deepspeed", {"train_batch_size": 8}),
        ("torch_compile", True),
        ("fp16", True),
        ("gradient_checkpointing", True),
        ("dataloader_num_workers", 2),
        ("push_to_hub", True),
        ("neftune_noise_alpha", 5.0),
        ("label_smoothing_factor", 0.1),
        ("eval_accumulation_steps", 2),
    ],
)
def test_torch_only_settings_are_refused_by_name(tmp_path, field, value):
    with pytest.raises(ValueError, match=field):
        TFTrainingArguments(output_dir=str(tmp_path), **{field: value})


def test_tf_fields_and_their_checks(tmp_path):
    args = TFTrainingArguments(output_dir=str(tmp_path), poly_power=2.0, xla=True)
    assert (args.poly_power, args.xla, args.tpu_name) == (2.0, True, None)
    assert args.n_replicas == 1 and type(args.strategy).__name__ == "OneDeviceStrategy"
    assert args.train_batch_size == 8 and args.world_size == 1 and args.n_gpu == 0
    with pytest.raises(ValueError, match="optim='adafactor'"):
        TFTrainingArguments(output_dir=str(tmp_path), optim="adafactor")
    with pytest.raises(ValueError, match="reduce_lr_on_plateau"):
        TFTrainingArguments(output_dir=str(tmp_path), lr_scheduler_type="reduce_lr_on_plateau")
    with pytest.raises(ValueError, match="poly_power"):
        TFTrainingArguments(output_dir=str(tmp_path), poly_power=0)
    with pytest.raises(ValueError, match="tpu_name"):
        TFTrainingArguments(output_dir=str(tmp_path), tpu_zone="us-central1-b")
    with pytest.raises(ValueError, match="per_device_train_batch_size"):  # the shared validation runs
        TFTrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=0)
    # a TPU that is not there is a clear error, not a fallback
    with pytest.raises(RuntimeError, match="no TPU could be reached"):
        _ = TFTrainingArguments(output_dir=str(tmp_path), tpu_name="no-such-tpu").strategy


def test_round_trip_through_to_dict(tmp_path):
    args = TFTrainingArguments(output_dir=str(tmp_path), poly_power=3.0, eval_strategy="steps", eval_steps=5)
    again = TFTrainingArguments.from_dict(args.to_dict())
    assert again.to_dict() == args.to_dict()


def _torch_lrs(name, lr, warmup, total, kwargs):
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=lr)
    sched = get_scheduler(name, opt, warmup, total, kwargs)
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("linear", {}),
        ("polynomial", {"power": 2.0}),
        ("cosine", {}),
        ("constant_with_warmup", {}),
        ("cosine_with_restarts", {"num_cycles": 2}),
        ("inverse_sqrt", {}),
    ],
)
def test_schedule_matches_the_torch_schedule_at_every_step(tmp_path, name, kwargs):
    total, warmup, lr = 40, 7, 3e-3
    args = TFTrainingArguments(
        output_dir=str(tmp_path),
        learning_rate=lr,
        warmup_steps=warmup,
        lr_scheduler_type=name,
        lr_scheduler_kwargs=kwargs,
    )
    keras_lrs = [float(make_schedule(args, total)(k)) for k in range(total)]
    np.testing.assert_allclose(keras_lrs, _torch_lrs(name, lr, warmup, total, kwargs), rtol=1e-6, atol=1e-12)


def test_poly_power_gives_v4_polynomial_decay(tmp_path):
    """v4's TFTrainer: warmup, then lr * (1 - progress) ** poly_power down to 0."""
    total, warmup, lr, power = 30, 5, 1e-2, 2.5
    args = TFTrainingArguments(
        output_dir=str(tmp_path), learning_rate=lr, warmup_steps=warmup, poly_power=power
    )
    got = [float(make_schedule(args, total)(k)) for k in range(total + 1)]
    want = [
        lr * k / warmup if k < warmup else lr * (1 - (k - warmup) / (total - warmup)) ** power
        for k in range(total + 1)
    ]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)
    # with lr_scheduler_type="polynomial", poly_power is the power of trainwright's polynomial schedule
    poly = TFTrainingArguments(
        output_dir=str(tmp_path),
        learning_rate=lr,
        warmup_steps=warmup,
        lr_scheduler_type="polynomial",
        poly_power=power,
    )
    expected = _torch_lrs("polynomial", lr, warmup, total, {"power": power})
    np.testing.assert_allclose(
        [float(make_schedule(poly, total)(k)) for k in range(total)], expected, rtol=1e-6
    )


def test_worker_facts_come_from_tf_config(tmp_path, monkeypatch):
    import json

    cluster = {"chief": ["hostA:1000"], "worker": ["hostA:1001", "hostB:1000", "hostB:1001"]}
    args = TFTrainingArguments(output_dir=str(tmp_path))
    facts = []
    for kind, index in [("chief", 0), ("worker", 0), ("worker", 1), ("worker", 2)]:
        monkeypatch.setenv(
            "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})
        )
        facts.append(
            (args.world_size, args.process_index, args.local_process_index, args.should_save, args.should_log)
        )
    assert facts == [
        (4, 0, 0, True, True),
        (4, 1, 1, False, False),
        (4, 2, 0, False, True),
        (4, 3, 1, False, False),
    ]
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "ps", "index": 0}}))
    with pytest.raises(ValueError, match="'ps'"):
        _ = args.process_index


def test_save_strategy_best_is_refused(tmp_path):
    with pytest.raises(ValueError, match="save_strategy='best'"):
        TFTrainingArguments(
            output_dir=str(tmp_path),
            save_strategy="best",
            metric_for_best_model="loss",
            eval_strategy="steps",
        )
