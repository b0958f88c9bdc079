"""TrainingArguments old (v4) names and transformers' names: each maps onto its v5 field with a
warning, or is refused where trainwright cannot honour it; the v4/v5 choices are documented."""

import dataclasses
import enum
import warnings

import pytest
import torch
from args_kit import (
    fresh_old_name_warnings,  # noqa: F401  (autouse)
    future_warnings,
    make,
)
from kit import ROOT

from trainwright.args.aliases import REMOVED_V4_ARGS
from trainwright.args.training_args import V4_V5_CHOICES, Seq2SeqTrainingArguments, TrainingArguments
from trainwright.core.enums import OptimizerNames

# ------------------------------------------------------------------------------ v4 / v5 choices


def test_v4_v5_choices_documents_the_disagreements():
    names = {f.name for f in dataclasses.fields(TrainingArguments)} | set(REMOVED_V4_ARGS)
    assert set(V4_V5_CHOICES) <= names
    for key in (
        "report_to",
        "optim",
        "lr_scheduler_kwargs",
        "warmup_steps",
        "logging_dir",
        "activation_checkpointing",
    ):
        assert V4_V5_CHOICES[key]


def test_compatibility_doc_lists_every_v4_v5_choice():
    doc = (ROOT / "docs" / "compatibility.md").read_text()
    missing = [k for k in V4_V5_CHOICES if f"| `{k}` |" not in doc]
    assert not missing, f"docs/compatibility.md lacks {missing}: regenerate its table from V4_V5_CHOICES"


# ------------------------------------------------------------------------------------ old names


def test_adamw_hf_is_adamw_torch_and_warns_once():
    with pytest.warns(FutureWarning, match="adamw_hf"):
        a = make(optim="adamw_hf")
    assert a.optim == OptimizerNames.ADAMW_TORCH
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        make(optim="adamw_hf")
    assert future_warnings(record) == []


def test_evaluation_strategy_maps_and_warns_once():
    with pytest.warns(FutureWarning, match="evaluation_strategy.*eval_strategy") as record:
        # built here, not through make(): the warning must name this file as the caller
        a = TrainingArguments(output_dir="out", evaluation_strategy="steps", logging_steps=10)
    assert a.eval_strategy == "steps" and a.evaluation_strategy == "steps" and a.do_eval  # read back as set
    assert any(w.filename == __file__ for w in record)  # points at the caller, not at args.py
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        b = make(evaluation_strategy="epoch")
    assert b.eval_strategy == "epoch"
    assert future_warnings(again) == []
    with pytest.raises(ValueError, match="evaluation_strategy.*eval_strategy"):
        make(evaluation_strategy="epoch", eval_strategy="steps")
    with pytest.raises(ValueError, match="evaluation_strategy='sometimes'"):
        make(evaluation_strategy="sometimes")


@pytest.mark.parametrize(
    "old, new_value",
    [
        ({"per_gpu_train_batch_size": 4}, {"per_device_train_batch_size": 4}),
        ({"per_gpu_eval_batch_size": 16}, {"per_device_eval_batch_size": 16}),
        ({"no_cuda": True}, {"use_cpu": True, "dataloader_pin_memory": False}),
        ({"adafactor": True}, {"optim": "adafactor"}),
        ({"group_by_length": True}, {"train_sampling_strategy": "group_by_length"}),
        ({"include_inputs_for_metrics": True}, {"include_for_metrics": ["inputs"]}),
        ({"tpu_metrics_debug": True}, {"debug": ["tpu_metrics_debug"]}),
        ({"torchdynamo": "eager"}, {"torch_compile_backend": "eager", "torch_compile": True}),
        ({"fp16_backend": "cpu_amp"}, {"half_precision_backend": "cpu_amp"}),
        ({"push_to_hub_token": "secret"}, {"hub_token": "secret"}),
        ({"push_to_hub_model_id": "m", "push_to_hub_organization": "org"}, {"hub_model_id": "org/m"}),
        ({"fsdp_min_num_params": 1000}, {"fsdp_config": {"min_num_params": 1000}}),
        (
            {"fsdp_transformer_layer_cls_to_wrap": "Block"},
            {"fsdp_config": {"transformer_layer_cls_to_wrap": ["Block"]}},
        ),
        ({"gradient_checkpointing": True}, {"activation_checkpointing": True}),
        (
            {"gradient_checkpointing_kwargs": {"use_reentrant": False}},
            {"activation_checkpointing_kwargs": {"use_reentrant": False}},
        ),
    ],
)
def test_old_names_map_onto_new_fields_with_a_warning(old, new_value):
    (old_name, old_value), *_ = old.items()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        a = make(**old)
    assert any(old_name in message for message in future_warnings(record))
    for name, value in new_value.items():
        assert getattr(a, name) == value, name
    # The old field reads back what was set (v4 code reads args.no_cuda), and a rebuild agrees.
    assert getattr(a, old_name) == old_value
    rebuilt = type(a).from_dict(a.to_dict())
    for name, value in new_value.items():  # tokens are redacted by to_dict
        assert getattr(rebuilt, name) == (None if name.endswith("_token") else value), name


def test_old_names_at_their_v4_default_are_silent():
    v4_defaults = dict(
        no_cuda=False,
        adafactor=False,
        group_by_length=False,
        include_inputs_for_metrics=False,
        fp16_backend="auto",
        fp16_opt_level="O1",
        jit_mode_eval=False,
        use_legacy_prediction_loop=False,
        tpu_metrics_debug=False,
        mp_parameters="",
        fsdp_min_num_params=0,
        gradient_checkpointing=False,
        save_safetensors=True,
        warmup_ratio=0.0,
        evaluation_strategy="no",
        per_gpu_train_batch_size=None,
        use_mps_device=False,
    )
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        make(**v4_defaults)
    assert future_warnings(record) == []


