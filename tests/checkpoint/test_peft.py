"""PEFT models on trainwright's Trainer, each run beside transformers.Trainer on the same model, data
and seed: checkpoints and `save_model` hold the adapter (what transformers writes, byte for byte),
`PeftModel.from_pretrained` reads it, resume and the best model's reload go through it, LoRA
checkpoints resume across the two libraries both ways, and a background save writes the same bytes.
LoRA (with `modules_to_save` on a classifier), IA3 and prompt tuning on tiny Llama models."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytest.importorskip("datasets")
from kit import ecosystem as eco  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import trainwright  # noqa: E402
from trainwright.checkpoint import adapters  # noqa: E402
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


# ---------------------------------------------------------------------- adapters named otherwise, several
def peft_named(tok, names, seed=0):
    """A tiny Llama with LoRA adapters `names` (the first one trained); PEFT saves each adapter not
    named "default" in a folder of its name."""
    model = eco.llama(tok, seed)
    torch.manual_seed(seed + 1)
    model = peft.get_peft_model(model, lora(), adapter_name=names[0])
    for name in names[1:]:
        model.add_adapter(name, lora())
    return model


def adapters_of(model) -> dict[str, torch.Tensor]:
    return {
        f"{name}:{k}": v.detach().clone()
        for name in model.peft_config
        for k, v in peft.get_peft_model_state_dict(model, adapter_name=name).items()
    }


@pytest.mark.parametrize(
    "writer, names",
    [
        ("trainwright", ("mine",)),
        ("trainwright", ("mine", "other")),
        ("trainwright", ("default", "other")),
        ("transformers", ("mine", "other")),
    ],
)
def test_adapters_named_otherwise_are_found_and_resume_exactly(tok, tmp_path, writer, names):
    """PEFT writes an adapter not named "default" into `checkpoint-N/<name>/`: discovery finds the
    checkpoint, `resume_from_checkpoint=True` resumes it (one of transformers too), every adapter
    comes back and the trained one continues exactly."""
    data = eco.lm_rows(tok)
    straight = train(writer, peft_named(tok, names), data, str(tmp_path / "a"))
    checkpoint = tmp_path / "a" / "checkpoint-3"
    assert {n for n in names if n != "default"} <= set(os.listdir(checkpoint))
    assert all(os.path.isfile(checkpoint / n / ADAPTER) for n in names if n != "default")
    assert trainwright.checkpoint.verify_checkpoint(checkpoint) == []
    if writer == "trainwright":  # its manifest covers the adapters' folders
        with open(checkpoint / "checkpoint_complete.json") as f:
            listed = json.load(f)["checksums"]
        assert all(
            f"{n}/{f}" in listed for n in names if n != "default" for f in (ADAPTER, "adapter_config.json")
        )
    out = tmp_path / "b"
    out.mkdir()
    os.rename(checkpoint, out / "checkpoint-3")
    assert trainwright.get_last_checkpoint(str(out)) == str(out / "checkpoint-3")
    resumed = train("trainwright", peft_named(tok, names), data, str(out), resume=True)
    assert resumed.cursor.first_step_of_call == 3 and resumed.state.global_step == 6
    assert_same(adapters_of(resumed.model), adapters_of(straight.model))
    assert resumed.model.active_adapter == names[0]


# ---------------------------------------------------------------------- damaged and missing adapter files
def _record(folder, rel):
    """The manifest agreeing with file `rel` as it is now (or without it, where it is gone): what a
    file damaged before the checkpoint was committed leaves."""
    path = os.path.join(folder, "checkpoint_complete.json")
    with open(path) as f:
        manifest = json.load(f)
    full = os.path.join(folder, rel)
    if os.path.isfile(full):
        manifest["files"][rel] = os.path.getsize(full)
        manifest["checksums"][rel] = trainwright.checkpoint.verify.file_checksum(full)
    else:
        del manifest["files"][rel], manifest["checksums"][rel]
    with open(path, "w") as f:
        json.dump(manifest, f)


@pytest.mark.parametrize("names", [("default",), ("mine", "other")])
@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_a_damaged_or_missing_adapter_is_named_and_discovery_falls_back(tok, tmp_path, names, damage):
    data = eco.lm_rows(tok)
    straight = train("trainwright", peft_named(tok, names), data, str(tmp_path / "a"))
    out = str(tmp_path / "b")
    os.rename(tmp_path / "a", out)
    newest = os.path.join(out, "checkpoint-6")
    rel = ADAPTER if names[0] == "default" else os.path.join(names[0], ADAPTER)
    path = os.path.join(newest, rel)
    if damage == "truncated":
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(size - 100)
        expected = f"{rel} has {size - 100} bytes, its header describes {size}"
    else:
        os.remove(path)
        expected = f"{rel} is missing: the weights of the adapter whose"
    _record(newest, rel)
    assert any(p.startswith(expected) for p in trainwright.checkpoint.verify_checkpoint(newest))
    with pytest.raises(ValueError, match=f"Can't resume from {newest}: {expected}"):
        train("trainwright", peft_named(tok, names), data, str(tmp_path / "c"), resume=newest)
    if damage == "truncated":  # a direct load (the best model's reload) names the file before PEFT reads it
        with pytest.raises(CheckpointError, match=f"could not read {path}"):
            trainwright.checkpoint.load_model_weights(peft_named(tok, names), newest)
    with pytest.warns(UserWarning, match=f"skipping incomplete checkpoint {newest}: {expected}"):
        resumed = train("trainwright", peft_named(tok, names), data, out, resume=True)
    assert resumed.cursor.first_step_of_call == 3  # from checkpoint-3, which verifies
    assert_same(adapters_of(resumed.model), adapters_of(straight.model))
    if names[-1] == "other":  # an adapter's config gone, its weights there
        config = os.path.join("other", "adapter_config.json")
        os.remove(os.path.join(newest, config))
        _record(newest, config)
        expected = f"{config} is missing: the config of the adapter whose weights are there"
        assert expected in trainwright.checkpoint.verify_checkpoint(newest)


# ---------------------------------------------------------------------- the base model an adapter was trained on
def lora_on(folder):
    """LoRA on the base model saved in `folder`, loaded as a user loads one (its name is the folder)."""
    base = transformers.AutoModelForCausalLM.from_pretrained(str(folder))
    torch.manual_seed(1)
    return peft.get_peft_model(base, lora())


def test_an_adapter_resumed_onto_another_base_is_refused_and_a_moved_base_resumes(tok, tmp_path):
    """The weights decide, where the checkpoint records them (base_model.json): another base is refused
    naming both, the same base loaded from another folder resumes exactly. A transformers checkpoint
    records only the base's name: another name is refused, saying how to declare a move."""
    data = eco.lm_rows(tok)
    for name, seed in (("A", 0), ("B", 5)):
        eco.llama(tok, seed).save_pretrained(str(tmp_path / name))
    base_a, base_b, moved = tmp_path / "A", tmp_path / "B", tmp_path / "A-moved"
    straight = train("trainwright", lora_on(base_a), data, str(tmp_path / "straight"))
    checkpoint = str(tmp_path / "straight" / "checkpoint-3")
    with pytest.raises(
        ValueError, match=f"trained on the base model '{base_a}'.*base model '{base_b}' holds other"
    ):
        train("trainwright", lora_on(base_b), data, str(tmp_path / "x"), resume=checkpoint)
    with open(os.path.join(checkpoint, "base_model.json")) as f:
        recorded = json.load(f)
    assert recorded["base_model_name_or_path"] == str(base_a) and recorded["fingerprint"]
    assert not any("lora" in k for k in recorded["fingerprint"])  # the base only, not the adapter
    os.rename(base_a, moved)
    resumed = train("trainwright", lora_on(moved), data, str(tmp_path / "y"), resume=checkpoint)
    assert_same(adapter_of(resumed.model), adapter_of(straight.model))
    os.rename(base_b, base_a)  # another model where the base was: the same name, other weights
    with pytest.raises(ValueError, match=f"base model '{base_a}'.*base model '{base_a}' holds other weights"):
        train("trainwright", lora_on(base_a), data, str(tmp_path / "z"), resume=checkpoint)

    theirs = train("transformers", lora_on(moved), data, str(tmp_path / "hf"), max_steps=3)
    hf_checkpoint = os.path.join(theirs.args.output_dir, "checkpoint-3")
    assert not os.path.exists(os.path.join(hf_checkpoint, "base_model.json"))
    config = os.path.join(hf_checkpoint, "adapter_config.json")
    with pytest.raises(
        ValueError, match=f"{config} says .* base model '{moved}', this run's base model is '{base_a}'"
    ):
        train("trainwright", lora_on(base_a), data, str(tmp_path / "w"), resume=hf_checkpoint)
    train("trainwright", lora_on(moved), data, str(tmp_path / "v"), resume=hf_checkpoint)  # its own base


