"""Asynchronous saves in the Trainer (`async_save=True`): checkpoints byte-identical to synchronous ones,
`on_save` once each is durable, waits before save_model / the best model / an exit, background errors
(a full disk too) stopping training naming the file, a bit-exact resume in a new process, and
`wait_for_checkpoint()`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from checkpoint_kit import checkpoints
from kit import TESTS

import trainwright.checkpoint as ckpt
from trainwright.checkpoint.async_writer import AsyncCheckpointError


class TokenRows(torch.utils.data.Dataset):
    def __init__(self, n: int = 48, seq: int = 12, vocab: int = 64):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, vocab, (n, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _trainer(out, model=None, data=None, callbacks=(), trainer_class=None, **kw):
    from conftest import DropoutMLP, VectorDataset

    from trainwright import Trainer, TrainingArguments

    kw = {
        "max_steps": 6,
        "save_strategy": "steps",
        "save_steps": 2,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "learning_rate": 0.05,
        "logging_steps": 1,
        "report_to": "none",
        "disable_tqdm": True,
        "use_cpu": True,
        "seed": 3,
        **kw,
    }
    torch.manual_seed(0)
    return (trainer_class or Trainer)(
        model=model if model is not None else DropoutMLP(),
        args=TrainingArguments(output_dir=str(out), **kw),
        train_dataset=data if data is not None else VectorDataset(),
        callbacks=list(callbacks),
    )


@pytest.mark.parametrize("model", ["mlp", "gpt2"])
def test_trainer_async_checkpoints_are_byte_identical_to_sync_ones(tmp_path, model):
    from conftest import tiny_gpt2

    runs = {}
    out = tmp_path / "run"  # the same output_dir for both (training_args.json records it)
    for mode in ("sync", "async"):
        if model == "gpt2":  # transformers' save_pretrained, tied embeddings, dropout
            trainer = _trainer(
                out, tiny_gpt2(dropout=0.1), TokenRows(), async_save=mode == "async", save_total_limit=2
            )
        else:
            trainer = _trainer(out, async_save=mode == "async", save_total_limit=2)
        trainer.train()
        runs[mode] = checkpoints(out)
        assert [e for e in os.listdir(out) if e.startswith(".") and "lock" not in e] == []
        os.rename(out, tmp_path / mode)
    assert list(runs["sync"]) == list(runs["async"]) == ["checkpoint-4", "checkpoint-6"]  # rotated alike
    for name, files in runs["sync"].items():
        assert ckpt.CHECKPOINT_COMPLETE_NAME in files
        assert sorted(files) == sorted(runs["async"][name]), name
        assert [f for f in files if files[f] != runs["async"][name][f]] == [], name


class _SlowWrites:
    """Makes the background write of the optimizer state sleep first, and records which threads
    wrote Stateful parts and how many such writes ran at once."""

    def __init__(self, monkeypatch, delay: float = 0.15) -> None:
        from trainwright.checkpoint.manager import CheckpointManager

        real = CheckpointManager.write_state
        self.threads: set[str] = set()
        self.running = self.most = 0
        lock = threading.Lock()

        def slow(manager, folder, name, state):
            with lock:
                self.running += 1
                self.most = max(self.most, self.running)
            self.threads.add(threading.current_thread().name)
            try:
                if name == "optimizer":
                    time.sleep(delay)
                return real(manager, folder, name, state)
            finally:
                with lock:
                    self.running -= 1

        monkeypatch.setattr(CheckpointManager, "write_state", slow)


def test_on_save_fires_once_per_checkpoint_when_it_is_durable(tmp_path, monkeypatch):
    from trainwright import TrainerCallback

    slow = _SlowWrites(monkeypatch)
    seen: list[tuple[int, int, bool]] = []
    steps_while_writing: list[int] = []

    class Watch(TrainerCallback):
        def __init__(self):
            self.trainer = None

        def on_step_end(self, args, state, control, **kw):
            writer = self.trainer._run.checkpointer.writer
            if writer is not None and writer.pending:
                steps_while_writing.append(state.global_step)

        def on_save(self, args, state, control, **kw):
            # the state of the saved step; the folder is complete when the event fires
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            seen.append(
                (state.global_step, self.trainer.state.global_step, ckpt.verify_checkpoint(folder) == [])
            )

    watch = Watch()
    trainer = _trainer(tmp_path, callbacks=[watch], async_save=True, max_steps=8, save_total_limit=1)
    watch.trainer = trainer
    trainer.train()
    assert [s[0] for s in seen] == [2, 4, 6, 8] and all(s[2] for s in seen)
    assert all(live >= saved for saved, live, _ in seen)
    assert steps_while_writing  # training went on while a checkpoint was written
    assert slow.most == 1 and slow.threads == {"trainwright-checkpoint-writer"}
    assert not trainer._run.checkpointer.writer.pending  # train() returned with the last one durable
    assert sorted(e for e in os.listdir(tmp_path) if not e.startswith(".")) == ["checkpoint-8"]  # rotated


def test_save_model_and_load_best_model_wait_for_the_pending_checkpoint(tmp_path, monkeypatch):
    from conftest import VectorDataset
    from safetensors.torch import load_file

    from trainwright import TrainerCallback

    _SlowWrites(monkeypatch, delay=0.3)
    observed = []

    class SaveModelAfterASave(TrainerCallback):
        def __init__(self):
            self.trainer = None

        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 3:  # checkpoint-2 is being written
                pending = self.trainer._run.checkpointer.writer.pending
                self.trainer.save_model(os.path.join(args.output_dir, "exported"))
                observed.append(
                    (pending, ckpt.verify_checkpoint(os.path.join(args.output_dir, "checkpoint-2")))
                )

    cb = SaveModelAfterASave()
    trainer = _trainer(
        tmp_path,
        callbacks=[cb],
        async_save=True,
        eval_strategy="steps",
        eval_steps=2,
        load_best_model_at_end=True,
        metric_for_best_model="loss",
    )
    trainer.eval_dataset = VectorDataset(16, seed=1)
    cb.trainer = trainer
    trainer.train()
    assert observed == [(True, [])]
    best = trainer.state.best_model_checkpoint
    assert best is not None and ckpt.verify_checkpoint(best) == []
    weights = trainer.model.state_dict()
    saved = load_file(os.path.join(best, ckpt.WEIGHTS_NAME))
    assert all(torch.equal(weights[k], saved[k]) for k in saved)


def test_a_background_write_error_stops_training_naming_the_file(tmp_path):
    from trainwright import TrainerCallback
    from trainwright.core.state import ExportableState

    class Unwritable(TrainerCallback, ExportableState):
        """Its exported state is not JSON: trainer_state.json can't be written (in the background)."""

        def state(self):
            return {"args": {}, "attributes": {"when": object()}}

    trainer = _trainer(tmp_path, callbacks=[Unwritable()], async_save=True)
    with pytest.raises(AsyncCheckpointError) as caught:
        trainer.train()
    text = str(caught.value)
    assert "trainer_state.json" in text and "checkpoint-2" in text and "background" in text
    assert trainer.state.global_step in (
        2,
        3,
        4,
    )  # raised at a step boundary after the write, or the next save
    assert [e for e in os.listdir(tmp_path) if e.startswith("checkpoint-") or ".tmp-" in e] == []


