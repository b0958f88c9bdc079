"""What transformers' TrainingArguments accepts, trainwright's accepts, or refuses on purpose.

Every field the two share is built with a set of values on both. Where transformers takes a value and
trainwright refuses it, the refusal must name the field and be one of two documented kinds
(docs/compatibility.md, "Values refused when the arguments are built"): a value of a type the field
does not have (transformers keeps it and fails or misbehaves later, at the optimizer, the loader or
the first step), or a well-typed value in the table below, each with its reason. A new check that
refuses a well-typed value transformers accepts fails this test until it is listed and documented.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import types
import typing
import warnings

import pytest

from trainwright import TrainingArguments

transformers = pytest.importorskip("transformers")

CANDIDATES = [
    None,
    True,
    False,
    0,
    1,
    -1,
    0.5,
    1.5,
    -0.5,
    "",
    "no",
    "steps",
    "abc",
    "1",
    [],
    ["a"],
    {},
    {"a": 1},
]
# upstream opens an int given for these as a file descriptor (True closes stdout)
FILE_FIELDS = {"accelerator_config", "deepspeed", "fsdp_config", "parallelism_config"}

# Well-typed values trainwright refuses and transformers accepts: the field, and why.
DELIBERATE = {
    "adam_beta1": "outside [0, 1): torch's Adam refuses it at the optimizer",
    "adam_beta2": "outside [0, 1): torch's Adam refuses it at the optimizer",
    "adam_epsilon": "negative",
    "learning_rate": "negative",
    "max_grad_norm": "negative (0 or None: no clipping)",
    "label_smoothing_factor": "outside [0, 1): upstream smooths with it, a meaningless loss",
    "neftune_noise_alpha": "not > 0 (None turns NEFTune off)",
    "num_train_epochs": "not > 0 with max_steps unset: nothing would train",
    "per_device_train_batch_size": "below 1",
    "per_device_eval_batch_size": "below 1",
    "gradient_accumulation_steps": "below 1",
    "eval_accumulation_steps": "below 1",
    "dataloader_num_workers": "negative",
    "ddp_timeout": "below 1 second",
    "seed": "outside [0, 2**32): numpy's seeding refuses it",
    "data_seed": "outside [0, 2**32): numpy's seeding refuses it",
    "warmup_steps": "a fraction above 1",
    "eval_delay": "negative",
    "eval_steps": "a fraction above 1",
    "logging_steps": "not > 0 with logging_strategy='steps'",
    "save_steps": "not > 0 with save_strategy='steps' (upstream never saves then: say save_strategy='no')",
    "save_total_limit": "below 1 (upstream reads 0 as keep-all; None says it)",
    "log_level": "not one of the level names",
    "log_level_replica": "not one of the level names",
    "dataloader_multiprocessing_context": "not a multiprocessing start method",
    "include_num_input_tokens_seen": "not no / all / non_padding",
    "include_for_metrics": "entries other than inputs / loss",
    "debug": "options other than upstream's",
    "lr_scheduler_kwargs": "a string that is not a JSON object (upstream passes it as **kwargs)",
    "activation_checkpointing_kwargs": "a string that is not a JSON object",
    "gradient_checkpointing_kwargs": "a string that is not a JSON object",
    "deepspeed": "a path that does not exist",
    "fsdp_config": "a path that does not exist",
    "parallelism_config": "not accelerate's ParallelismConfig nor a dict or JSON of its sizes",
    "liger_kernel_config": "set without use_liger_kernel=True: it would do nothing",
    "local_rank": "another than this process's LOCAL_RANK",
    "project": "trackio's: trainwright has no trackio reporter",
    "trackio_space_id": "trackio's: trainwright has no trackio reporter",
    "trackio_bucket_id": "trackio's: trainwright has no trackio reporter",
    "trackio_static_space_id": "trackio's: trainwright has no trackio reporter",
    "train_sampling_strategy": "not random / sequential / group_by_length",
}


def _members(tp: typing.Any) -> list[typing.Any]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(tp) for m in _members(arg)]
    return [tp]


def _fits_member(member: typing.Any, value: typing.Any) -> bool:
    origin = typing.get_origin(member) or member
    if member is typing.Any or (member is type(None) and value is None):
        return True
    if origin is typing.Literal:
        return value in typing.get_args(member)
    if not isinstance(origin, type):
        return False
    if isinstance(value, bool):  # a bool is not a number here
        return origin is bool
    if issubclass(origin, enum.Enum):
        return isinstance(value, str) and value in {e.value for e in origin}
    if origin is float:
        return isinstance(value, (int, float))
    return isinstance(value, origin)


def _fits(tp: typing.Any, value: typing.Any) -> bool:
    """Whether `value` has one of the types the annotation `tp` names."""
    return any(_fits_member(m, value) for m in _members(tp))


def _accepts(cls: type, out: str, name: str, value: typing.Any) -> BaseException | None:
    try:
        cls(output_dir=out, use_cpu=True, report_to="none", **{name: value})
    except Exception as e:
        return e
    return None


def test_what_transformers_accepts_is_accepted_or_refused_on_purpose(tmp_path):
    ours = {f.name for f in dataclasses.fields(TrainingArguments)}
    hints = typing.get_type_hints(TrainingArguments)
    fields = [
        f.name
        for f in dataclasses.fields(transformers.TrainingArguments)
        if f.init and f.name in ours and f.name != "output_dir"
    ]
    unexplained, unnamed = [], []
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name in fields:
                for value in CANDIDATES:
                    if name in FILE_FIELDS and isinstance(value, int):
                        continue
                    if _accepts(transformers.TrainingArguments, str(tmp_path), name, value) is not None:
                        continue
                    refused = _accepts(TrainingArguments, str(tmp_path), name, value)
                    if refused is None:
                        continue
                    if name not in str(refused):
                        unnamed.append((name, value, str(refused)[:200]))
                    if _fits(hints[name], value) and name not in DELIBERATE:
                        unexplained.append((name, value, str(refused)[:200]))
    finally:
        logging.disable(logging.NOTSET)
    assert not unnamed, f"refusals that do not name the field: {unnamed}"
    assert not unexplained, f"well-typed values transformers accepts, refused without a reason: {unexplained}"


def test_every_deliberate_refusal_is_documented():
    doc_path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "compatibility.md")
    with open(doc_path) as f:
        doc = f.read()
    section = doc[doc.index("#### Values refused when the arguments are built") :]
    missing = [name for name in DELIBERATE if f"`{name}`" not in section]
    assert not missing, missing
