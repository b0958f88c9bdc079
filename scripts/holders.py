"""Measure who holds the Trainer and the run: the figures of issue 39's items 1 and 3, from the source.

    python scripts/holders.py [SRC_DIR]      # default: src/trainwright of this checkout

Prints:

* the Trainer-view Protocols (a `Protocol` most of whose members are names the Trainer's class chain
  defines) and their members;
* functions outside the Trainer's files that take the Trainer: a parameter named `trainer`, or one
  annotated with a Trainer-view Protocol (a renamed parameter counts the same);
* reads of the Trainer's trainwright-private names (`_x` that upstream's `transformers.Trainer`
  neither defines nor assigns) outside the Trainer's files, through `trainer`, a Protocol-typed
  parameter, `self.trainer` / `self._trainer`;
* weak references held to an object (`weakref.ref`, `WeakMethod`, `proxy`; caches keyed weakly are
  not references up the tree) and `__weakref__` slots;
* `TrainingRun`'s fields, and the run members the checkpoint code reads.

Upstream's names come from the installed transformers' `trainer.py`, parsed (nothing is imported).
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

TRAINER_FILES = ("loop/trainer_setup.py", "loop/trainer_api.py", "loop/trainer.py")
# the checkpoint code (before issue 39 in loop/ itself; an old tree is measured the same way)
CHECKPOINT_FILES = (
    "loop/checkpoints/checkpointer.py",
    "loop/checkpoints/resume.py",
    "loop/checkpoints/parts.py",
    "loop/checkpoints/data_state.py",
    "loop/checkpointer.py",
    "loop/resume.py",
    "loop/checkpoint_parts.py",
)
RUN_FILES = ("loop/run/training_run.py", "loop/run.py")
WEAK_HOLDS = {"ref", "WeakMethod", "proxy"}
VIEW_NAMES = {"trainer", "_trainer"}  # `self.trainer` / `self._trainer` / a `trainer` parameter


def _trees(src: Path) -> dict[str, ast.Module]:
    return {p.relative_to(src).as_posix(): ast.parse(p.read_text()) for p in sorted(src.rglob("*.py"))}


def _class_names(cls: ast.ClassDef) -> set[str]:
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def chain_names(trees: dict[str, ast.Module]) -> set[str]:
    """Every method and attribute of the Trainer's class chain."""
    names: set[str] = set()
    for file in TRAINER_FILES:
        for node in trees.get(file, ast.Module(body=[], type_ignores=[])).body:
            if isinstance(node, ast.ClassDef):
                names |= _class_names(node)
    return names


