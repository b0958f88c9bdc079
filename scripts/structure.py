"""Measure the loop's shape: the numbers of the structure issues, from the source with `ast`.

    python scripts/structure.py [SRC_DIR]      # default: src/trainwright of this checkout

Prints, for the Trainer and the code around it:

* lines and branch points of `_run_epoch` (branch points: 1 per if/for/while/try/with/ternary/
  except, plus 1 per extra and/or operand; a nested function's points count to it, not its parent);
* branch points on the per-step path (`STEP_PATH`: what one optimizer step of a plain run calls);
* Trainer attributes first set outside `__init__` (written by a method or another module, not in
  `__init__`; class-level constants that nothing writes are not state);
* sites in other modules that write a Trainer attribute (`trainer.x = ...`, `setattr(trainer, ...)`,
  `trainer.__dict__`) (who takes or holds the Trainer and the run: `scripts/holders.py`);
* lines and branch points of the evaluation's functions (`EVAL_PATH`);
* writes to a `TrainingRun`'s fields from other modules (`run.x = ...`);
* the loop files, besides the plug-in table, that name an optional feature (`PLUGIN_NAMES`): what a
  new add-on of that kind touches beyond its own file;
* the tests' shape (`tests/` beside the package's `src/`): test files over 600 lines, test files in a
  folder that is not a package folder (`SHARED_TEST_FOLDERS` besides), and imports of a test module by
  another (of another folder's: a shared helper belongs in `tests/kit/` or conftest).

The same script measures an old tree (`git worktree add /tmp/old <commit>`; pass its `src/trainwright`),
so before/after numbers come from one method.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

# The Trainer's class chain: (file, class). Files are relative to the package folder; the first
# that exists is used (the chain's files moved over time).
TRAINER_CLASSES = [
    ("loop/trainer_setup.py", "TrainerSetup"),
    ("loop/trainer_api.py", "TrainerAPI"),
    ("loop/trainer.py", "Trainer"),
]

# What one optimizer step of a plain run goes through (qualified as file:Class.method or file:function):
# gradient accumulation, on an accelerator, without `padding_free` / `fused_linear_cross_entropy`,
# label smoothing or `compute_loss_func` (their code, off this path, runs only when they are on; what a
# run decides once, e.g. `Engine._choose_step`, is not counted). A name that does not exist in a tree
# is skipped (and reported).
STEP_PATH = [
    "loop/trainer.py:Trainer._run_epoch",
    "loop/trainer.py:Trainer.get_batch_samples",
    "data/look_ahead.py:LookAhead._walk",  # each micro-batch fetched one ahead (its epoch's start counted too)
    "loop/trainer.py:Trainer._weights",
    # before StepWeights (trees up to 151ff49): the same work on the Trainer
    "loop/trainer.py:Trainer._items_in_step",
    "loop/trainer.py:Trainer._scale_for_accumulation",
    "loop/trainer.py:Trainer._loss_is_normalised",
    "modeling/loss.py:loss_is_normalised",
    "modeling/step_weights.py:StepWeights.count",
    "modeling/step_weights.py:_has_labels",
    "modeling/step_weights.py:StepWeights.share",
    "modeling/step_weights.py:StepWeights.scale",
    "loop/trainer.py:Trainer._advance_cursor",
    "loop/trainer.py:Trainer._sync_state",
    "loop/trainer.py:Trainer.training_step",
    "loop/trainer.py:Trainer.compute_loss",
    "loop/trainer.py:Trainer._preempted",
    "loop/trainer.py:Trainer._log_save_evaluate_due",
    "loop/trainer_api.py:TrainerAPI._prepare_inputs",
    "loop/trainer.py:Trainer._prepare_inputs",
    "loop/trainer_api.py:TrainerAPI._prepare_input",  # on an accelerator
    "loop/trainer.py:Trainer._prepare_input",
    "data/distribute.py:to_device",  # on an accelerator (before core/nested.py)
    "core/nested.py:to_device",
    "data/distribute.py:map_tensors",  # to_device walks the batch through it
    "core/nested.py:map_tensors",
    "loop/trainer_api.py:TrainerAPI.compute_loss_context_manager",
    "loop/trainer.py:Trainer.compute_loss_context_manager",
    "loop/trainer_api.py:TrainerAPI.autocast_smart_context_manager",
    "loop/trainer.py:Trainer.autocast_smart_context_manager",
    "loop/trainer_api.py:TrainerAPI._log_save_evaluate_args",
    "loop/trainer.py:Trainer._log_save_evaluate_args",
    "loop/async_saves.py:poll",
    "loop/checkpointer.py:Checkpointer.poll",  # a method before the run chose it (sync runs: nothing)
    "loop/checkpoints/checkpointer.py:Checkpointer.poll",  # in the checkpoints' room since issue 39
    "loop/trainer_api.py:TrainerAPI._fire",
    "loop/trainer.py:Trainer._fire",
    "loop/run.py:TrainingRun.train_mode",
    "loop/run.py:TrainingRun.begin_step",
    "loop/run/position.py:Position.begin_step",  # the run's position, its own part since issue 39
    "loop/run.py:TrainingRun.advance",
    "loop/run/position.py:Position.advance",
    "loop/run.py:TrainingRun.finish_step",
    "loop/run/training_run.py:TrainingRun.finish_step",  # the run's room since issue 39
    "loop/run.py:TrainingRun.sync_state",
    "loop/run/training_run.py:TrainingRun.sync_state",
    "loop/run.py:TrainingRun.stop_if_preempted",
    "loop/run/training_run.py:TrainingRun.stop_if_preempted",
    "modeling/model_path.py:forward",
    "loop/run.py:TrainingRun.log_due",
    "loop/run/training_run.py:TrainingRun.log_due",
    "loop/run.py:TrainingRun.window_full",
    "loop/run/training_run.py:TrainingRun.window_full",
    "distributed/engine.py:Engine.accumulate",
    "distributed/engine.py:Engine.backward",
    "distributed/engine.py:Engine.clip",
    "distributed/engine.py:Engine.step",
    "distributed/engine.py:_plain_step",  # the step's parts, chosen once per run (Engine._choose_step)
    "modeling/loss.py:LossWindow.add",
    "loop/run/loss_log.py:LossWindow.add",  # the loss log's window since issue 39
    "modeling/loss.py:has_no_targets",
    "modeling/loss.py:items_in_batch",
    "modeling/loss.py:count_items",
    "data/items.py:count_items",
    "data/items.py:items_in_batch",
    "core/events.py:CallbackHandler.dispatch",
    "callbacks/flow.py:DefaultFlowCallback.on_step_end",
]
# The evaluation's functions, as issue 31 counts them: the loop (`Evaluation.run` since it became a
# component; `evaluation_loop` held it before), the hook around it, the batches' cut and one step.
EVAL_PATH = [
    "loop/eval/loop.py:Evaluation.run",
    "loop/eval/hooks.py:evaluation_loop",
    "loop/eval/hooks.py:LoopCall.run",  # the hook's body, built from values since issue 39
    "loop/eval/hooks.py:build_evaluation",
    "loop/eval/hooks.py:LoopCall.build",
    "loop/eval/hooks.py:_real_batches",
    "loop/eval/batches.py:real_batches",
    "loop/eval/hooks.py:prediction_step",
]
# The optional features of issue 31 item 3, by what names each in code: a loop file other than the plug-in
# table (`loop/plugins.py`) that names one is a file a new add-on of its kind would touch too.
PLUGIN_NAMES = {
    "liger": "liger.",
    "overflow detector": "debug_underflow",
    "NEFTune": "neftune.",
    "lean activations": "lean_activations",
    "past_index": "PastState",
    "torch_empty_cache_steps": "EmptyCacheEvery",
    "JIT checkpoint": "jit_checkpoint_callbacks",
}
# Counted apart: the review of bbf2813 left the event dispatch and the flow callback out of its step path.
EVENT_SIDE = {
    "core/events.py:CallbackHandler.dispatch",
    "callbacks/flow.py:DefaultFlowCallback.on_step_end",
}


def _assigned(node: ast.AST) -> list[ast.expr]:
    """The targets `node` assigns to (assignments, augmented and annotated ones, `with ... as`)."""
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return [node.target]
    if isinstance(node, ast.withitem) and node.optional_vars is not None:
        return [node.optional_vars]
    return []


def branch_points(fn: ast.AST) -> int:
    """Branch points of one function, not counting nested functions or classes."""
    points = 0
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.With, ast.AsyncWith)):
            points += 1
        elif isinstance(node, (ast.IfExp, ast.ExceptHandler)):
            points += 1
        elif isinstance(node, ast.BoolOp):
            points += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            points += 1 + len(node.ifs)
        stack.extend(ast.iter_child_nodes(node))
    return points


def _find(src: Path, qualified: str) -> ast.AST | None:
    file, _, name = qualified.partition(":")
    path = src / file
    if not path.exists():
        return None
    tree = ast.parse(path.read_text())
    scope: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    for part in name.split("."):
        node = next(
            (
                n
                for n in scope
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part
            ),
            None,
        )
        if node is None:
            return None
        scope = node.body  # type: ignore[attr-defined]
    return node


def _trainer_files(src: Path) -> set[Path]:
    return {src / f for f, _ in TRAINER_CLASSES if (src / f).exists()}


def _self_writes(cls: ast.ClassDef) -> dict[str, set[str]]:
    """{method: attributes assigned as self.x in it}; '<class>' holds class-level declarations."""
    out: dict[str, set[str]] = {"<class>": set()}
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            out["<class>"].add(stmt.target.id)
        elif isinstance(stmt, ast.Assign):
            out["<class>"].update(t.id for t in stmt.targets if isinstance(t, ast.Name))
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = out.setdefault(stmt.name, set())
            for node in ast.walk(stmt):
                for t in _assigned(node):
                    for sub in ast.walk(t):
                        if (
                            isinstance(sub, ast.Attribute)
                            and isinstance(sub.value, ast.Name)
                            and sub.value.id == "self"
                        ):
                            names.add(sub.attr)
    return out


def _methods_and_properties(cls: ast.ClassDef) -> set[str]:
    return {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def late_attributes(src: Path) -> tuple[set[str], set[str]]:
    """(attributes first set outside __init__, attributes set in __init__) of the Trainer chain."""
    in_init: set[str] = set()
    elsewhere: set[str] = set()
    methods: set[str] = set()
    for file, cls_name in TRAINER_CLASSES:
        cls = _find(src, f"{file}:{cls_name}")
        if not isinstance(cls, ast.ClassDef):
            continue
        methods |= _methods_and_properties(cls)
        for method, names in _self_writes(cls).items():
            if (
                method != "<class>"
            ):  # a class-level constant is not state; a declaration is counted where written
                (in_init if method == "__init__" else elsewhere).update(names)
    elsewhere |= {a for a, _ in other_module_writes(src)}
    # Methods assigned as callables in the class body are declarations of methods, not state.
    return {a for a in elsewhere - in_init if a not in methods}, in_init


def other_module_writes(src: Path) -> list[tuple[str, str]]:
    """(attribute, file:line) of each write to a Trainer attribute outside the Trainer's files
    (tf/ is TFTrainer's own package: its `trainer` is another class)."""
    sites: list[tuple[str, str]] = []
    skip = _trainer_files(src)
    for path in sorted(src.rglob("*.py")):
        if path in skip or path.relative_to(src).parts[0] == "tf":
            continue
        rel = path.relative_to(src)
        for node in ast.walk(ast.parse(path.read_text())):
            targets = _assigned(node)
            if not targets and (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "setattr"
                and node.args
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id == "trainer"
            ):
                name = node.args[1].value if isinstance(node.args[1], ast.Constant) else "?"
                sites.append((str(name), f"{rel}:{node.lineno}"))
            elif (
                isinstance(node, ast.Attribute)
                and node.attr == "__dict__"
                and isinstance(node.value, ast.Name)
                and node.value.id == "trainer"
            ):
                sites.append(("__dict__", f"{rel}:{node.lineno}"))
            for t in targets:
                for sub in ast.walk(t):
                    if (
                        isinstance(sub, ast.Attribute)
                        and isinstance(sub.value, ast.Name)
                        and sub.value.id == "trainer"
                        and isinstance(sub.ctx, ast.Store)
                    ):
                        sites.append((sub.attr, f"{rel}:{sub.lineno}"))
    return sites


def _is_run(node: ast.expr) -> bool:
    """`run`, `self.run`, `self._run` or `trainer._run`: a TrainingRun seen from outside it."""
    if isinstance(node, ast.Name):
        return node.id == "run"
    return isinstance(node, ast.Attribute) and node.attr in ("run", "_run")


def run_field_writes(src: Path) -> list[tuple[str, str]]:
    """(field, file:line) of each write to a TrainingRun field (`run.x = ...`, also augmented and in a
    tuple) from a module other than the run's own (`loop/run.py`, since issue 39 `loop/run/training_run.py`)."""
    sites: list[tuple[str, str]] = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src)
        if str(rel) in ("loop/run.py", "loop/run/training_run.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            for target in _assigned(node):
                for sub in ast.walk(target):
                    if (
                        isinstance(sub, ast.Attribute)
                        and isinstance(sub.ctx, ast.Store)
                        and _is_run(sub.value)
                    ):
                        sites.append((sub.attr, f"{rel}:{sub.lineno}"))
    return sites


def plugin_sites(src: Path) -> dict[str, list[str]]:
    """{feature: loop files naming it}, leaving out the plug-in table itself."""
    files = [p for p in sorted((src / "loop").glob("*.py")) if p.name != "plugins.py"]
    texts = {p.name: p.read_text() for p in files}
    return {
        feature: [name for name, text in texts.items() if token in text]
        for feature, token in PLUGIN_NAMES.items()
    }


# Test folders that hold no package folder's tests: shared helpers, job scripts, whole-project checks.
SHARED_TEST_FOLDERS = {"kit", "jobs", "project"}


def _test_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return {name for name in names if name.startswith("test_")}


def test_shape(tests: Path, src: Path) -> None:
    files = sorted(tests.rglob("test_*.py"))
    folder_of = {f.stem: f.parent.relative_to(tests).as_posix() for f in files}
    large = [(len(f.read_text().splitlines()), f.relative_to(tests).as_posix()) for f in files]
    large = sorted((n, name) for n, name in large if n > 600)
    packages = {d.name for d in src.iterdir() if d.is_dir() and (d / "__init__.py").exists()}
    astray = [
        f.relative_to(tests).as_posix()
        for f in files
        if f.parent.relative_to(tests).parts[:1] not in [(p,) for p in packages | SHARED_TEST_FOLDERS]
    ]
    imports = [(f, name) for f in files for name in sorted(_test_imports(f)) if name in folder_of]
    crossing = [
        f"{f.relative_to(tests).as_posix()} -> {name}"
        for f, name in imports
        if folder_of[name] != folder_of[f.stem]
    ]
    print(f"tests: {len(files)} test files, over 600 lines: {len(large)}")
    print("  " + ", ".join(f"{name} {n}" for n, name in large))
    print(
        f"test files outside a package folder: {len(astray)}; test modules importing a test module: "
        f"{len(imports)}, of another folder: {len(crossing)}"
    )
    print("  " + ", ".join(crossing))


def main() -> None:
    src = (
        Path(sys.argv[1])
        if len(sys.argv) > 1
        else Path(__file__).resolve().parents[1] / "src" / "trainwright"
    )
    epoch = _find(src, "loop/trainer.py:Trainer._run_epoch")
    assert isinstance(epoch, ast.FunctionDef), "no Trainer._run_epoch"
    lines = (epoch.end_lineno or epoch.lineno) - epoch.lineno + 1
    print(f"_run_epoch: {lines} lines, {branch_points(epoch)} branch points")
    total, events, counted, missing = 0, 0, [], []
    for name in STEP_PATH:
        fn = _find(src, name)
        if fn is None:
            missing.append(name)
            continue
        points = branch_points(fn)
        total += points
        events += points if name in EVENT_SIDE else 0
        counted.append(f"{name.partition(':')[2]}={points}")
    print(
        f"step path: {total} branch points over {len(counted)} functions "
        f"({total - events} without the event dispatch and the flow callback, as the review counts)"
    )
    print("  " + ", ".join(counted))
    for name in EVAL_PATH:
        fn = _find(src, name)
        if fn is not None:
            size = (getattr(fn, "end_lineno", None) or fn.lineno) - fn.lineno + 1  # type: ignore[attr-defined]
            print(f"{name}: {size} lines, {branch_points(fn)} branch points")
    sites = plugin_sites(src)
    touched = sorted({name for names in sites.values() for name in names})
    print(
        f"loop files besides the plug-in table naming an optional feature: {len(touched)} "
        f"({', '.join(touched) or 'none'}); a new add-on: its file + "
        f"{'a row of loop/plugins.py' if (src / 'loop/plugins.py').exists() else 'the Trainer files that wire it'}"
    )
    print("  " + ", ".join(f"{feature}: {'+'.join(names) or '-'}" for feature, names in sites.items()))
    run_writes = run_field_writes(src)
    fields = sorted({field for field, _ in run_writes})
    modules = sorted({site.partition(":")[0] for _, site in run_writes})
    print(
        f"TrainingRun fields written from other modules: {len(fields)} fields, {len(run_writes)} sites "
        f"in {len(modules)} modules"
    )
    print("  " + ", ".join(f"{site}: run.{field}" for field, site in run_writes))
    late, _ = late_attributes(src)
    print(f"Trainer attributes first set outside __init__: {len(late)}")
    print("  " + ", ".join(sorted(late)))
    writes = other_module_writes(src)
    modules = {site.partition(":")[0] for _, site in writes}
    print(f"Trainer attribute writes from other modules: {len(writes)} sites in {len(modules)} modules")
    for attr, site in writes:
        print(f"  {site}: trainer.{attr}")
    tests = src.parents[1] / "tests"
    if tests.is_dir():
        test_shape(tests, src)


if __name__ == "__main__":
    main()
