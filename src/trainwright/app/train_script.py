"""`trainwright train`: a causal-LM fine-tuning/pre-training run from a config file and local data.

    trainwright train run.yaml --learning_rate 3e-4

The config holds ModelArguments, DataArguments and TrainingArguments fields side by side. The
model is built from a transformers config (`model_type` + `model_config`, or a local
`model_name_or_path`) or is trainwright's TinyGPT (`model_type: tinygpt`); text comes from local
.txt / .jsonl files. Nothing is downloaded. `docs/train_config.md` has a complete config.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import inspect
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Dataset

from trainwright.core.events import TrainerCallback


@dataclass
class ModelArguments:
    model_type: str = field(
        default="tinygpt", metadata={"help": "tinygpt, or a transformers model type (gpt2, llama, ...)"}
    )
    model_name_or_path: str | None = field(default=None, metadata={"help": "local folder of a saved model"})
    model_config: dict[str, Any] | None = field(default=None, metadata={"help": "config values (JSON)"})
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "local tokenizer folder; bytes if unset"}
    )


@dataclass
class DataArguments:
    train_file: str | None = field(default=None, metadata={"help": ".txt or .jsonl file with training text"})
    validation_file: str | None = field(default=None, metadata={"help": ".txt or .jsonl file for evaluation"})
    text_column: str = field(default="text", metadata={"help": "field holding the text in .jsonl files"})
    block_size: int = field(default=128, metadata={"help": "tokens per training example"})
    speed_monitor: bool = field(
        default=False, metadata={"help": "log throughput (tokens/s) and MFU with each training row"}
    )


class TokenBlocks(Dataset):
    """Consecutive blocks of `block_size` token ids; labels equal the ids (the model shifts)."""

    def __init__(self, ids: list[int], block_size: int, source: str):
        if len(ids) < block_size:
            raise ValueError(f"{source}: {len(ids)} tokens, fewer than block_size={block_size}.")
        self.ids = torch.tensor(ids, dtype=torch.long)
        self.block_size = block_size

    def __len__(self) -> int:
        return len(self.ids) // self.block_size

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        chunk = self.ids[i * self.block_size : (i + 1) * self.block_size]
        return {"input_ids": chunk, "labels": chunk}


def read_documents(path: str, text_column: str) -> list[str]:
    """The documents of a data file: a .txt file is one, a .jsonl file one per record."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Data file not found: {path}")
    if not path.endswith(".jsonl"):
        with open(path, encoding="utf-8") as f:
            return [f.read()]
    docs = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                row = json.loads(line)
                if text_column not in row:
                    raise ValueError(f"{path}:{n}: no {text_column!r} field (fields: {sorted(row)}).")
                docs.append(row[text_column])
    return docs


def encode_documents(docs: list[str], tokenizer: Any) -> list[int]:
    """Token ids of the documents one after the other: with a tokenizer, each ends with its EOS token
    (where it has one), so a model learns where a document stops; else UTF-8 bytes, documents
    separated by a blank line."""
    if tokenizer is None:
        return list("\n\n".join(docs).encode("utf-8"))
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for doc in docs:
        piece = list(tokenizer(doc)["input_ids"])
        ids += piece + ([eos] if eos is not None and (not piece or piece[-1] != eos) else [])
    return ids


def load_tokenizer(path: str) -> Any:
    """A tokenizer from a local folder, without the network (a Hub name is refused in one line)."""
    if not os.path.isdir(path):
        raise ValueError(
            f"tokenizer_name_or_path={path!r} is not a local folder: trainwright train reads local files only. "
            "Save the tokenizer with save_pretrained(folder) and give that folder."
        )
    if not _has_tokenizer_files(path):
        raise ValueError(
            f"tokenizer_name_or_path={path!r} holds no tokenizer: none of tokenizer.json, "
            f"tokenizer_config.json or a vocabulary file is there ({_listing(path)}). Give the folder a "
            "tokenizer's save_pretrained(folder) wrote."
        )
    import transformers

    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:  # transformers' reasons, several lines each
        raise ValueError(
            f"tokenizer_name_or_path={path!r}: transformers cannot load a tokenizer from this folder: "
            + " ".join(str(e).split())
        ) from e
    if len(tokenizer) < 2:  # e.g. a model folder's config.json alone: a tokenizer that encodes nothing
        raise ValueError(
            f"tokenizer_name_or_path={path!r}: the tokenizer loaded from it has {len(tokenizer)} token(s) "
            f"({_listing(path)}); give a folder a tokenizer's save_pretrained(folder) wrote."
        )
    return tokenizer


