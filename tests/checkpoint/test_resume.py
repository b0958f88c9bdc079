"""Exact, safe resume: a run stopped at a checkpoint and resumed in a new process ends bit-identical."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import pytest
import torch
from conftest import VectorDataset
from kit.runs import read_until, scored_best_model_run, start_resume_job
from kit.runs import resume_job_result as result
from kit.runs import run_resume_job as run_job
from safetensors.torch import load_file

from trainwright import Trainer, TrainerState


def _start_from(run: str, step: int, out: str) -> None:
    """A new run folder `out` holding only `run`'s checkpoint-`step`."""
    os.makedirs(out)
    shutil.copytree(os.path.join(run, f"checkpoint-{step}"), os.path.join(out, f"checkpoint-{step}"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted run (2 workers, accumulation, dropout, shuffling), saving every step."""
    out = str(tmp_path_factory.mktemp("ref"))
    run_job({"output_dir": out, "workers": 2})
    return out


# 5 optimizer steps per epoch (10 micro-batches, ga=2), 15 in all
@pytest.mark.parametrize(
    "stop", [2, 5, 8, 14], ids=["mid-epoch", "last-step-of-epoch", "epoch-2", "near-end"]
)
def test_resume_in_a_new_process_is_bit_identical(reference, tmp_path, stop):
    ref_res, ref_weights = result(reference)
    out = str(tmp_path / "resumed")
    _start_from(reference, stop, out)
    run_job({"output_dir": out, "workers": 2, "resume": True})
    res, weights = result(out)
    assert res["global_step"] == ref_res["global_step"] == 15
    assert res["rows"] == ref_res["rows"]  # every logged loss, grad norm, rate and epoch
    assert res["train_loss"] == ref_res["train_loss"]
    for k in ref_weights:
        assert torch.equal(weights[k], ref_weights[k]), k


def _as_an_earlier_release_wrote_it(folder: str) -> None:
    """Rewrite a checkpoint in the layout of releases before issue 18: trainer_state.json with the key
    `optimizer_step_attempts`, rng_state.pth as {"format": "trainwright-rng-1", "python": {...},
    "numpy": {...}, "cpu"}; the manifest's sizes and checksums follow."""
    from trainwright.checkpoint.verify import file_checksum

    state_path = os.path.join(folder, "trainer_state.json")
    with open(state_path) as f:
        state = json.load(f)
    with open(os.path.join(folder, "data_state.json")) as f:
        state["optimizer_step_attempts"] = json.load(f)["cursor"]["steps_attempted"]
    with open(state_path, "w") as f:
        json.dump(state, f, indent=2, sort_keys=True)
    rng_path = os.path.join(folder, "rng_state.pth")
    rng = torch.load(rng_path, weights_only=True)
    version, internal, gauss_next = rng["python"]
    name, keys, pos, has_gauss, cached = rng["numpy"]
    old = {
        "format": "trainwright-rng-1",
        "python": {"version": version, "state": torch.tensor(internal), "gauss_next": gauss_next},
        "numpy": {
            "bit_generator": name,
            "keys": torch.tensor(keys, dtype=torch.int64),
            "pos": pos,
            "has_gauss": has_gauss,
            "cached_gaussian": cached,
        },
        "cpu": rng["cpu"],
    }
    torch.save(old, rng_path)
    manifest_path = os.path.join(folder, "checkpoint_complete.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    for rel in ("trainer_state.json", "rng_state.pth"):
        manifest["files"][rel] = os.path.getsize(os.path.join(folder, rel))
        manifest["checksums"][rel] = file_checksum(os.path.join(folder, rel))
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)


def test_a_checkpoint_of_an_earlier_release_resumes_bit_identical(reference, tmp_path):
    ref_res, ref_weights = result(reference)
    out = str(tmp_path / "resumed")
    _start_from(reference, 8, out)
    _as_an_earlier_release_wrote_it(os.path.join(out, "checkpoint-8"))
    proc = run_job({"output_dir": out, "workers": 2, "resume": True})
    assert "unknown TrainerState keys" not in proc.stderr  # an earlier release's key is known
    res, weights = result(out)
    assert res["rows"] == ref_res["rows"] and res["train_loss"] == ref_res["train_loss"]
    for k in ref_weights:
        assert torch.equal(weights[k], ref_weights[k]), k
    state = TrainerState.load_from_json(os.path.join(out, "checkpoint-8", "trainer_state.json"))
    assert state.optimizer_step_attempts == 8


def test_resume_checkpoint_contents_are_weights_only(reference):
    folder = os.path.join(reference, "checkpoint-5")
    for name in (
        "model.safetensors",
        "optimizer.pt",
        "scheduler.pt",
        "rng_state.pth",
        "trainer_state.json",
        "training_args.json",
        "data_state.json",
    ):
        assert os.path.isfile(os.path.join(folder, name)), name
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.load(os.path.join(folder, name), weights_only=True)
    with open(os.path.join(folder, "data_state.json")) as f:
        data_state = json.load(f)
    cursor = data_state["cursor"]
    # saved inside the epoch's last step: the epoch is used up, its end-of-epoch events still to come
    assert (cursor["steps_applied"], cursor["epoch"], cursor["batch_in_epoch"]) == (5, 0, 10)
    assert cursor["samples_in_epoch"] == 40 and data_state["world_size"] == 1


def test_resumed_epoch_skips_seen_samples_without_loading_them(make_args, tmp_path):
    data = VectorDataset(n=50)
    args = make_args(
        per_device_train_batch_size=5,
        max_steps=4,
        save_strategy="steps",
        save_steps=4,
        output_dir=str(tmp_path / "a"),
    )
    Trainer(model=_LinearModel(), args=args, train_dataset=data).train()
    # resume at 40% of the 10-batch epoch, train to its end
    fresh = VectorDataset(n=50)
    args = make_args(per_device_train_batch_size=5, max_steps=10, output_dir=str(tmp_path / "a"))
    trainer = Trainer(model=_LinearModel(), args=args, train_dataset=fresh)
    trainer.train(resume_from_checkpoint=os.path.join(tmp_path, "a", "checkpoint-4"))
    # only the 5 batches of 5 after the checkpoint's batch in hand (trained first) were loaded
    assert fresh.getitem_calls == 25


class _ResumedBy(Trainer):
    """Overrides `get_resumed_dataloader` (transformers 5.25), recording each call; defers to the
    default, or hands back the loader unskipped (a stateful loader that positions itself would)."""

    def __init__(self, *args, defer: bool, **kwargs):
        super().__init__(*args, **kwargs)
        self.defer, self.calls = defer, []

    def get_resumed_dataloader(self, dataloader, num_batches):
        self.calls.append(num_batches)
        return super().get_resumed_dataloader(dataloader, num_batches) if self.defer else dataloader


def test_get_resumed_dataloader_is_called_where_a_resumed_epoch_skips(make_args, tmp_path):
    """A subclass's `get_resumed_dataloader` is given the loader and the epoch's seen micro-batches,
    and its result is what the resumed epoch trains on; the default skips in the sampler (none of the
    seen samples loaded) and the run ends bit-identical to the uninterrupted one."""

    def run(out, max_steps, resume=None, **kw):
        args = make_args(
            per_device_train_batch_size=5,
            gradient_accumulation_steps=2,
            max_steps=max_steps,
            save_strategy="steps",
            save_steps=2,
            output_dir=str(tmp_path / out),
        )
        torch.manual_seed(0)
        cls = _ResumedBy if "defer" in kw else Trainer
        trainer = cls(model=_LinearModel(), args=args, train_dataset=VectorDataset(n=50), **kw)
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    whole = run("whole", 5)  # 5 steps of 2 micro-batches: one epoch of 10 batches
    checkpoint = str(tmp_path / "whole" / "checkpoint-2")
    deferred = run("deferred", 5, checkpoint, defer=True)
    assert deferred.calls == [4]  # 2 steps x 2 micro-batches
    assert deferred.train_dataset.getitem_calls == 30  # the 6 batches left, the seen ones not loaded
    unskipped = run("unskipped", 5, checkpoint, defer=False)
    assert unskipped.calls == [4]
    for (name, a), b, c in zip(
        whole.model.state_dict().items(),
        deferred.model.state_dict().values(),
        unskipped.model.state_dict().values(),
    ):
        assert torch.equal(a, b), name
        assert not torch.equal(a, c), name  # the epoch's first batches again: the override's result trained


class _LinearModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 1)

    def forward(self, x, labels=None):
        out = self.lin(x).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


def _train_with_checkpoints(make_args, out, **kw):
    args = make_args(
        per_device_train_batch_size=8,
        max_steps=kw.pop("max_steps", 6),
        save_strategy="steps",
        save_steps=2,
        output_dir=out,
        **kw,
    )
    trainer = Trainer(model=_LinearModel(), args=args, train_dataset=VectorDataset(n=64))
    trainer.train()
    return trainer


def test_resume_true_picks_newest_complete_and_ignores_leftovers(make_args, tmp_path):
    out = str(tmp_path / "run")
    _train_with_checkpoints(make_args, out, logging_steps=2)
    # a half-written save of a later step, as a crash would leave it
    os.makedirs(os.path.join(out, ".checkpoint-8.tmp-123-456"))
    args = make_args(per_device_train_batch_size=8, max_steps=8, output_dir=out, save_strategy="no")
    trainer = Trainer(model=_LinearModel(), args=args, train_dataset=VectorDataset(n=64))
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 8
    assert any(r.get("step") == 6 for r in trainer.state.log_history)  # history came from checkpoint-6


def test_no_checkpoint_and_broken_checkpoint_errors_name_the_problem(make_args, tmp_path):
    out = str(tmp_path / "empty")
    args = make_args(output_dir=out, max_steps=2)
    trainer = Trainer(model=_LinearModel(), args=args, train_dataset=VectorDataset())
    with pytest.raises(ValueError, match="No valid checkpoint"):
        trainer.train(resume_from_checkpoint=True)
    run = str(tmp_path / "run")
    _train_with_checkpoints(make_args, run)
    os.remove(os.path.join(run, "checkpoint-6", "scheduler.pt"))
    trainer = Trainer(
        model=_LinearModel(), args=make_args(output_dir=run, max_steps=8), train_dataset=VectorDataset()
    )
    with pytest.raises(ValueError, match="scheduler.pt"):
        trainer.train(resume_from_checkpoint=os.path.join(run, "checkpoint-6"))
    assert trainer.state.global_step == 0


def test_resume_with_other_batch_geometry_continues_or_restarts_the_epoch(make_args, tmp_path):
    """Another batch size continues at the saved sample (tests/checkpoint/test_resume_geometry.py has the rule);
    ignore_data_skip restarts the current epoch from its first batch instead."""
    run = str(tmp_path / "run")
    _train_with_checkpoints(make_args, run)
    ckpt = os.path.join(run, "checkpoint-4")
    args = make_args(per_device_train_batch_size=4, max_steps=8, output_dir=run)
    assert (
        Trainer(model=_LinearModel(), args=args, train_dataset=VectorDataset(n=64))
        .train(resume_from_checkpoint=ckpt)
        .global_step
        == 8
    )
    args = make_args(per_device_train_batch_size=4, max_steps=8, output_dir=run, ignore_data_skip=True)
    trainer = Trainer(model=_LinearModel(), args=args, train_dataset=VectorDataset(n=64))
    assert trainer.train(resume_from_checkpoint=ckpt).global_step == 8
    assert trainer.cursor.samples_in_epoch == 16  # 4 steps of 4 from the epoch's start


def test_malicious_optimizer_file_is_refused_and_never_runs(make_args, tmp_path):
    run = str(tmp_path / "run")
    _train_with_checkpoints(make_args, run)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    torch.save({"state": Evil()}, os.path.join(run, "checkpoint-6", "optimizer.pt"))
    trainer = Trainer(
        model=_LinearModel(), args=make_args(output_dir=run, max_steps=8), train_dataset=VectorDataset()
    )
    with pytest.raises(Exception, match="optimizer.pt"):
        trainer.train(resume_from_checkpoint=os.path.join(run, "checkpoint-6"))
    assert not marker.exists()
    # asked for "the newest", the tampered checkpoint (its size no longer matches) is passed over
    with pytest.warns(UserWarning, match="checkpoint-6"):
        trainer.train(resume_from_checkpoint=True)
    assert not marker.exists()


def test_rotation_keeps_best_and_newest_and_load_best_model_at_end(make_args, tmp_path):
    out = str(tmp_path / "best")
    trainer = scored_best_model_run(
        make_args,
        [0.9, 0.1, 0.5, 0.7, 0.8],
        eval_length=16,
        output_dir=out,
        per_device_train_batch_size=8,
        max_steps=10,
        save_total_limit=2,
        learning_rate=0.5,
    )
    kept = sorted(d for d in os.listdir(out) if d.startswith("checkpoint-"))
    assert kept == ["checkpoint-10", "checkpoint-4"]
    assert trainer.state.best_model_checkpoint == os.path.join(out, "checkpoint-4")
    best = load_file(os.path.join(out, "checkpoint-4", "model.safetensors"))
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, best[k]), k


