"""PEFT models on trainwright's Trainer, each run beside transformers.Trainer on the same model, data
and seed: checkpoints and `save_model` hold the adapter (what transformers writes, byte for byte),
`PeftModel.from_pretrained` reads it, resume and the best model's reload go through it, LoRA
checkpoints resume across the two libraries both ways, and a background save writes the same bytes.
LoRA (with `modules_to_save` on a classifier), IA3 and prompt tuning on tiny Llama models."""

from __future__ import annotations

import json
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytest.importorskip("datasets")
from kit import ecosystem as eco  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import trainwright  # noqa: E402
from trainwright.checkpoint.files import CheckpointError  # noqa: E402

ADAPTER = "adapter_model.safetensors"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return eco.tokenizer(str(tmp_path_factory.mktemp("tok")))


def lora(**kw):
    return peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], **kw)


def peft_llama(tok, config=None, seed=0):
    model = eco.llama(tok, seed)
    torch.manual_seed(seed + 1)  # the adapter's initialisation
    return peft.get_peft_model(model, config or lora())


def args_for(lib: str, out: str, **kw):
    cls = transformers.TrainingArguments if lib == "transformers" else trainwright.TrainingArguments
    base = dict(
        output_dir=out,
        per_device_train_batch_size=4,
        learning_rate=5e-3,
        max_steps=6,
        logging_steps=1,
        save_steps=3,
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        seed=3,
    )
    return cls(**{**base, **kw})


def train(lib: str, model, data, out: str, resume=None, eval_data=None, **kw):
    cls = transformers.Trainer if lib == "transformers" else trainwright.Trainer
    trainer = cls(model=model, args=args_for(lib, out, **kw), train_dataset=data, eval_dataset=eval_data)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def adapter_of(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in peft.get_peft_model_state_dict(model).items()}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_lora_checkpoints_and_save_model_are_the_adapter_transformers_writes(tok, tmp_path):
    data = eco.lm_rows(tok)
    runs = {}
    for lib in ("transformers", "trainwright"):
        out = str(tmp_path / lib)
        trainer = train(lib, peft_llama(tok), data, out)
        trainer.save_model(os.path.join(out, "final"))
        runs[lib] = (out, trainer)
    (hf_out, hf), (tw_out, tw) = runs["transformers"], runs["trainwright"]
    assert [r["loss"] for r in tw.state.log_history[:-1]] == [r["loss"] for r in hf.state.log_history[:-1]]
    for sub in ("checkpoint-3", "checkpoint-6", "final"):
        tw_files = set(os.listdir(os.path.join(tw_out, sub)))
        assert {"adapter_config.json", ADAPTER} <= tw_files
        assert not tw_files & {"model.safetensors", "pytorch_model.bin"}  # not the whole model
        with (
            open(os.path.join(hf_out, sub, ADAPTER), "rb") as a,
            open(os.path.join(tw_out, sub, ADAPTER), "rb") as b,
        ):
            assert a.read() == b.read(), sub
        with (
            open(os.path.join(hf_out, sub, "adapter_config.json")) as a,
            open(os.path.join(tw_out, sub, "adapter_config.json")) as b,
        ):
            assert json.load(a) == json.load(b)
    with open(os.path.join(tw_out, "checkpoint-6", "checkpoint_complete.json")) as f:
        assert {"adapter_config.json", ADAPTER} <= set(json.load(f)["files"])  # the manifest covers them
    # what a user loads afterwards: the trained adapter on a fresh base
    loaded = peft.PeftModel.from_pretrained(eco.llama(tok), os.path.join(tw_out, "final"))
    assert_same(adapter_of(loaded), adapter_of(tw.model))
    assert os.path.getsize(os.path.join(tw_out, "final", ADAPTER)) < 20_000  # the base model is larger


@pytest.mark.parametrize("direction", ["transformers->trainwright", "trainwright->transformers"])
def test_lora_checkpoints_resume_across_the_two_libraries(tok, tmp_path, direction):
    data = eco.lm_rows(tok)
    writer, resumer = direction.split("->")
    straight = train("transformers", peft_llama(tok), data, str(tmp_path / "straight"))
    first = train(writer, peft_llama(tok), data, str(tmp_path / "first"))
    assert [len(g["params"]) for g in first.optimizer.param_groups] == [4 * 2, 0]  # transformers' groups
    checkpoint = str(tmp_path / "first" / "checkpoint-3")
    resumed = train(resumer, peft_llama(tok), data, str(tmp_path / "second"), resume=checkpoint)
    assert resumed.state.global_step == 6
    assert_same(adapter_of(resumed.model), adapter_of(straight.model))