def _has_tokenizer_files(folder: str) -> bool:
    """Whether `folder` holds a tokenizer's files (its config, or a vocabulary transformers reads)."""
    names = os.listdir(folder)
    return any(
        n in ("tokenizer.json", "tokenizer_config.json", "merges.txt", "tekken.json")
        or n.startswith("vocab")
        or n.endswith(".model")
        for n in names
    )


def _listing(folder: str) -> str:
    names = sorted(os.listdir(folder))
    if not names:
        return "the folder is empty"
    return "it holds " + ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def special_token_ids(tokenizer: Any) -> dict[str, int | None]:
    """bos / eos / pad ids of a model config from its tokenizer (none without one: bytes have none)."""
    return {
        f"{name}_token_id": getattr(tokenizer, f"{name}_token_id", None) if tokenizer is not None else None
        for name in ("bos", "eos", "pad")
    }


def build_model(
    margs: ModelArguments, vocab_size: int, block_size: int, tokenizer: Any = None
) -> torch.nn.Module:
    """The model the config asks for (its special tokens the tokenizer's); a key, type or size it
    cannot have is a ValueError naming it."""
    if margs.model_config is not None and not isinstance(margs.model_config, dict):
        raise ValueError(
            f"model_config={margs.model_config!r}: expected a mapping of config fields to values"
        )
    if margs.model_type == "tinygpt" and margs.model_name_or_path is None:
        from trainwright.app.tinygpt import TinyGPT, TinyGPTConfig

        fields = [
            f.name for f in dataclasses.fields(TinyGPTConfig) if f.name not in ("vocab_size", "block_size")
        ]
        _refuse_unknown_keys(margs.model_config or {}, fields, "tinygpt")
        with _naming_the_config(margs):
            tiny = TinyGPTConfig(vocab_size=vocab_size, block_size=block_size, **(margs.model_config or {}))
        return TinyGPT(tiny)
    try:
        import transformers
    except ImportError as e:
        raise ImportError(
            "model_type other than tinygpt needs transformers: pip install 'trainwright[hf]'"
        ) from e
    if margs.model_name_or_path is not None:
        if not os.path.isdir(margs.model_name_or_path):
            raise FileNotFoundError(f"model_name_or_path must be a local folder: {margs.model_name_or_path}")
        return transformers.AutoModelForCausalLM.from_pretrained(margs.model_name_or_path)
    _refuse_other_than_causal_lm(margs.model_type, transformers)
    config_class = transformers.CONFIG_MAPPING[margs.model_type]
    names = set(config_class().to_dict()) | set(inspect.signature(config_class.__init__).parameters)
    _refuse_unknown_keys(margs.model_config or {}, sorted(names - {"self", "kwargs"}), margs.model_type)
    values = {"vocab_size": vocab_size, **special_token_ids(tokenizer), **(margs.model_config or {})}
    with _naming_the_config(margs):
        config = transformers.AutoConfig.for_model(margs.model_type, **values)
        return transformers.AutoModelForCausalLM.from_config(config)


def _refuse_other_than_causal_lm(model_type: str, transformers: Any) -> None:
    """A model_type that AutoModelForCausalLM cannot build, refused with the nearest that it can."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    causal = ["tinygpt", *MODEL_FOR_CAUSAL_LM_MAPPING_NAMES]
    if model_type in causal:
        return
    close = difflib.get_close_matches(model_type, causal, n=3)
    hint = (
        f"; did you mean {', '.join(map(repr, close))}?" if close else " (tinygpt, gpt2, llama, qwen2, ...)"
    )
    if model_type in transformers.CONFIG_MAPPING:
        raise ValueError(
            f"model_type={model_type!r} has no causal language model in transformers "
            f"(AutoModelForCausalLM), which trainwright train trains{hint}"
        )
    raise ValueError(
        f"model_type={model_type!r} is neither tinygpt nor a causal-LM model type of transformers{hint}"
    )


@contextlib.contextmanager
def _naming_the_config(margs: ModelArguments) -> Iterator[None]:
    """A model that refuses its config (heads that do not divide the width, ...) in one line naming
    model_type and the model_config it was given; the model's own message says which check failed."""
    try:
        yield
    except Exception as e:
        validation = _is_config_validation_error(e)
        if not (validation or isinstance(e, (ValueError, AssertionError, ZeroDivisionError))):
            raise
        # transformers 5's configs are huggingface_hub strict dataclasses: their error wraps the
        # validator's own, on several lines; the validator's says what is wrong
        reason = e.__cause__ if validation and e.__cause__ is not None else e
        raise ValueError(
            f"model_type={margs.model_type!r} cannot be built with model_config={margs.model_config!r}: "
            + " ".join(str(reason).split())
        ) from e


def _is_config_validation_error(exc: BaseException) -> bool:
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # an older huggingface_hub: configs that are not strict dataclasses
        return False
    return isinstance(exc, StrictDataclassError)