def test_a_damaged_or_absent_base_model_json_is_named(tok, tmp_path):
    """base_model.json is checked as the other JSON state is; a checkpoint of an earlier trainwright
    (without it) falls back to the names, and the way to declare a move says to drop the manifest."""
    data = eco.lm_rows(tok)
    for name, seed in (("A", 0), ("B", 5)):
        eco.llama(tok, seed).save_pretrained(str(tmp_path / name))
    train("trainwright", lora_on(tmp_path / "A"), data, str(tmp_path / "a"), max_steps=3)
    checkpoint = str(tmp_path / "a" / "checkpoint-3")
    path = os.path.join(checkpoint, "base_model.json")
    with open(path) as f:
        saved = json.load(f)
    with open(path, "w") as f:
        json.dump({**saved, "fingerprint": {"lm_head.weight": "float32:32,32:zz"}}, f)
    _record(checkpoint, "base_model.json")
    expected = "base_model.json: fingerprint.lm_head.weight is 'float32:32,32:zz', not dtype:shape:hex"
    assert expected in trainwright.checkpoint.verify_checkpoint(checkpoint)
    with pytest.raises(ValueError, match=expected):
        train("trainwright", lora_on(tmp_path / "A"), data, str(tmp_path / "b"), resume=checkpoint)
    os.remove(path)
    _record(checkpoint, "base_model.json")
    with pytest.raises(ValueError, match="no base_model.json.* and delete checkpoint_complete.json"):
        train("trainwright", lora_on(tmp_path / "B"), data, str(tmp_path / "c"), resume=checkpoint)
    train("trainwright", lora_on(tmp_path / "A"), data, str(tmp_path / "d"), resume=checkpoint)