def test_lora_resume_is_exact_and_refuses_an_adapter_that_does_not_fit(tok, tmp_path):
    data = eco.lm_rows(tok)
    straight = train("trainwright", peft_llama(tok), data, str(tmp_path / "a"))
    resumed = train(
        "trainwright", peft_llama(tok), data, str(tmp_path / "b"), resume=str(tmp_path / "a" / "checkpoint-3")
    )
    assert_same(adapter_of(resumed.model), adapter_of(straight.model))
    assert [r.get("loss") for r in resumed.state.log_history] == [
        r.get("loss") for r in straight.state.log_history
    ]
    checkpoint = str(tmp_path / "a" / "checkpoint-3")
    other = peft.LoraConfig(r=8, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    with pytest.raises(CheckpointError, match="checkpoint-3"):
        train("trainwright", peft_llama(tok, other), data, str(tmp_path / "c"), resume=checkpoint)
    full = train("trainwright", eco.llama(tok), data, str(tmp_path / "full"), max_steps=3)
    assert os.path.isfile(os.path.join(full.args.output_dir, "checkpoint-3", "model.safetensors"))
    with pytest.raises(CheckpointError, match="whole model"):
        train(
            "trainwright",
            peft_llama(tok),
            data,
            str(tmp_path / "d"),
            resume=str(tmp_path / "full" / "checkpoint-3"),
        )


def test_an_older_checkpoint_without_the_empty_group_still_resumes(tok, tmp_path):
    data = eco.lm_rows(tok)
    straight = train("trainwright", peft_llama(tok), data, str(tmp_path / "a"))
    checkpoint = str(tmp_path / "a" / "checkpoint-3")
    path = os.path.join(checkpoint, "optimizer.pt")
    state = torch.load(path, weights_only=True)
    state["param_groups"] = [g for g in state["param_groups"] if g["params"]]  # as written before
    torch.save(state, path)
    os.remove(os.path.join(checkpoint, "checkpoint_complete.json"))  # the file was edited on purpose
    resumed = train("trainwright", peft_llama(tok), data, str(tmp_path / "b"), resume=checkpoint)
    assert_same(adapter_of(resumed.model), adapter_of(straight.model))


def test_load_best_model_at_end_reloads_the_best_adapter_as_transformers_does(tok, tmp_path):
    data, evaluation = eco.lm_rows(tok), eco.lm_rows(tok, n=8, seed=5)
    kw = dict(
        eval_strategy="steps", eval_steps=1, save_steps=1, load_best_model_at_end=True, learning_rate=5e-2
    )
    kw["metric_for_best_model"] = "loss"
    hf = train("transformers", peft_llama(tok), data, str(tmp_path / "hf"), eval_data=evaluation, **kw)
    tw = train("trainwright", peft_llama(tok), data, str(tmp_path / "tw"), eval_data=evaluation, **kw)
    best = tw.state.best_model_checkpoint
    assert os.path.basename(best) == os.path.basename(hf.state.best_model_checkpoint)
    assert_same(adapter_of(tw.model), adapter_of(hf.model))
    stored = load_file(os.path.join(best, ADAPTER))
    assert_same(adapter_of(tw.model), stored)
    assert any(p.requires_grad for p in tw.model.parameters())  # the reloaded adapter is trainable


METHODS = {
    "lora+modules_to_save": lambda: peft.LoraConfig(
        r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["score"], task_type="SEQ_CLS"
    ),
    "ia3": lambda: peft.IA3Config(
        target_modules=["k_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"]
    ),
    "prompt_tuning": lambda: peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4),
}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_each_peft_method_saves_and_resumes_as_transformers(tok, tmp_path, method):
    classify = method.startswith("lora")
    data = eco.lm_rows(tok)
    if classify:
        data = [
            {"input_ids": r["input_ids"], "labels": torch.tensor(float(r["input_ids"][0] % 3))} for r in data
        ]

    def model():
        base = eco.llama_classifier(tok) if classify else eco.llama(tok)
        torch.manual_seed(1)
        return peft.get_peft_model(base, METHODS[method]())

    hf = train("transformers", model(), data, str(tmp_path / "hf"))
    tw = train("trainwright", model(), data, str(tmp_path / "tw"))
    losses = [r.get("loss") for r in tw.state.log_history[:-1]]
    if method == "prompt_tuning":
        # transformers divides the summed loss by the targets it counts before PEFT prepends the
        # virtual tokens (11 of a row's 12: it drops the first as the causal shift would), while the
        # last virtual token predicts it; trainwright logs the mean over all 12 (see the next test)
        assert losses == pytest.approx([r["loss"] * 11 / 12 for r in hf.state.log_history[:-1]], rel=1e-6)
    else:
        assert losses == [r.get("loss") for r in hf.state.log_history[:-1]]
    for sub in ("checkpoint-3", "checkpoint-6"):
        ours, theirs = (
            load_file(str(tmp_path / "tw" / sub / ADAPTER)),
            load_file(str(tmp_path / "hf" / sub / ADAPTER)),
        )
        if method == "prompt_tuning":  # Adam's step barely sees the loss's scale
            assert all(torch.allclose(ours[k], theirs[k], rtol=1e-4, atol=1e-6) for k in theirs)
        else:
            assert_same(ours, theirs)
    resumed = train(
        "trainwright", model(), data, str(tmp_path / "again"), resume=str(tmp_path / "tw" / "checkpoint-3")
    )
    assert_same(adapter_of(resumed.model), adapter_of(tw.model))