def _refuse_unknown_keys(values: dict[str, Any], fields: list[str], model_type: str) -> None:
    unknown = sorted(set(values) - set(fields))
    if unknown:
        hints = [f"{k!r} -> {c[0]!r}?" for k in unknown if (c := difflib.get_close_matches(k, fields, n=1))]
        raise ValueError(
            f"model_config: {unknown} are not fields of a {model_type} config"
            + (f"; did you mean {', '.join(hints)}" if hints else "")
        )


def check_block_size(model: torch.nn.Module, block_size: int) -> None:
    """block_size must fit the model's positions (found at step 1 otherwise, as an index error)."""
    config = getattr(model, "config", None)
    limit = next(
        (
            getattr(config, name)
            for name in ("n_positions", "max_position_embeddings", "block_size", "n_ctx")
            if isinstance(getattr(config, name, None), int)
        ),
        None,
    )
    if limit is not None and block_size > limit:
        raise ValueError(
            f"block_size={block_size} is longer than the model's {limit} positions: lower block_size, or "
            "raise the positions in model_config (n_positions / max_position_embeddings)"
        )


DESCRIPTION = """\
Train a causal language model from a config file (YAML or JSON) and local text files; nothing is
downloaded. Every config key can also be given as --KEY VALUE, which overrides the file.

config keys (docs/train_config.md has a complete config):
  model:     model_type, model_config, model_name_or_path, tokenizer_name_or_path
  data:      train_file (required), validation_file, text_column, block_size, speed_monitor
  training:  any TrainingArguments field: output_dir, max_steps or num_train_epochs,
             per_device_train_batch_size, learning_rate, eval_strategy, save_steps, report_to, ...
             --resume_from_checkpoint (alone or `last`): the newest checkpoint in output_dir

example:
  model_type: gpt2
  model_config: {n_layer: 2, n_embd: 128, n_head: 4, n_positions: 128}
  train_file: data/train.txt
  block_size: 128
  output_dir: runs/gpt2
  max_steps: 200
  learning_rate: 3.0e-4
"""


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written, the options with their defaults."""


def train_parser() -> Any:
    """The parser of `trainwright train`: model and data keys first, then TrainingArguments'."""
    from trainwright.args.parser import HfArgumentParser
    from trainwright.args.training_args import TrainingArguments

    titles = {
        ModelArguments: "model (config keys)",
        DataArguments: "data (config keys)",
        TrainingArguments: "training (config keys: the fields of TrainingArguments)",
    }

    class TrainParser(HfArgumentParser):
        def _argument_container(self, dtype: type) -> Any:
            return self.add_argument_group(titles[dtype])

    return TrainParser(
        (ModelArguments, DataArguments, TrainingArguments),
        prog="trainwright train",
        usage="trainwright train CONFIG.yaml|json [--KEY VALUE ...]",
        description=DESCRIPTION,
        formatter_class=_Formatter,
    )


# `--resume_from_checkpoint` alone, or with one of these: the newest complete checkpoint in output_dir
_NEWEST = ("last", "latest", "true", "True")


def _resume_flag(argv: Sequence[str]) -> list[str]:
    """The command line with a bare `--resume_from_checkpoint` read as `--resume_from_checkpoint last`."""
    out = list(argv)
    for i, token in enumerate(out):
        if token == "--resume_from_checkpoint" and (i + 1 == len(out) or out[i + 1].startswith("--")):
            out.insert(i + 1, "last")
            break
    return out


class RunRecord(TrainerCallback):
    """What this `trainwright train` run trains: its model and data keys (paths made absolute), saved
    with every checkpoint (`trainer_state.json`'s `stateful_callbacks`), so that a resume from the
    newest checkpoint can tell a checkpoint of another run in the same output_dir. A run resumed from
    a checkpoint named by its path records its own keys; with `restore_callback_states_from_checkpoint`
    the checkpoint's come back, as every callback's constructor arguments do."""

    def __init__(self, record: dict[str, Any] | None = None):
        self.record = record or {}

    def state(self) -> dict[str, Any]:
        return {"args": {"record": self.record}, "attributes": {}}


_PATH_KEYS = ("model_name_or_path", "tokenizer_name_or_path", "train_file")


def run_record(margs: ModelArguments, dargs: DataArguments) -> dict[str, Any]:
    """The keys that make a run this run: the model it builds and the data it reads, in that order."""
    values = {
        "model_type": margs.model_type,
        "model_config": margs.model_config,
        "model_name_or_path": margs.model_name_or_path,
        "tokenizer_name_or_path": margs.tokenizer_name_or_path,
        "train_file": dargs.train_file,
        "text_column": dargs.text_column,
        "block_size": dargs.block_size,
    }
    for key in _PATH_KEYS:
        if values[key] is not None:
            values[key] = os.path.abspath(str(values[key]))
    return json.loads(json.dumps(values, default=str))  # as it reads back from trainer_state.json