def test_an_exception_in_the_loop_finishes_the_pending_write(tmp_path, monkeypatch):
    from trainwright import TrainerCallback

    _SlowWrites(monkeypatch, delay=0.3)

    class Boom(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 3:  # checkpoint-2 is being written
                raise ValueError("boom at step 3")

    trainer = _trainer(tmp_path, callbacks=[Boom()], async_save=True)
    with pytest.raises(ValueError, match="boom at step 3"):
        trainer.train()
    assert ckpt.verify_checkpoint(tmp_path / "checkpoint-2") == []
    assert ckpt.get_last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-2")
    assert [e for e in os.listdir(tmp_path) if ".tmp-" in e] == []
    assert not trainer._run.checkpointer.writer.pending
    trainer.remove_callback(Boom)
    trainer.train(resume_from_checkpoint=True)  # the lock was released, the checkpoint resumes
    assert trainer.state.global_step == 6


def test_preemption_with_a_pending_write_exits_with_the_checkpoints_durable(tmp_path, monkeypatch):
    import signal

    from trainwright import TrainerCallback

    _SlowWrites(monkeypatch, delay=0.3)

    class Preempt(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 3:  # checkpoint-2 is still being written
                os.kill(os.getpid(), signal.SIGTERM)

    trainer = _trainer(tmp_path, callbacks=[Preempt()], async_save=True, max_steps=8)
    with pytest.raises(SystemExit) as exit_info:
        trainer.train()
    assert exit_info.value.code == 0
    for step in (2, 3):
        assert ckpt.verify_checkpoint(tmp_path / f"checkpoint-{step}") == []
    assert ckpt.get_last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-3")


def test_a_subclass_overriding_a_save_hook_saves_synchronously(tmp_path, caplog):
    from trainwright import Trainer

    calls = []

    class Custom(Trainer):
        def _save(self, output_dir=None, state_dict=None):
            calls.append(threading.current_thread().name)
            super()._save(output_dir, state_dict)

    trainer = _trainer(tmp_path, trainer_class=Custom, max_steps=4, async_save=True)
    with caplog.at_level("WARNING", logger="trainwright"):
        trainer.train()
    assert calls == [threading.current_thread().name] * 2
    said = [r.getMessage() for r in caplog.records if "written synchronously" in r.getMessage()]
    assert len(said) == 1 and "overrides _save" in said[0]  # once, naming the hook
    assert trainer._run.checkpointer.writer is None


_RESUME_JOB = textwrap.dedent(
    """
    import json, os, sys
    import torch
    sys.path.insert(0, sys.argv[2])
    from conftest import DropoutMLP, VectorDataset
    from trainwright import Trainer, TrainingArguments

    cfg = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    args = TrainingArguments(
        output_dir=cfg["out"], max_steps=12, save_strategy="steps", save_steps=2, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, learning_rate=0.05, lr_scheduler_type="cosine", warmup_steps=2,
        logging_steps=1, report_to="none", disable_tqdm=True, use_cpu=True, seed=3, async_save=cfg["async"],
    )
    torch.manual_seed(0)
    trainer = Trainer(model=DropoutMLP(), args=args, train_dataset=VectorDataset())
    out = trainer.train(resume_from_checkpoint=cfg.get("resume"))
    trainer.save_model(os.path.join(cfg["out"], "final"))
    rows = [r for r in trainer.state.log_history if "loss" in r]
    with open(os.path.join(cfg["out"], "result.json"), "w") as f:
        json.dump({"rows": rows, "train_loss": out.training_loss, "step": out.global_step}, f)
    """
)


def test_resume_from_an_async_checkpoint_in_a_new_process_is_bit_exact(tmp_path):
    import shutil

    from safetensors.torch import load_file

    script = tmp_path / "job.py"
    script.write_text(_RESUME_JOB)

    def job(**cfg):
        proc = subprocess.run(
            [sys.executable, str(script), json.dumps(cfg), str(TESTS)],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        out = cfg["out"]
        return json.loads(open(os.path.join(out, "result.json")).read()), load_file(
            os.path.join(out, "final", ckpt.WEIGHTS_NAME)
        )

    ref, ref_weights = job(out=str(tmp_path / "sync"), **{"async": False})
    done, done_weights = job(out=str(tmp_path / "async"), **{"async": True})
    assert done == ref and all(torch.equal(done_weights[k], ref_weights[k]) for k in ref_weights)
    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    shutil.copytree(tmp_path / "async" / "checkpoint-6", resumed_dir / "checkpoint-6")
    res, weights = job(out=str(resumed_dir), resume=True, **{"async": True})
    assert res["step"] == 12 and res["rows"] == ref["rows"] and res["train_loss"] == ref["train_loss"]
    assert all(torch.equal(weights[k], ref_weights[k]) for k in ref_weights)


def test_a_full_disk_during_a_background_write_keeps_the_previous_checkpoint(tmp_path):
    """A real full disk (tmpfs) under the writer thread: the error reaches train() naming the
    checkpoint, the file and the full disk; the previous checkpoint stays the newest."""
    from kit.faults import Net, check_full_disk_error, fault_trainer, mounted_tmpfs

    # as in test_faults_runtime: a checkpoint ~1 MiB on a 1.56 MiB disk, the second fails in optimizer.pt
    with mounted_tmpfs(tmp_path / "disk", "1600k") as out:
        trainer = fault_trainer(out, model=Net(width=8000), max_steps=4, save_steps=2, async_save=True)
        with pytest.raises(AsyncCheckpointError) as info:
            trainer.train()
        check_full_disk_error(info.value, out, "checkpoint-4", "optimizer.pt")
        assert "background" in str(info.value)
        assert sorted(os.listdir(out)) == ["checkpoint-2"]  # no hidden folder, no lock left
        assert ckpt.get_last_checkpoint(out) == os.path.join(out, "checkpoint-2")


def test_wait_for_checkpoint_returns_once_the_background_write_is_durable(tmp_path, monkeypatch):
    """`Trainer.wait_for_checkpoint()`: the public way to wait for an async save (benches, a user
    copying a checkpoint): on return the folder is in place and `on_save` has run."""
    from conftest import VectorDataset

    from trainwright import TrainerCallback
    from trainwright.checkpoint import async_writer

    slow_write = async_writer.write_checkpoint

    def slow(*args, **kwargs):  # the background write outlasts the next step
        time.sleep(0.5)
        return slow_write(*args, **kwargs)

    monkeypatch.setattr(async_writer, "write_checkpoint", slow)

    class WaitAfterSave(TrainerCallback):
        def __init__(self):
            self.saved: list[int] = []
            self.seen: list[tuple[int, bool, list[int]]] = []
            self.trainer = None

        def on_save(self, args, state, control, **kwargs):
            self.saved.append(state.global_step)

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step and state.global_step % 2 == 0:  # the step after a save
                self.trainer.wait_for_checkpoint()
                folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
                done = os.path.isfile(os.path.join(folder, "checkpoint_complete.json"))
                self.seen.append((state.global_step, done, list(self.saved)))

    callback = WaitAfterSave()
    trainer = _trainer(
        tmp_path,
        data=VectorDataset(16),
        callbacks=[callback],
        max_steps=5,
        gradient_accumulation_steps=1,
        async_save=True,
    )
    callback.trainer = trainer
    trainer.train()
    assert callback.seen == [(2, True, [2]), (4, True, [2, 4])]  # durable, and on_save ran by then
    _trainer(tmp_path / "idle").wait_for_checkpoint()  # nothing written: returns at once
