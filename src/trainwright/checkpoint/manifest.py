"""A checkpoint's manifest, `checkpoint_complete.json`: every file of the folder with its size and
xxh3-64 checksum, written last by the commit. It is the list of what the checkpoint holds, and it must
say how to check every file it lists: a manifest that names a checksum this version does not compute,
lacks its `checksums` object or a file's checksum, or lists a path outside the folder is damaged (it
would otherwise switch its own checks off). A file a resume would read that it does not list was added
after the commit and is never loaded.

* `CHECKSUM_ALGORITHM`, `file_checksum(path)`: the checksum recorded for each file.
* `manifest_for(name, files, checksums)`: the JSON object the commit writes.
* `read_manifest(folder) -> Manifest | None`: the folder's manifest, None where there is none (a
  transformers checkpoint); a damaged one raises `ManifestError` (a `CheckpointError`) whose
  `problems` say what is wrong.
* `manifest_problems(folder, manifest, checksums=True)`: listed files missing, resized or damaged,
  and files a resume reads that the manifest does not list.
* `check_listed(folder, paths)`: for a loader: refuse files of `folder` its manifest (if any) does
  not list.
"""

from __future__ import annotations

import mmap
import os
import re
from collections.abc import Iterable
from typing import Any, NamedTuple

from trainwright.checkpoint.files import (
    CHECKPOINT_COMPLETE_NAME,
    PT_WEIGHTS_INDEX_NAME,
    TRAINING_ARGS_NAME,
    WEIGHTS_INDEX_NAME,
    CheckpointError,
    read_json,
)
from trainwright.checkpoint.layout import PARTS

CHECKSUM_ALGORITHM = "xxh3_64"
_DIGEST_RE = re.compile(r"^[0-9a-f]{16}$")  # xxh3-64's hexdigest


def file_checksum(path: str) -> str:
    """xxh3-64 of a file's bytes (about 30 GB/s from the page cache: a few % of a save)."""
    import xxhash

    digest = xxhash.xxh3_64()
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
                digest.update(view)
    return digest.hexdigest()


def manifest_for(name: str, files: dict[str, int], checksums: dict[str, str]) -> dict[str, Any]:
    """The content of `checkpoint_complete.json` for checkpoint `name` (paths relative, with `/`)."""
    return {"format": 1, "name": name, "files": files, "checksum": CHECKSUM_ALGORITHM, "checksums": checksums}


class Manifest(NamedTuple):
    files: dict[str, int]  # relative path -> size in bytes
    checksums: dict[str, str]  # relative path -> xxh3-64 hexdigest, one for every listed file


class ManifestError(CheckpointError):
    """A manifest that cannot be trusted to check its checkpoint; `problems` say why."""

    def __init__(self, folder: str, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"{os.path.join(folder, CHECKPOINT_COMPLETE_NAME)}: " + "; ".join(problems))


def _inside(rel: Any) -> bool:
    return (
        isinstance(rel, str)
        and bool(rel)
        and not os.path.isabs(rel)
        and ".." not in rel.replace("\\", "/").split("/")
    )