def newest_checkpoint_of_this_run(targs: Any, record: dict[str, Any], examples: int) -> str | None:
    """The newest complete checkpoint in output_dir (None: there is none), refused when another run
    wrote it. Another run: its recorded model or data keys differ from this run's, it was written with
    another `optim`, or its data had another number of examples. Other arguments may change on a
    resume (max_steps, logging, evaluation, ...), as they may for Trainer.train."""
    from trainwright import checkpoint as ckpt
    from trainwright.loop.checkpoints.resume import _optim_name

    path = ckpt.get_last_checkpoint(targs.output_dir)
    if path is None:
        return None
    state = _json_or_empty(os.path.join(path, ckpt.TRAINER_STATE_NAME))
    saved = (state.get("stateful_callbacks") or {}).get(RunRecord.__name__) or {}
    saved_record = saved.get("args", {}).get("record") if isinstance(saved, dict) else None
    differences = []
    if isinstance(saved_record, dict):
        differences += [
            f"{key} {saved_record.get(key)!r} there, {value!r} here"
            for key, value in record.items()
            if saved_record.get(key) != value
        ]
    saved_optim = _json_or_empty(os.path.join(path, ckpt.TRAINING_ARGS_NAME)).get("optim")
    if saved_optim is not None and _optim_name(saved_optim) != _optim_name(targs.optim):
        differences.append(f"optim {saved_optim!r} there, {_optim_name(targs.optim)!r} here")
    length = _json_or_empty(os.path.join(path, ckpt.DATA_STATE_NAME)).get("dataset_length")
    if length is not None and length != examples:
        differences.append(f"{length} training examples there, {examples} here")
    if differences:
        raise ValueError(
            f"--resume_from_checkpoint last: {path}, the newest checkpoint in {targs.output_dir}, is another "
            f"run's, written with other settings: {'; '.join(differences)}. Resume it with that run's config, give this run another "
            "output_dir, or name the checkpoint to resume (--resume_from_checkpoint PATH)."
        )
    return path


def _json_or_empty(path: str) -> dict[str, Any]:
    """A checkpoint's JSON file ({} when absent: the Trainer's own checks report damage)."""
    from trainwright.core.files import read_json_object

    try:
        return read_json_object(path)
    except (OSError, ValueError):
        return {}


def run_train(argv: Sequence[str]) -> dict[str, float]:
    from trainwright.loop.trainer import Trainer

    parser = train_parser()
    margs, dargs, targs = parser.parse_args_into_dataclasses(
        args=_resume_flag(argv), look_for_args_file=False
    )
    if dargs.train_file is None:
        raise ValueError("train_file is required (a local .txt or .jsonl file).")
    if not isinstance(dargs.block_size, int) or dargs.block_size < 1:
        raise ValueError(f"block_size={dargs.block_size!r}: tokens per training example, an integer >= 1")
    tokenizer = load_tokenizer(margs.tokenizer_name_or_path) if margs.tokenizer_name_or_path else None
    vocab = len(tokenizer) if tokenizer is not None else 256

    def blocks(path: str) -> TokenBlocks:
        return TokenBlocks(
            encode_documents(read_documents(path, dargs.text_column), tokenizer), dargs.block_size, path
        )

    train_ds = blocks(dargs.train_file)
    eval_ds = blocks(dargs.validation_file) if dargs.validation_file else None
    record = run_record(margs, dargs)
    resume = targs.resume_from_checkpoint
    if resume in _NEWEST:  # True: the Trainer says there is none, in its words
        resume = newest_checkpoint_of_this_run(targs, record, len(train_ds)) or True
    model = build_model(margs, vocab, dargs.block_size, tokenizer)
    check_block_size(model, dargs.block_size)
    callbacks: list[Any] = [RunRecord(record)]
    if dargs.speed_monitor:
        from trainwright.app.demo import speed_window
        from trainwright.callbacks import SpeedMonitor

        callbacks.append(SpeedMonitor(window_size=speed_window(targs), time_unit="seconds"))
    trainer = Trainer(
        model=model,
        args=targs,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    result = trainer.train(resume_from_checkpoint=resume)
    trainer.save_model()
    trainer.save_state()
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    metrics = dict(result.metrics)
    if eval_ds is not None:
        eval_metrics = trainer.evaluate()
        trainer.log_metrics("eval", eval_metrics)
        trainer.save_metrics("eval", eval_metrics)
        metrics.update(eval_metrics)
    return metrics
