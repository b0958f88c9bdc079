"""trainwright's Trainer has the public API of the installed transformers.Trainer: every public
method (with upstream's parameter names), every public attribute a Trainer has after __init__, and
the private hooks that subclasses (TRL and others) override."""

from __future__ import annotations

import inspect
import warnings

import pytest
from conftest import RegressionDataset, RegressionModel

import trainwright

transformers = pytest.importorskip("transformers")

# Deliberate differences, each with its reason (docs/compatibility.md lists them too).
NOT_PROVIDED = {
    # trainwright runs on its own runtime; `trainer.accelerator` is a facade over it
    "create_accelerator_and_postprocess": "accelerate is not the engine",
}

# Hooks a subclass overrides that the loop must call with upstream's signature.
HOOKS = [
    "_get_train_sampler",
    "_get_eval_sampler",
    "_set_signature_columns_if_needed",
    "_remove_unused_columns",
    "_get_collator_with_removed_columns",
    "_wrap_model",
    "_inner_training_loop",
    "_maybe_log_save_evaluate",
    "_evaluate",
    "_determine_best_metric",
    "_save_checkpoint",
    "_save",
    "_load_from_checkpoint",
    "_load_optimizer_and_scheduler",
    "_get_output_dir",
    "_load_best_model",
    "_prepare_inputs",
    "_issue_warnings_after_load",  # called by a subclass's _load_from_checkpoint (GLiNER's)
]


def _public_methods(cls) -> dict:
    return {k: v for k, v in inspect.getmembers(cls) if not k.startswith("_") and callable(v)}


def _params(fn) -> list[str]:
    return [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "self"
    ]


@pytest.mark.parametrize("ours, theirs", [("Trainer", "Trainer"), ("Seq2SeqTrainer", "Seq2SeqTrainer")])
def test_every_public_method_exists_with_upstreams_parameters(ours, theirs):
    ours_cls, theirs_cls = getattr(trainwright, ours), getattr(transformers, theirs)
    missing, wrong = [], []
    for name, fn in _public_methods(theirs_cls).items():
        if name in NOT_PROVIDED:
            continue
        mine = getattr(ours_cls, name, None)
        if mine is None:
            missing.append(name)
            continue
        if callable(mine) and not isinstance(inspect.getattr_static(ours_cls, name), property):
            lacking = [p for p in _params(fn) if p not in _params(mine)]
            if lacking and not any(
                p.kind is p.VAR_KEYWORD for p in inspect.signature(mine).parameters.values()
            ):
                wrong.append(f"{name}: no {lacking}")
    assert not missing, f"public methods of transformers.{theirs} missing: {missing}"
    assert not wrong, f"parameters of upstream missing: {wrong}"


def test_hooks_have_upstreams_parameters():
    wrong = []
    for name in HOOKS:
        theirs = getattr(transformers.Trainer, name)
        mine = getattr(trainwright.Trainer, name)
        lacking = [p for p in _params(theirs) if p not in _params(mine)]
        if lacking:
            wrong.append(f"{name}: no {lacking}")
    assert not wrong, wrong


def test_every_public_instance_attribute_exists(tmp_path):
    args = dict(output_dir=str(tmp_path / "o"), report_to="none", use_cpu=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        upstream = transformers.Trainer(
            model=RegressionModel(),
            args=transformers.TrainingArguments(**args),
            train_dataset=RegressionDataset(),
        )
    ours = trainwright.Trainer(
        model=RegressionModel(), args=trainwright.TrainingArguments(**args), train_dataset=RegressionDataset()
    )
    names = sorted(k for k in vars(upstream) if not k.startswith("_") and k not in NOT_PROVIDED)
    missing = [k for k in names if not hasattr(ours, k)]
    assert not missing, f"attributes a transformers.Trainer has after __init__, missing here: {missing}"
