"""Hub pushes of real training runs, up to the network call: `huggingface_hub.HfApi.create_repo` and
`upload_folder` are replaced at the library boundary by a recorder that lists the files the real
client would upload (its own ignore-pattern filter) and returns real Futures. The failure without
network goes through the real client, against a closed loopback port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import types
from concurrent.futures import Future
from pathlib import Path

import pytest
from kit import TESTS
from test_model_card import TokenDataset, tiny_gpt2

from trainwright import Trainer, TrainerCallback, TrainingArguments
from trainwright.loop.hub.model_card import read_metadata
from trainwright.loop.hub.push import HubError

huggingface_hub = pytest.importorskip("huggingface_hub")
from huggingface_hub import HfApi, RepoUrl  # noqa: E402
from huggingface_hub.utils import filter_repo_objects  # noqa: E402


class HubRecorder:
    """create_repo / upload_folder calls; uploads answer with Futures done at once, or left
    pending (`pending=True`) until `finish()`."""

    def __init__(self, monkeypatch, pending: bool = False) -> None:
        self.repos: list[dict] = []
        self.uploads: list[dict] = []
        self.events: list[str] = []
        self.pending = pending
        self.futures: list[Future] = []
        recorder = self

        def create_repo(api, repo_id, **kwargs):
            recorder.repos.append({"repo_id": repo_id, **kwargs})
            full_id = repo_id if "/" in repo_id else f"me/{repo_id}"  # the token owner's namespace
            return RepoUrl(f"{api.endpoint}/{full_id}", endpoint=api.endpoint)

        def upload_folder(api, *, folder_path, run_as_future=False, **kwargs):
            files = sorted(
                str(p.relative_to(folder_path)).replace(os.sep, "/")
                for p in Path(folder_path).rglob("*")
                if p.is_file()
            )
            kept = list(filter_repo_objects(files, ignore_patterns=kwargs.get("ignore_patterns")))
            recorder.uploads.append(
                {"folder_path": folder_path, "files": kept, "run_as_future": run_as_future, **kwargs}
            )
            recorder.events.append(f"upload {kwargs.get('commit_message')}")
            if not run_as_future:
                return f"commit {len(recorder.uploads)}"
            future: Future = Future()
            recorder.futures.append(future)
            if not recorder.pending:
                future.set_result(f"commit {len(recorder.uploads)}")
            return future

        monkeypatch.setattr(HfApi, "create_repo", create_repo)
        monkeypatch.setattr(HfApi, "upload_folder", upload_folder)

    def finish(self) -> None:
        for future in self.futures:
            if not future.done():
                self.events.append("finished")
                future.set_result("late commit")


class PushCounter(TrainerCallback):
    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_push_begin(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


def make_trainer(tmp_path, name: str = "tiny-hub", callbacks=(), **overrides) -> Trainer:
    args = {
        "output_dir": str(tmp_path / name),
        "per_device_train_batch_size": 4,
        "max_steps": 6,
        "save_strategy": "steps",
        "save_steps": 2,
        "logging_steps": 2,
        "report_to": "none",
        "disable_tqdm": True,
        "push_to_hub": True,
        "hub_model_id": "me/tiny-hub",
        **overrides,
    }
    return Trainer(
        model=tiny_gpt2(),
        args=TrainingArguments(**args),
        train_dataset=TokenDataset(48),
        callbacks=list(callbacks),
    )


def test_repo_created_at_construction(tmp_path, monkeypatch):
    hub = HubRecorder(monkeypatch)
    trainer = make_trainer(tmp_path, hub_token="hf_secret", hub_private_repo=True)
    assert hub.repos == [{"repo_id": "me/tiny-hub", "token": "hf_secret", "private": True, "exist_ok": True}]
    assert trainer.hub_model_id == "me/tiny-hub" and trainer.push_in_progress is None
    # without hub_model_id the repository is named after output_dir, in the token owner's namespace
    trainer = make_trainer(tmp_path, name="run-7", hub_model_id=None)
    assert hub.repos[-1]["repo_id"] == "run-7" and trainer.hub_model_id == "me/run-7"
    # push_to_hub=False: no Hub call at all
    make_trainer(tmp_path, push_to_hub=False)
    assert len(hub.repos) == 2


def test_every_save_pushes_output_dir_in_the_background(tmp_path, monkeypatch):
    hub, pushes = HubRecorder(monkeypatch), PushCounter()
    trainer = make_trainer(tmp_path, callbacks=[pushes], hub_token="hf_secret", hub_revision="dev")
    trainer.train()
    assert pushes.steps == [2, 4, 6]  # on_push_begin before each push
    assert [u["commit_message"] for u in hub.uploads] == [
        f"Training in progress, step {s}" for s in (2, 4, 6)
    ]
    out = trainer.args.output_dir
    for upload in hub.uploads:
        assert upload["folder_path"] == out and upload["run_as_future"] is True
        assert upload["repo_id"] == "me/tiny-hub" and upload["token"] == "hf_secret"
        assert upload["revision"] == "dev" and "path_in_repo" not in upload
        assert upload["ignore_patterns"] == ["_*", "checkpoint-*", ".checkpoint-*"]
        # the model files copied from the checkpoint, never a checkpoint folder
        assert {"config.json", "generation_config.json", "model.safetensors", "training_args.json"} <= set(
            upload["files"]
        )
        assert not [f for f in upload["files"] if "checkpoint-" in f]
    assert os.path.isdir(os.path.join(out, "checkpoint-6"))  # written, just not uploaded


@pytest.mark.parametrize("strategy, folder", [("checkpoint", "last-checkpoint"), ("all_checkpoints", None)])
def test_checkpoint_strategies_also_push_the_checkpoint(tmp_path, monkeypatch, strategy, folder):
    hub = HubRecorder(monkeypatch)
    trainer = make_trainer(tmp_path, hub_strategy=strategy, max_steps=4)
    trainer.train()
    assert len(hub.uploads) == 4  # output_dir + checkpoint at steps 2 and 4
    for step, (model_push, ckpt_push) in zip((2, 4), zip(hub.uploads[::2], hub.uploads[1::2])):
        assert model_push["folder_path"] == trainer.args.output_dir
        assert ckpt_push["folder_path"] == os.path.join(trainer.args.output_dir, f"checkpoint-{step}")
        assert ckpt_push["path_in_repo"] == (folder or f"checkpoint-{step}")
        assert ckpt_push["commit_message"] == f"Training in progress, step {step}, checkpoint"
        assert ckpt_push["run_as_future"] is True
        # the whole checkpoint (optimizer, RNG, state) so that a run can resume from the Hub
        assert {"optimizer.pt", "trainer_state.json", "data_state.json", "model.safetensors"} <= set(
            ckpt_push["files"]
        )


def test_end_strategy_pushes_only_when_asked(tmp_path, monkeypatch):
    hub, pushes = HubRecorder(monkeypatch), PushCounter()
    trainer = make_trainer(tmp_path, hub_strategy="end", callbacks=[pushes])
    trainer.train()
    assert hub.uploads == [] and pushes.steps == []
    trainer.push_to_hub()
    (upload,) = hub.uploads
    assert upload["commit_message"] == "End of training" and upload["run_as_future"] is False
    assert pushes.steps == [6]


def test_push_skipped_while_the_previous_one_runs_and_train_waits_for_it(tmp_path, monkeypatch):
    hub = HubRecorder(monkeypatch, pending=True)

    class FinishLater(TrainerCallback):
        def on_train_end(self, args, state, control, **kwargs):
            threading.Timer(0.3, hub.finish).start()

    trainer = make_trainer(tmp_path, callbacks=[FinishLater()])
    trainer.train()
    # steps 4 and 6 came while the push of step 2 was still running: skipped
    assert [u["commit_message"] for u in hub.uploads] == ["Training in progress, step 2"]
    assert all(f.done() for f in hub.futures)  # train() returned only once the upload was done
    assert hub.events == ["upload Training in progress, step 2", "finished"]


def test_hub_always_push_pushes_every_save(tmp_path, monkeypatch):
    hub = HubRecorder(monkeypatch, pending=True)
    trainer = make_trainer(tmp_path, hub_always_push=True, hub_strategy="checkpoint")
    timer = threading.Timer(0.3, hub.finish)
    trainer.add_callback(type("Finish", (TrainerCallback,), {"on_train_end": lambda *a, **k: timer.start()}))
    trainer.train()
    assert [u["commit_message"] for u in hub.uploads] == [
        f"Training in progress, step {s}{suffix}" for s in (2, 4, 6) for suffix in ("", ", checkpoint")
    ]
    assert len(trainer.push_in_progress.jobs) == 6 and trainer.push_in_progress.is_done()


def test_push_to_hub_saves_writes_the_card_and_waits_for_the_checkpoint_push(tmp_path, monkeypatch):
    hub, pushes = HubRecorder(monkeypatch), PushCounter()
    trainer = make_trainer(tmp_path, callbacks=[pushes], hub_strategy="every_save", max_steps=2)
    trainer.model.model_tags = ["trl", "sft"]  # tags a model carries join the card's
    trainer.train()
    hub.pending = True  # the checkpoint push again, left running until finish() ...
    trainer._push_from_checkpoint(os.path.join(trainer.args.output_dir, "checkpoint-2"))
    threading.Timer(0.3, hub.finish).start()
    assert not hub.futures[-1].done()
    result = trainer.push_to_hub(commit_message="Final", tags="mine", dataset="Tiny")
    # ... and the final push uploaded only after it was done
    assert hub.events == ["upload Training in progress, step 2"] * 2 + ["finished", "upload Final"]
    final = hub.uploads[-1]
    assert result == "commit 3" and final["run_as_future"] is False and final["revision"] is None
    assert final["ignore_patterns"] == ["_*", "checkpoint-*", ".checkpoint-*"]
    assert {"README.md", "model.safetensors", "config.json", "training_args.json"} <= set(final["files"])
    assert not [f for f in final["files"] if "checkpoint-" in f]
    meta = read_metadata(os.path.join(trainer.args.output_dir, "README.md"))
    assert meta["model-index"][0]["name"] == "tiny-hub"  # the repository's name
    assert meta["tags"] == ["mine", "trl", "sft", "generated_from_trainer"]
    assert pushes.steps == [2, 2, 2]

    # not blocking: the Future of the upload; a user's save_model() pushes too ("Model save")
    future = trainer.push_to_hub(blocking=False, revision="v1")
    assert isinstance(future, Future) and hub.uploads[-1]["revision"] == "v1"
    hub.finish()
    trainer.save_model()
    assert hub.uploads[-1]["commit_message"] == "Model save"


def test_push_to_hub_without_push_to_hub_argument_creates_the_repo(tmp_path, monkeypatch):
    hub = HubRecorder(monkeypatch)
    trainer = make_trainer(tmp_path, push_to_hub=False, max_steps=2)
    trainer.train()
    assert hub.repos == [] and hub.uploads == []  # the argument is off: no push at saves
    trainer.push_to_hub(token="hf_tok", private=True)
    assert hub.repos == [{"repo_id": "me/tiny-hub", "token": "hf_tok", "private": True, "exist_ok": True}]
    assert hub.uploads[-1]["token"] == "hf_tok"


def test_a_subclass_init_hf_repo_is_called_by_a_push_and_the_pusher_keeps_no_trainer(tmp_path, monkeypatch):
    # the pusher reads values built at the call; the repository hook is the Trainer's, called back
    hub = HubRecorder(monkeypatch)
    made = []

    class Named(Trainer):
        def init_hf_repo(self, token=None, private=None):
            made.append(token)
            self.hub_model_id = "me/from-subclass"

    trainer = make_trainer(tmp_path, push_to_hub=False, max_steps=2)
    trainer.__class__ = Named
    trainer.args.push_to_hub = True  # turned on after __init__: the first push makes the repository
    trainer.train()
    assert made == [None] and {u["repo_id"] for u in hub.uploads} == {"me/from-subclass"}
    push = trainer._hub_push()
    assert all(not isinstance(v, Trainer) for v in vars(push).values())


def test_offline_mode_fails_at_construction_naming_the_setting(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(
        HubError, match=r"push_to_hub=True / hub_model_id='me/tiny-hub': could not reach .*offline"
    ):
        make_trainer(tmp_path)
    trainer = make_trainer(tmp_path, push_to_hub=False, max_steps=2)
    with pytest.raises(
        HubError, match=r"Trainer\.push_to_hub\(\) / hub_model_id='me/tiny-hub': could not reach"
    ):
        trainer.push_to_hub()


def test_invalid_repository_id_is_refused_by_the_real_client(tmp_path):
    with pytest.raises(ValueError, match=r"hub_model_id='me/a b': not a valid Hub repository id"):
        make_trainer(tmp_path, hub_model_id="me/a b")
    with pytest.raises(ValueError, match=r"hub_model_id=None: not a valid Hub repository id.*'has space'"):
        make_trainer(tmp_path, name="has space", hub_model_id=None)


def test_failed_background_push_is_logged(tmp_path, monkeypatch, caplog):
    """A checkpoint push that fails in its thread (the real client, no server) is an error in the log."""
    monkeypatch.setattr(
        HfApi,
        "create_repo",
        lambda api, repo_id, **kw: RepoUrl(f"{api.endpoint}/{repo_id}", endpoint=api.endpoint),
    )
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    # the client retries 5 times with 1-8 s waits: same retries, no waiting
    from huggingface_hub.utils import _http

    monkeypatch.setattr(_http, "time", types.SimpleNamespace(sleep=lambda seconds: None))
    trainer = make_trainer(tmp_path, max_steps=2)
    with caplog.at_level("ERROR", logger="trainwright.loop.hub.push"):
        trainer.train()  # training goes on; train() waits for the failed upload
    messages = [r.getMessage() for r in caplog.records if r.name == "trainwright.loop.hub.push"]
    assert any(
        "push_to_hub=True / hub_model_id='me/tiny-hub': Training in progress, step 2 failed" in m
        and "could not reach the Hugging Face Hub" in m
        for m in messages
    ), messages


def test_no_network_user_script_gets_a_clear_error(tmp_path):
    """What a user sees: the real client against a closed port, in a fresh process."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(TESTS)!r}]
        from test_model_card import tiny_gpt2
        from trainwright import Trainer, TrainingArguments
        args = TrainingArguments(output_dir={str(tmp_path / "out")!r}, push_to_hub=True,
                                 hub_model_id="me/tiny", report_to="none")
        Trainer(model=tiny_gpt2(), args=args)
        """
    )
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0", "HF_TOKEN": "hf_x"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("trainwright.loop.hub.push.HubError: push_to_hub=True / hub_model_id='me/tiny': ")
    assert "could not reach the Hugging Face Hub (ConnectError" in last
    assert "AttributeError" not in done.stderr


def test_sharded_checkpoint_pushes_its_index_and_every_shard(tmp_path, monkeypatch):
    hub = HubRecorder(monkeypatch)
    trainer = make_trainer(tmp_path, max_steps=2, save_max_shard_size="20KB")
    trainer.train()
    ckpt = os.path.join(trainer.args.output_dir, "checkpoint-2")
    with open(os.path.join(ckpt, "model.safetensors.index.json"), encoding="utf-8") as f:
        shards = set(json.load(f)["weight_map"].values())
    assert len(shards) > 1
    (upload,) = hub.uploads
    assert {"model.safetensors.index.json", *shards} <= set(upload["files"])