def test_the_fingerprint_of_a_base_in_another_dtype_is_the_same_base(tok):
    fp32 = peft_llama(tok)
    same = adapters.base_fingerprint(peft_llama(tok).to(torch.bfloat16))
    other = adapters.base_fingerprint(peft_llama(tok, seed=5))
    assert adapters.fingerprint_difference(adapters.base_fingerprint(fp32), same) is None
    assert "frozen parameters hold other values" in adapters.fingerprint_difference(same, other)


def test_a_preempted_run_of_a_named_adapter_resumes_where_it_stopped(tok, tmp_path, jobs):
    """SIGTERM to a run training the adapter "mine" (saved in `checkpoint-N/mine/`): the preemption
    save is found and resumed from its step, and the run ends with the adapter of an uninterrupted one."""
    cfg = {"max_steps": 12, "lora": ["mine"], "tok": tok.name_or_path}
    out, ref = str(tmp_path / "out"), str(tmp_path / "ref")
    reference = jobs({**cfg, "output_dir": ref, "final": os.path.join(ref, "final")})
    job = jobs({**cfg, "output_dir": out, "step_sleep": 0.2})
    job.wait_for("STEP 3")
    os.kill(job.proc.pid, signal.SIGTERM)
    code, stdout, stderr = job.finish()
    assert code == 0 and "Preempted by SIGTERM: checkpoint written, exiting." in stderr, stderr[-3000:]
    last = trainwright.get_last_checkpoint(out)
    step = int(last.rsplit("-", 1)[1])
    assert 3 <= step < 12 and os.path.isfile(os.path.join(last, "mine", ADAPTER))

    final = os.path.join(out, "final")
    code, stdout, stderr = jobs({**cfg, "output_dir": out, "resume": True, "final": final}).finish()
    assert code == 0, stderr[-3000:]
    steps = [line for line in stdout.splitlines() if line.startswith("STEP ")]
    assert steps[0] == f"STEP {step + 1}" and "DONE 12" in stdout  # from the preemption's step, not 0
    code, _, stderr = reference.finish()
    assert code == 0, stderr[-3000:]
    assert_same(
        load_file(os.path.join(final, "mine", ADAPTER)),
        load_file(os.path.join(ref, "final", "mine", ADAPTER)),
    )
