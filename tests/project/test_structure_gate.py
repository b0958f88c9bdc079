"""The structure's figures held by a gate (`scripts/structure.py` measures them; docs/design.md
gives them): a bar that moves fails here, so the loop's shape cannot drift unseen. A bar is
lowered when a change earns it, never raised to let a change through."""

from __future__ import annotations

import ast
import importlib.util
import sys

from kit import ROOT

SRC = ROOT / "src" / "trainwright"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_measures", ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


S = _script("structure")
H = _script("holders")
TREES = H._trees(SRC)


def _size(qualified: str) -> tuple[int, int]:
    fn = S._find(SRC, qualified)
    assert isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)), f"{qualified} is gone: update the gate"
    return (fn.end_lineno or fn.lineno) - fn.lineno + 1, S.branch_points(fn)


def test_the_epoch_loop_stays_small():
    lines, points = _size("loop/trainer.py:Trainer._run_epoch")
    assert lines <= 55 and points <= 18, (lines, points)


def test_the_step_path_keeps_its_branch_points():
    # what one optimizer step of a plain run goes through, without the event dispatch (95: the
    # look-ahead's 7 included, one of them per micro-batch)
    # (STEP_PATH also names where each piece lived before, so a tree of any age is measured)
    found = [S._find(SRC, name) for name in S.STEP_PATH if name not in S.EVENT_SIDE]
    counted = sum(S.branch_points(fn) for fn in found if fn is not None)
    assert counted <= 95, counted


def test_the_evaluation_loop_stays_small():
    lines, points = _size("loop/eval/loop.py:Evaluation.run")
    assert lines <= 30 and points <= 10, (lines, points)


def test_the_run_is_written_from_one_other_module_at_most():
    writes = S.run_field_writes(SRC)
    assert len({field for field, _ in writes}) <= 1, writes


def test_components_are_built_from_values_not_from_the_trainer():
    # issue 39: 79 before (a parameter typed by a Trainer-view Protocol counts as `trainer`); those
    # left take it at the call of an upstream hook (or are upstream's API, or TFTrainer's)
    taking = H.functions_taking_trainer(TREES)
    assert len(taking) <= 22, taking


def test_trainer_views_describe_few_members():
    views = H.trainer_views(TREES)  # 119 members in 11 Protocols before issue 39
    assert sum(map(len, views.values())) <= 35, views


def test_no_private_trainer_name_is_read_elsewhere():
    assert H.private_reads(TREES) == []


def test_nothing_holds_a_weak_reference_up_the_tree():
    # a component holds values, so no cycle runs through the Trainer (tests/loop/test_trainer_lifetime.py)
    assert H.weak_references(TREES) == []


def test_the_run_is_a_few_owned_parts():
    fields = H.run_fields(TREES)  # 41 slots before issue 39
    assert len(fields) <= 15, fields
    reads = H.checkpoint_run_reads(TREES)  # 14 before: the checkpoint code read the run's insides
    assert len(reads) <= 4, sorted(reads)


def test_no_test_file_over_600_lines():
    tests = ROOT / "tests"
    large = {
        f.relative_to(tests).as_posix(): n
        for f in tests.rglob("test_*.py")
        if (n := len(f.read_text().splitlines())) > 600
    }
    assert not large, large


def _class_methods(path: str, name: str) -> tuple[ast.ClassDef, set[str]]:
    tree = ast.parse((SRC / path).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    return cls, {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_the_class_chain_never_reaches_down():
    # the Trainer's bases neither declare their subclasses' methods nor call them: each class of
    # the chain reads on its own (a base is cut by "does the loop call it", not by the file cap)
    chain = [_class_methods(path, name) for path, name in S.TRAINER_CLASSES]
    found = []
    for i, (cls, _) in enumerate(chain[:-1]):
        above = set().union(*(m for _, m in chain[: i + 1]))
        below = set().union(*(m for _, m in chain[i + 1 :])) - above
        declared = {
            n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        }
        found += [f"{cls.name} declares {m}" for m in sorted(declared & below)]
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                if node.attr in below:
                    found.append(f"{cls.name} calls self.{node.attr} (line {node.lineno})")
    assert not found, found


def test_the_step_path_lives_in_the_loop_file():
    outside = [n for n in S.STEP_PATH if n.startswith("loop/trainer_") and S._find(SRC, n) is not None]
    assert not outside, outside


def test_the_loop_folder_keeps_its_concerns_in_rooms():
    # issue 39: 23 files at the top of loop/ before (8 concerns), 8 now: the Trainer's three,
    # Seq2SeqTrainer, the plug-in table, the data loaders, the optimizer, the batch-size finder;
    # the run, its checkpoints, evaluation, search and the Hub are rooms of their own
    top = sorted(p.name for p in (SRC / "loop").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 8, top