def test_old_name_conflicting_with_new_name_is_an_error():
    with pytest.raises(ValueError, match="per_gpu_train_batch_size=4.*per_device_train_batch_size=16"):
        with pytest.warns(FutureWarning):
            make(per_gpu_train_batch_size=4, per_device_train_batch_size=16)
    with pytest.raises(ValueError, match="adafactor.*optim"):
        with pytest.warns(FutureWarning):
            make(adafactor=True, optim="sgd")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"jit_mode_eval": True},
        {"use_legacy_prediction_loop": True},
        {"fp16_opt_level": "O2"},
        {"tpu_num_cores": 8},
        {"mp_parameters": "x"},
        {"half_precision_backend": "apex"},
        {"save_safetensors": False},
        {"liger_kernel_config": {"rope": True}},
    ],
)
def test_options_trainwright_cannot_honour_are_refused(kwargs):
    with pytest.raises(ValueError, match=f"{next(iter(kwargs))}=.*is invalid"):
        make(**kwargs)


def test_options_that_change_nothing_here_are_accepted():
    assert make(half_precision_backend="cpu_amp").half_precision_backend == "cpu_amp"  # torch.amp is that
    if torch.backends.mps.is_available():
        assert make(use_mps_device=True).use_mps_device is True
    else:  # the user asks for a device this machine does not have
        with pytest.raises(ValueError, match="use_mps_device"):
            make(use_mps_device=True)


def test_warmup_ratio_is_the_v4_name_and_warns():
    with pytest.warns(FutureWarning, match="warmup_ratio"):
        make(warmup_ratio=0.1)


def test_checkpointing_names_stay_in_sync():
    a = make(activation_checkpointing=True)
    assert a.gradient_checkpointing is True
    # The v5 name wins when both are given.
    b = make(activation_checkpointing=False, gradient_checkpointing=True)
    assert b.activation_checkpointing is False and b.gradient_checkpointing is False
    # A copy that changes the v5 name takes effect, and the v4 name follows.
    c = dataclasses.replace(a, activation_checkpointing=False)
    assert c.activation_checkpointing is False and c.gradient_checkpointing is False


# ---------------------------------------------------------------------- every transformers name


def _transformers_defaults(cls) -> dict:
    out = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        out[f.name] = value.value if isinstance(value, enum.Enum) else value
    return out


def test_every_transformers_argument_name_is_accepted():
    transformers = pytest.importorskip("transformers")
    ours = {f.name for f in dataclasses.fields(Seq2SeqTrainingArguments) if f.init}
    theirs = _transformers_defaults(transformers.Seq2SeqTrainingArguments)
    missing = sorted(set(theirs) - ours)
    assert not missing, f"transformers {transformers.__version__} arguments not accepted: {missing}"
    # Built with transformers' own defaults, nothing warns and the result round-trips.
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        a = Seq2SeqTrainingArguments(**theirs)
    assert Seq2SeqTrainingArguments.from_dict(a.to_dict()) == a


def test_save_safetensors_is_taken_from_v4_scripts_but_absent_as_in_v5():
    args = make(save_safetensors=True)  # a v4 script's argument, at the value trainwright honours
    # GLiNER's _save asks getattr(args, "save_safetensors", False): transformers 5 has no such field
    assert not hasattr(args, "save_safetensors") and getattr(args, "save_safetensors", False) is False
    assert "save_safetensors" not in args.to_dict()
    assert not hasattr(Seq2SeqTrainingArguments(output_dir="out", save_safetensors=True), "save_safetensors")
    old_json = {**args.to_dict(), "save_safetensors": True}  # training_args.json of earlier releases
    assert TrainingArguments.from_dict(old_json).to_dict() == args.to_dict()
    assert dataclasses.replace(args, seed=7).seed == 7  # every field is still an attribute

    @dataclasses.dataclass
    class LibraryArguments(TrainingArguments):  # a library's own subclass (GLiNER's, TRL's configs)
        extra: int = 0

    with pytest.raises(TypeError, match="save_safetensors"):  # its dataclass __init__, as on transformers 5
        LibraryArguments(output_dir="out", save_safetensors=True)
    assert not hasattr(LibraryArguments.from_dict(old_json), "save_safetensors")


def test_the_docs_say_one_thing_about_accelerator_config_parallelism_config_and_pickling():
    doc = (ROOT / "docs" / "compatibility.md").read_text()
    decisions = doc[: doc.index("#### Values refused when the arguments are built")]  # its own table's shape
    for key in ("accelerator_config", "parallelism_config"):  # each table: the same words as the code's
        rows = [line for line in decisions.splitlines() if line.startswith(f"| `{key}` |")]
        assert rows and set(rows) == {f"| `{key}` | {V4_V5_CHOICES[key]} |"}, rows
    # accelerator_config's settings are listed once, in its section; the tables point there
    section = doc.index("#### `accelerator_config`: honoured and refused")
    the_list, before = doc[section:], doc[: doc.index("## accelerator_config data settings")]
    for setting in (
        "non_blocking",
        "sync_each_batch",
        "use_configured_state",
        "adjust_scheduler",
        "even_batches",
    ):
        assert f"`{setting}" in the_list and setting not in before, setting
    assert "accelerator_config: honoured and refused" in V4_V5_CHOICES["accelerator_config"]
    assert "CUDA: not provided yet" not in doc  # context parallelism runs on CUDA (docs/parallelism.md)
    for name in ("README.md", "docs/design.md"):  # training_args.bin and optimizer.pt are torch.save files
        text = (ROOT / name).read_text()
        assert "Nothing is pickled" not in text and "No object is pickled" not in text, name
        assert "`training_args.bin`" in text and "weights_only" in text, name