def test_early_stopping_state_survives_resume(tmp_path):
    ref = str(tmp_path / "ref")
    # a threshold, so that where it stops does not hang on how slowly the loss creeps down
    stopping = {
        "eval": True,
        "eval_steps": 1,
        "early_stopping": 3,
        "early_stopping_threshold": 0.05,
        "epochs": 6,
    }
    run_job({"output_dir": ref, **stopping})
    ref_res, ref_w = result(ref)
    steps = ref_res["global_step"]
    assert steps < 30  # it did stop early
    with open(os.path.join(ref, f"checkpoint-{steps - 2}", "trainer_state.json")) as f:
        saved = json.load(f)["stateful_callbacks"]["EarlyStoppingCallback"]
    assert saved["attributes"]["early_stopping_patience_counter"] >= 1
    out = str(tmp_path / "resumed")
    _start_from(ref, steps - 2, out)
    run_job({"output_dir": out, **stopping, "resume": True})
    res, w = result(out)
    assert res["global_step"] == steps  # without the restored counter it would train longer
    for k in ref_w:
        assert torch.equal(w[k], ref_w[k])


def test_sigterm_saves_and_exits_cleanly_and_second_signal_does_not_corrupt(tmp_path):
    out = str(tmp_path / "pre")
    cfg = {"output_dir": out, "announce": True, "announce_pause": 0.5, "save_steps": 1000, "epochs": 50}
    proc = start_resume_job(cfg)
    if read_until(proc, "STEP 4"):
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGTERM)
    proc.stdout.read()
    assert proc.wait(timeout=120) == 0, proc.stderr.read()[-3000:]
    saved = [d for d in os.listdir(out) if d.startswith("checkpoint-")]
    assert len(saved) == 1
    step = int(saved[0].split("-")[1])
    assert 4 <= step <= 5
    state = TrainerState.load_from_json(os.path.join(out, saved[0], "trainer_state.json"))
    assert state.global_step == step
    assert not os.path.exists(os.path.join(out, "result.json"))  # it exited instead of going on
    run_job({"output_dir": out, "resume": True, "epochs": 50, "max_steps": step + 2, "save_steps": 1000})
    assert result(out)[0]["global_step"] == step + 2