def test_gradient_checkpointing_trains_the_adapter_as_transformers(tok, tmp_path):
    data = eco.lm_rows(tok)
    hf, tw = (
        train(
            lib, peft_llama(tok), data, str(tmp_path / lib), gradient_checkpointing=True, save_strategy="no"
        )
        for lib in ("transformers", "trainwright")
    )
    untrained = adapter_of(peft_llama(tok))
    assert any(not torch.equal(v, untrained[k]) for k, v in adapter_of(tw.model).items() if "lora_A" in k)
    for k, v in adapter_of(tw.model).items():
        assert torch.allclose(v, adapter_of(hf.model)[k], rtol=1e-5, atol=1e-7), k


def test_a_background_save_of_an_adapter_writes_the_same_bytes(tok, tmp_path):
    data = eco.lm_rows(tok)
    train("trainwright", peft_llama(tok), data, str(tmp_path / "sync"))
    tw = train("trainwright", peft_llama(tok), data, str(tmp_path / "async"), async_save=True)
    staged = trainwright.checkpoint.weights.model_state_dict(tw.model)
    assert staged and all(".default." in k for k in staged)  # the adapter only, not the frozen base
    for sub in ("checkpoint-3", "checkpoint-6"):
        for name in ("adapter_config.json", ADAPTER):
            with (
                open(tmp_path / "sync" / sub / name, "rb") as a,
                open(tmp_path / "async" / sub / name, "rb") as b,
            ):
                assert a.read() == b.read(), (sub, name)


def test_prompt_tuning_accumulates_every_target_the_virtual_tokens_predict(tok, tmp_path):
    """The last virtual token predicts each row's first label: token-weighted accumulation counts it,
    so two micro-batches of 2 give the update of one batch of 4, and the logged loss is the model's
    own mean over the batch."""
    data = eco.lm_rows(tok, n=8)

    def model():
        base = eco.llama(tok)
        torch.manual_seed(1)
        return peft.get_peft_model(base, METHODS["prompt_tuning"]())

    kw = dict(max_steps=1, save_strategy="no", learning_rate=1e-1, optim="sgd")
    whole = train("trainwright", model(), data, str(tmp_path / "a"), **kw)
    split = train(
        "trainwright",
        model(),
        data,
        str(tmp_path / "b"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        **kw,
    )
    for k, v in adapter_of(whole.model).items():
        assert torch.allclose(v, adapter_of(split.model)[k], rtol=1e-5, atol=1e-7), k
    assert split.state.log_history[0]["loss"] == pytest.approx(whole.state.log_history[0]["loss"], rel=1e-6)
    fresh = model()
    batch = next(iter(whole.get_train_dataloader()))  # the step's batch
    with torch.no_grad():
        mean = fresh(**batch).loss.item()  # the model's own loss: every label is a target
    assert whole.state.log_history[0]["loss"] == pytest.approx(mean, rel=1e-6)


def test_every_n_layers_and_offload_are_the_models_arguments_as_upstream(tok, tmp_path):
    kw = dict(gradient_checkpointing=True, save_strategy="no", max_steps=1)
    kw["gradient_checkpointing_kwargs"] = {"every_n_layers": 2, "use_reentrant": False}
    layers = {}
    for lib in ("transformers", "trainwright"):
        trainer = train(lib, peft_llama(tok), eco.lm_rows(tok), str(tmp_path / lib), **kw)
        layers[lib] = [layer.gradient_checkpointing for layer in trainer.model.get_base_model().model.layers]
    assert layers["trainwright"] == layers["transformers"] == [True, False]