def upstream_names() -> set[str]:
    """The names upstream's Trainer defines or assigns (its `trainer.py`, parsed)."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        raise SystemExit("transformers is not installed: upstream's names are read from its trainer.py")
    tree = ast.parse((Path(spec.origin).parent / "trainer.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    return _class_names(cls)


def _is_protocol(cls: ast.ClassDef) -> bool:
    return any((isinstance(b, ast.Name) and b.id == "Protocol") for b in cls.bases)


def _members(cls: ast.ClassDef) -> list[str]:
    out = []
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.append(node.target.id)
    return out


def trainer_views(trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    """{file:Protocol: members} of the Protocols that describe the Trainer."""
    chain = chain_names(trees)
    views = {}
    for file, tree in trees.items():
        if file in TRAINER_FILES:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and _is_protocol(node):
                members = _members(node)
                if members and 2 * sum(m in chain for m in members) > len(members):
                    views[f"{file}:{node.name}"] = members
    return views


def _annotation_names(arg: ast.arg) -> set[str]:
    if arg.annotation is None:
        return set()
    return {n.id for n in ast.walk(arg.annotation) if isinstance(n, ast.Name)} | {
        n.value.split("[")[0].strip()
        for n in ast.walk(arg.annotation)
        if isinstance(n, ast.Constant)
        if isinstance(n.value, str)
    }


def functions_taking_trainer(trees: dict[str, ast.Module]) -> list[str]:
    views = {name.partition(":")[2] for name in trainer_views(trees)}
    found = []
    for file, tree in trees.items():
        if file in TRAINER_FILES:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = a.posonlyargs + a.args + a.kwonlyargs
                if any(p.arg == "trainer" or _annotation_names(p) & views for p in params):
                    found.append(f"{file}:{node.name}")
    return found


def _viewed(node: ast.expr, typed: set[str]) -> bool:
    """Whether `node` is the Trainer seen from outside: a `trainer` / Protocol-typed name,
    `self.trainer`, `self._trainer` or `self._trainer()`."""
    if isinstance(node, ast.Call) and not node.args:
        node = node.func
    if isinstance(node, ast.Name):
        return node.id in typed
    return isinstance(node, ast.Attribute) and node.attr in VIEW_NAMES and isinstance(node.value, ast.Name)


def private_reads(trees: dict[str, ast.Module]) -> list[str]:
    """file:line name of each read of a trainwright-private Trainer name outside the Trainer's files
    (tf/ holds TFTrainer, another class)."""
    views = {name.partition(":")[2] for name in trainer_views(trees)}
    own = chain_names(trees) - upstream_names()
    found = []
    for file, tree in trees.items():
        if file in TRAINER_FILES or file.startswith("tf/"):
            continue
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = fn.args
            typed = {"trainer"} | {
                p.arg for p in a.posonlyargs + a.args + a.kwonlyargs if _annotation_names(p) & views
            }
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                    and node.attr in own
                    and _viewed(node.value, typed)
                ):
                    found.append(f"{file}:{node.lineno} {node.attr}")
    return sorted(set(found))


def weak_references(trees: dict[str, ast.Module]) -> list[str]:
    """file:line of each weak reference held to an object, and of each `__weakref__` slot."""
    found = []
    for file, tree in trees.items():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "weakref"
                and node.func.attr in WEAK_HOLDS
            ):
                found.append(f"{file}:{node.lineno} weakref.{node.func.attr}")
            elif (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets)
                and any(
                    isinstance(e, ast.Constant) and e.value == "__weakref__" for e in ast.walk(node.value)
                )
            ):
                found.append(f"{file}:{node.lineno} __weakref__ slot")
    return found


def run_fields(trees: dict[str, ast.Module]) -> list[str]:
    """TrainingRun's fields: its `__slots__` (else the attributes its methods assign)."""
    tree = next((trees[f] for f in RUN_FILES if f in trees), None)
    cls = next(
        (n for n in (tree.body if tree else []) if isinstance(n, ast.ClassDef) and n.name == "TrainingRun"),
        None,
    )
    if cls is None:
        return []
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in stmt.targets
        ):
            return [
                e.value
                for e in ast.walk(stmt.value)
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            ]
    return sorted(_class_names(cls) - {n.name for n in cls.body if isinstance(n, ast.FunctionDef)})


def checkpoint_run_reads(trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    """{run member: file:line sites} the checkpoint code reads (`run.x`, `self.run.x`, `self._run.x`)."""
    reads: dict[str, list[str]] = {}
    for file in CHECKPOINT_FILES:
        for node in ast.walk(trees.get(file, ast.Module(body=[], type_ignores=[]))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                base = node.value
                if isinstance(base, ast.Call) and not base.args:
                    base = base.func
                is_run = (isinstance(base, ast.Name) and base.id == "run") or (
                    isinstance(base, ast.Attribute) and base.attr in ("run", "_run")
                )
                if is_run:
                    reads.setdefault(node.attr, []).append(f"{file}:{node.lineno}")
    return reads


def main() -> None:
    src = (
        Path(sys.argv[1])
        if len(sys.argv) > 1
        else Path(__file__).resolve().parents[1] / "src" / "trainwright"
    )
    trees = _trees(src)
    views = trainer_views(trees)
    print(f"Trainer-view Protocols: {len(views)}, {sum(map(len, views.values()))} members")
    for name, members in views.items():
        print(f"  {name} ({len(members)}): {', '.join(members)}")
    taking = functions_taking_trainer(trees)
    print(f"functions outside the Trainer's files taking the Trainer: {len(taking)}")
    print("  " + ", ".join(taking))
    private = private_reads(trees)
    print(
        f"trainwright-private Trainer names read elsewhere: {len(private)} sites in "
        f"{len({p.partition(':')[0] for p in private})} modules"
    )
    print("  " + ", ".join(private))
    weak = weak_references(trees)
    print(f"weak references held: {len(weak)}")
    print("  " + ", ".join(weak))
    fields = run_fields(trees)
    print(f"TrainingRun fields: {len(fields)}")
    reads = checkpoint_run_reads(trees)
    print(f"run members the checkpoint code reads: {len(reads)} ({', '.join(sorted(reads))})")


if __name__ == "__main__":
    main()
