"""Is a checkpoint folder whole? Its manifest (`checkpoint_complete.json`: sizes and xxh3-64
checksums of every file), and the files a resume needs, present and readable, before any work.

* `verify_checkpoint(path) -> list[str]`: problems (missing files, sizes or checksums that differ from
  the manifest, a manifest that can't check its files, files it does not list that a resume would
  read, symbolic links); an empty list means complete. The manifest's rules are in `manifest.py`.
* `check_checkpoint_files(path, need=(...), *, rank=0, world_size=1) -> list[str]`: the parts a resume
  needs (names of `layout.PARTS`), present and readable (JSON parses with the fields a resume reads,
  archives and safetensors headers intact).
* `file_checksum(path)`: the checksum the manifest records (`CHECKSUM_ALGORITHM`; from `manifest.py`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from trainwright.checkpoint import adapters
from trainwright.checkpoint.files import (
    CHECKPOINT_COMPLETE_NAME,
    PT_WEIGHTS_INDEX_NAME,
    PT_WEIGHTS_NAME,
    TF_CHECKPOINT_PREFIX,
    TRAINER_STATE_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    CheckpointError,
    CheckpointFileNotFoundError,
    read_json,
    torch_file_problem,
)
from trainwright.checkpoint.layout import PARTS, PartSpec, process_file
from trainwright.checkpoint.manifest import (  # noqa: F401  (CHECKSUM_ALGORITHM, file_checksum: re-exported)
    CHECKSUM_ALGORITHM,
    ManifestError,
    file_checksum,
    manifest_problems,
    read_manifest,
)
from trainwright.checkpoint.state_checks import STATE_FILE_CHECKS, TF_STATE_FILE_CHECKS
from trainwright.checkpoint.weights import safetensors_problem

# -- the manifest and the files -----------------------------------------------------------------------------------


def _weights_problems(path: str) -> list[str]:
    index = os.path.join(path, WEIGHTS_INDEX_NAME)
    if os.path.isfile(index):
        try:
            weight_map = read_json(index).get("weight_map")
        except (CheckpointError, AttributeError) as exc:
            return [f"{WEIGHTS_INDEX_NAME} is unreadable: {exc}"]
        if not isinstance(weight_map, dict):
            return [f"{WEIGHTS_INDEX_NAME} has no 'weight_map' object"]
        if not all(isinstance(f, str) for f in weight_map.values()):
            return [f"{WEIGHTS_INDEX_NAME} maps a tensor to something other than a file name"]
        return [
            f"{f} is missing"
            for f in sorted(set(weight_map.values()))
            if not os.path.isfile(os.path.join(path, f))
        ]
    if any(
        os.path.isfile(os.path.join(path, n)) for n in (WEIGHTS_NAME, PT_WEIGHTS_NAME, PT_WEIGHTS_INDEX_NAME)
    ):
        return []
    if adapters.adapter_folders(path):  # a PEFT model's adapters, at the top or in folders of their names
        return adapters.adapter_problems(path)
    if any(e.startswith("pytorch_model_fsdp") for e in os.listdir(path)):
        return []
    return [
        f"no model weights ({WEIGHTS_NAME}, {WEIGHTS_INDEX_NAME}, {PT_WEIGHTS_NAME} or a PEFT adapter's "
        f"{adapters.ADAPTER_SAFE_WEIGHTS_NAME})"
    ]


def _adapter_file_problems(path: str) -> list[str]:
    """Adapters whose weights are missing, and adapter files that are damaged (header against size,
    the zip directory of a `.bin`): cheap checks, so discovery skips such a checkpoint as it skips one
    whose checksums differ (a manifest agrees with a file truncated before it was written)."""
    problems = adapters.adapter_problems(path)
    for rel in adapters.adapter_weight_files(path):
        file = os.path.join(path, rel)
        problem = safetensors_problem(file) if rel.endswith(".safetensors") else torch_file_problem(file)
        if problem:  # named by its path in the checkpoint (an adapter's folder is its name)
            problems.append(rel + problem[len(os.path.basename(rel)) :])
    return problems


def _links_in(path: str) -> list[str]:
    found = []
    for root, dirs, names in os.walk(path):
        for n in dirs + names:
            if os.path.islink(os.path.join(root, n)):
                found.append(os.path.relpath(os.path.join(root, n), path))
    return found


def verify_checkpoint(path: str | os.PathLike, checksums: bool = True) -> list[str]:
    """Problems with a checkpoint folder; an empty list means it is complete.

    With `checkpoint_complete.json` every listed file must exist with its recorded size and (when
    `checksums`) its recorded checksum, so same-size damage is caught too; a manifest that does not
    say how to verify every file it lists is a problem, and so is a file a resume would read (weights,
    an index, a part's file) that it does not list. Without it (a folder written by transformers,
    which has no marker) it needs `trainer_state.json` and model weights.
    A checkpoint folder, or anything in it, that is a symbolic link is refused: its files must be
    its own.
    """
    path = os.fspath(path)
    if os.path.islink(path.rstrip(os.sep)):
        return [f"{path} is a symbolic link (a checkpoint folder must be a real folder)"]
    if not os.path.isdir(path):
        return [f"{path} is not a folder"]
    links = _links_in(path)
    if links:
        return [f"{rel} is a symbolic link (a checkpoint's files must be its own)" for rel in links]
    try:
        manifest = read_manifest(path)
    except ManifestError as exc:
        return exc.problems
    if manifest is None:  # a folder transformers wrote: no manifest
        problems = (
            []
            if os.path.isfile(os.path.join(path, TRAINER_STATE_NAME))
            else [f"{TRAINER_STATE_NAME} is missing"]
        )
        problems += _weights_problems(path) + _adapter_file_problems(path) + _state_file_problems(path)
        return list(dict.fromkeys(problems))
    return manifest_problems(path, manifest, checksums) or (
        _state_file_problems(path) + _adapter_file_problems(path)
    )


def _state_file_problems(path: str) -> list[str]:
    """What a resume would refuse in the JSON state files the folder has (parse and fields): such a
    checkpoint is damaged for discovery too, which then falls back to the one before."""
    problems = []
    is_tf = os.path.isfile(os.path.join(path, TF_CHECKPOINT_PREFIX + ".index"))
    for name, check in (TF_STATE_FILE_CHECKS if is_tf else STATE_FILE_CHECKS).items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            continue
        try:
            problems += check(read_json(file))
        except CheckpointError as exc:
            problems.append(str(exc))
    return problems


def check_checkpoint_files(
    path: str | os.PathLike,
    need: Iterable[str] = ("model", "optimizer", "scheduler", "trainer_state"),
    *,
    rank: int = 0,
    world_size: int = 1,
) -> list[str]:
    """Which of the parts a resume needs are missing or damaged, each message naming file and folder.

    `need`: part names of `layout.PARTS` ("model", "optimizer", "scheduler", "scaler", "trainer_state",
    "data_state", "rng" (this rank's file), ...); the JSON state every resume reads when present
    (data_state.json) is checked too. Checks are cheap (no tensor is loaded): JSON parses and its
    fields have the types a resume reads (`state_checks.py`), `torch.save` archives have an intact zip
    directory, safetensors sizes match their headers.
    """
    need = list(need)
    unknown = [n for n in need if n not in PARTS]
    if unknown:
        raise ValueError(f"check_checkpoint_files: unknown need {unknown}; choose from {list(PARTS)}")
    path = os.fspath(path)
    if not os.path.isdir(path):
        return [f"checkpoint folder {path} does not exist"]
    problems = verify_checkpoint(path) if os.path.exists(os.path.join(path, CHECKPOINT_COMPLETE_NAME)) else []
    for item in need:
        problems += _part_problems(path, PARTS[item], rank, world_size)
    for item, row in PARTS.items():  # JSON state every resume reads when it is there (data_state.json)
        optional = item not in need and not row.required
        if optional and row.kind == "json" and os.path.exists(os.path.join(path, row.file)):
            problems += _part_problems(path, row, rank, world_size)
    return [p if path in p else f"{p} (in {path})" for p in dict.fromkeys(problems)]


def _part_problems(path: str, row: PartSpec, rank: int, world_size: int) -> list[str]:
    if row.kind == "weights":
        return _weights_problems(path) or _shard_problems(path) + _adapter_file_problems(path)
    file = process_file(path, row, rank, world_size)
    if row.kind == "torch":
        return [p for p in [torch_file_problem(file)] if p]
    if row.kind == "tensors":
        return [p for p in [safetensors_problem(file)] if p]
    if row.kind == "json":
        try:
            state = read_json(file)
        except CheckpointFileNotFoundError:
            return [f"{row.file} is missing"]
        except CheckpointError as exc:
            return [str(exc)]
        check = STATE_FILE_CHECKS.get(row.file)
        return check(state) if check is not None else []
    return [] if os.path.exists(file) else [f"{row.file} is missing"]


def _shard_problems(path: str) -> list[str]:
    """Safetensors files whose sizes do not match their headers."""
    shards = [WEIGHTS_NAME] if os.path.isfile(os.path.join(path, WEIGHTS_NAME)) else []
    index = os.path.join(path, WEIGHTS_INDEX_NAME)
    if os.path.isfile(index):
        shards = sorted(set(read_json(index)["weight_map"].values()))
    return [p for s in shards if (p := safetensors_problem(os.path.join(path, s)))]