def _preview(names: list[str], limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _structure_problems(manifest: Any) -> list[str]:
    """What makes a manifest unable to check its files (each message names the manifest)."""
    this = CHECKPOINT_COMPLETE_NAME
    cannot = "so its files cannot be verified"
    if not isinstance(manifest, dict):
        return [f"{this} is not a JSON object"]
    files = manifest.get("files")
    if not isinstance(files, dict):
        return [f"{this} has no 'files' object"]
    problems = []
    outside = sorted(str(rel) for rel in files if not _inside(rel))
    if outside:
        problems.append(f"{this} lists paths outside the checkpoint folder: {_preview(outside)}")
    sizes = sorted(rel for rel, size in files.items() if type(size) is not int or size < 0)
    if sizes:
        problems.append(f"{this} records no valid size for {_preview(sizes)}")
    algorithm = manifest.get("checksum")
    if algorithm != CHECKSUM_ALGORITHM:
        said = "names no checksum algorithm" if algorithm is None else f"names checksum {algorithm!r}"
        problems.append(
            f"{this} {said}, which this version does not compute (it records {CHECKSUM_ALGORITHM!r}), {cannot}"
        )
    sums = manifest.get("checksums")
    if not isinstance(sums, dict):
        problems.append(f"{this} has no 'checksums' object, {cannot}")
        return problems
    absent = sorted(rel for rel in files if not isinstance(sums.get(rel), str))
    if absent:
        problems.append(f"{this} records no checksum for {_preview(absent)}, {cannot}")
    malformed = sorted(
        rel for rel in files if isinstance(sums.get(rel), str) and not _DIGEST_RE.match(sums[rel])
    )
    if malformed:
        problems.append(f"{this} records a checksum for {_preview(malformed)} that is not an xxh3-64 digest")
    return problems


def read_manifest(folder: str | os.PathLike) -> Manifest | None:
    """The manifest of checkpoint `folder`; None without one. A manifest that is unreadable or does
    not say how to verify every file it lists raises `ManifestError`."""
    folder = os.fspath(folder)
    path = os.path.join(folder, CHECKPOINT_COMPLETE_NAME)
    if not os.path.lexists(path):
        return None
    try:
        manifest = read_json(path)
    except (CheckpointError, OSError) as exc:
        raise ManifestError(folder, [f"{CHECKPOINT_COMPLETE_NAME} is unreadable: {exc}"]) from None
    problems = _structure_problems(manifest)
    if problems:
        raise ManifestError(folder, problems)
    return Manifest(dict(manifest["files"]), {rel: manifest["checksums"][rel] for rel in manifest["files"]})


# Files a resume or `load_model_weights` may read, by name at the top of the folder; everything in a
# sub-folder counts (DCP and DeepSpeed read whole folders). Other files (a README, NFS's `.nfs*`) are
# never read, so an unlisted one is left alone.
_READ_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".distcp", ".index.json")
_READ_NAMES = frozenset({row.file for row in PARTS.values()}) | {
    WEIGHTS_INDEX_NAME,
    PT_WEIGHTS_INDEX_NAME,
    TRAINING_ARGS_NAME,
    "config.json",
    "adapter_config.json",
}
_TF_PREFIX = "tf_checkpoint."  # TFTrainer's tf.train.Checkpoint files (tf/checkpointing.py)


def read_on_load(rel: str) -> bool:
    """Whether a load may read file `rel` (relative to the checkpoint folder, `/`-separated)."""
    if "/" in rel:
        return not os.path.basename(rel).startswith(".nfs")
    return rel.endswith(_READ_SUFFIXES) or rel in _READ_NAMES or rel.startswith(_TF_PREFIX)


def _files_in(folder: str) -> Iterable[str]:
    for root, _, names in os.walk(folder):
        for n in names:
            yield os.path.relpath(os.path.join(root, n), folder).replace(os.sep, "/")


def unlisted_message(rel: str) -> str:
    return (
        f"{rel} is not listed in {CHECKPOINT_COMPLETE_NAME} (it was added after the checkpoint was "
        "written) and is never loaded: remove it, or resume another checkpoint"
    )


def manifest_problems(folder: str, manifest: Manifest, checksums: bool = True) -> list[str]:
    """Listed files missing, of another size or (`checksums`) damaged, and files a load would read
    that the manifest does not list."""
    problems = []
    for rel, size in sorted(manifest.files.items()):
        full = os.path.join(folder, rel)
        if not os.path.isfile(full):
            problems.append(f"{rel} is missing")
        elif os.path.getsize(full) != size:
            problems.append(f"{rel} has {os.path.getsize(full)} bytes, expected {size}")
        elif checksums and file_checksum(full) != manifest.checksums[rel]:
            problems.append(
                f"{rel} is damaged (its checksum differs from the one recorded when it was written)"
            )
    extra = [
        rel
        for rel in sorted(_files_in(folder))
        if rel != CHECKPOINT_COMPLETE_NAME and rel not in manifest.files and read_on_load(rel)
    ]
    return problems + [unlisted_message(rel) for rel in extra]


def check_listed(folder: str, paths: Iterable[str]) -> None:
    """Refuse (`CheckpointError` naming the file) any of `paths`, files in `folder`, that the folder's
    manifest does not list; nothing to check without a manifest (a transformers checkpoint)."""
    manifest = read_manifest(folder)
    if manifest is None:
        return
    for path in paths:
        rel = os.path.relpath(path, folder).replace(os.sep, "/")
        if rel not in manifest.files:
            raise CheckpointError(f"{unlisted_message(rel)} (in {folder})")