def test_resume_from_a_transformers_trainer_checkpoint(make_args, tmp_path):
    """A checkpoint folder written by transformers.Trainer resumes here: weights, optimizer,
    scheduler, RNG and the counters of trainer_state.json carry over; the data position is rebuilt
    from global_step, as upstream does."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from conftest import PaddedLM, tiny_gpt2

    out = str(tmp_path / "hf")
    hf_args = transformers.TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=4,
        max_steps=4,
        save_steps=2,
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        learning_rate=1e-3,
    )
    transformers.Trainer(model=tiny_gpt2(), args=hf_args, train_dataset=PaddedLM(n=32)).train()
    model = tiny_gpt2(seed=1)  # different weights: they must come from the checkpoint
    args = make_args(
        output_dir=out, per_device_train_batch_size=4, max_steps=4, learning_rate=1e-3, logging_steps=1
    )
    trainer = Trainer(model=model, args=args, train_dataset=PaddedLM(n=32))
    trainer.train(resume_from_checkpoint=os.path.join(out, "checkpoint-2"))
    assert trainer.state.global_step == 4
    assert [r["step"] for r in trainer.state.log_history if "loss" in r][:2] == [1, 2]  # history kept
    assert trainer.optimizer.state_dict()["state"][0]["step"].item() == 4  # Adam moments carried on


def _kill_and_resume(reference, tmp_path, kills):
    """SIGKILL a saving-every-step run at `kills` moments; each time resume from what is on disk and
    check the run still ends with the reference weights, bit for bit."""
    import time

    ref_res, ref_weights = result(reference)
    for n, (step, delay_ms) in enumerate(kills):
        out = str(tmp_path / f"kill{n}")
        proc = start_resume_job(
            {"output_dir": out, "workers": 2, "announce": True}, stderr=subprocess.DEVNULL
        )
        if read_until(proc, f"STEP {step}"):
            time.sleep(delay_ms / 1000)  # a varying moment inside the previous step's save or this step
            proc.kill()
        proc.wait(timeout=60)
        run_job({"output_dir": out, "workers": 2, "resume": True})
        res, weights = result(out)
        assert res["rows"] == ref_res["rows"], f"kill {n} at step {step} +{delay_ms} ms"
        for k in ref_weights:
            assert torch.equal(weights[k], ref_weights[k]), (n, k)


def test_sigkill_while_saving_then_resume_is_still_exact(reference, tmp_path):
    _kill_and_resume(reference, tmp_path, [(3, 0), (6, 2), (9, 5)])


@pytest.mark.slow
def test_sigkill_at_many_moments_then_resume_is_still_exact(reference, tmp_path):
    _kill_and_resume(reference, tmp_path, [(s, d) for s in range(2, 15, 2) for d in (0, 1, 3, 8)])


class _OwnLoader(Trainer):
    """A library's trainer building its own loader (sentence-transformers' batch samplers): a plain
    torch DataLoader, no resumable sampler, a collator that draws from the global RNG (as an MLM
    collator masks); a resumed epoch loads the batches it skips."""

    def get_train_dataloader(self):
        batches = [list(range(i, i + 4)) for i in range(0, 32, 4)]

        def collate(rows):
            batch = torch.utils.data.default_collate(rows)
            batch["x"] = batch["x"] + 0.01 * torch.randn_like(batch["x"])  # a draw at each load
            return batch

        return torch.utils.data.DataLoader(self.train_dataset, batch_sampler=batches, collate_fn=collate)


def test_skipped_batches_of_a_library_loader_leave_the_checkpoints_rng_as_it_was(make_args, tmp_path):
    """Loading the skipped batches draws (the loader's base seed, the collator's noise): the step after
    them still starts from the checkpoint's RNG state, so dropout and the noise replay exactly."""
    from kit.models import DropoutMLP

    def trainer(out: str) -> Trainer:
        args = make_args(max_steps=6, save_strategy="steps", save_steps=2, output_dir=out, learning_rate=0.1)
        torch.manual_seed(0)
        return _OwnLoader(model=DropoutMLP(p=0.3), args=args, train_dataset=VectorDataset(n=32))

    whole = trainer(str(tmp_path / "whole"))
    whole.train()
    resumed = trainer(str(tmp_path / "resumed"))
    # the 2 trained and the one in hand at the checkpoint (trained first, from the checkpoint)
    with pytest.warns(UserWarning, match="Skipping 3 batches by iterating"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-2"))
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_resume_onto_other_rows_of_the_same_length_says_so(make_args, tmp_path, caplog):
    """data_state.json records a `datasets` training set's fingerprint: resumed onto other rows of the
    same length (the length check cannot see it), the run says so; onto the same rows, rebuilt the
    same way, it says nothing."""
    datasets = pytest.importorskip("datasets")

    def rows(seed: int):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(32, 8, generator=g)
        data = datasets.Dataset.from_dict({"x": x.tolist(), "labels": x.sum(-1).tolist()})
        return data.map(lambda r: {"labels": r["labels"] * 2.0}).with_format("torch")

    def trainer(out: str, data) -> Trainer:
        args = make_args(
            max_steps=4, save_strategy="steps", save_steps=2, output_dir=out, per_device_train_batch_size=8
        )
        return Trainer(model=_LinearModel(), args=args, train_dataset=data)

    trainer(str(tmp_path / "a"), rows(0)).train()
    with open(tmp_path / "a" / "checkpoint-2" / "data_state.json") as f:
        assert json.load(f)["dataset_fingerprint"] == rows(0)._fingerprint
    checkpoint = str(tmp_path / "a" / "checkpoint-2")
    with caplog.at_level("WARNING", logger="trainwright"):
        trainer(str(tmp_path / "same"), rows(0)).train(resume_from_checkpoint=checkpoint)
    assert "fingerprint" not in caplog.text
    with caplog.at_level("WARNING", logger="trainwright"):
        trainer(str(tmp_path / "other"), rows(1)).train(resume_from_checkpoint=checkpoint)
    assert f"fingerprint differs from the checkpoint's ({rows(0)._fingerprint} in it" in caplog.text


class _NoisyStream(torch.utils.data.IterableDataset):
    """An iterable dataset loaded in the main process that draws from torch's RNG for each sample
    (an augmentation): a resume loads the samples it skips."""

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for _ in range(32):
            x = torch.randn(8, generator=g)
            yield {"x": x + 0.01 * torch.randn(8), "labels": x.sum()}


def test_skipped_batches_of_an_iterable_dataset_leave_the_checkpoints_rng_as_it_was(make_args, tmp_path):
    from kit.models import DropoutMLP

    def trainer(out: str) -> Trainer:
        args = make_args(max_steps=6, save_strategy="steps", save_steps=2, output_dir=out, learning_rate=0.1)
        torch.manual_seed(0)
        return Trainer(model=DropoutMLP(p=0.3), args=args, train_dataset=_NoisyStream())

    whole = trainer(str(tmp_path / "whole"))
    whole.train()
    resumed = trainer(str(tmp_path / "resumed"))
    # the 2 trained and the one in hand at the checkpoint (trained first, from the checkpoint)
    with pytest.warns(UserWarning, match="Skipping 3 batches by iterating"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-2"))
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("stop", [2, 4], ids=["after-one-evaluation", "at-an-epoch-end"])
def test_persistent_workers_resume_exactly(make_args, tmp_path, stop):
    """With dataloader_persistent_workers, torch's loader draws its base seed from the global RNG at
    its first iteration only: a resumed process's kept evaluation loader, and its training loader at
    an epoch's start, have iterated in the run it continues, so they do not draw again."""
    from kit.models import DropoutMLP

    def trainer(out: str) -> Trainer:
        args = make_args(
            num_train_epochs=2,
            per_device_train_batch_size=8,
            save_strategy="steps",
            save_steps=2,
            eval_strategy="steps",
            eval_steps=2,
            output_dir=out,
            learning_rate=0.1,
            dataloader_num_workers=1,
            dataloader_persistent_workers=True,
        )
        torch.manual_seed(0)
        return Trainer(
            model=DropoutMLP(p=0.3),
            args=args,
            train_dataset=VectorDataset(n=32),
            eval_dataset=VectorDataset(n=16),
        )

    whole = trainer(str(tmp_path / "whole"))
    whole.train()
    resumed = trainer(str(tmp_path / "resumed"))
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / f"checkpoint-{stop}"))
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
