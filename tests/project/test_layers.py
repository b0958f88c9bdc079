"""The package's layers, kept by a test: imports point down only and no import cycle exists.

Every import counts, including ones inside functions and under `TYPE_CHECKING`: an upward
import for an annotation still ties a lower layer to the loop's shape.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from kit import ROOT

SRC = ROOT / "src" / "trainwright"

# Lowest first. A module may import its own layer and the layers below it, never above.
LAYERS: list[tuple[str, ...]] = [
    ("core",),
    ("args",),
    ("data", "optim", "checkpoint", "distributed", "observe", "modeling", "callbacks", "reporters"),
    ("loop", "tf"),
    ("patch",),  # a library API at the face (`patch_transformers`) that the commands use too
    ("app",),
    ("__init__", "__main__", "integrations", "trainer_utils"),  # the public face
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in SRC.rglob("*.py")}


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Every trainwright module that `path` imports, resolved to a module (not an attribute).

    `from a.b import c` counts as `import a.b.c` when `c` is a module (the package `a.b` itself only
    when a name is taken from it), as `import a.b.c` counts as `a.b.c` alone."""
    return _imports_of(path.read_text(), name, known, is_pkg=path.name == "__init__.py")


def _imports_of(source: str, name: str, known: set[str], *, is_pkg: bool = False) -> set[str]:
    package = name if is_pkg else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names]
            if any(t not in known for t in targets):
                targets.append(base)
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(path, name, set(mods)) for name, path in mods.items()}


def _layer(module: str) -> tuple[str, int]:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    if top not in RANK:
        raise AssertionError(
            f"{module}: its folder {top!r} has no layer in tests/project/test_layers.py LAYERS"
        )
    return top, RANK[top]


def test_every_module_has_a_layer():
    for module in _modules():
        _layer(module)


def test_imports_point_down_only():
    upward = []
    for importer, imported in _graph().items():
        _, rank = _layer(importer)
        for target in imported:
            top, target_rank = _layer(target)
            if target_rank > rank:
                upward.append(f"{importer} imports {target} (layer {top!r} is above)")
    assert not upward, "\n".join(sorted(upward))


FACE = "trainwright"


def _face_importers(graph: dict[str, set[str]]) -> list[str]:
    return sorted(m for m, deps in graph.items() if m != FACE and FACE in deps)


def test_no_module_imports_the_package_face():
    # Not even inside a function: `from trainwright import X` runs the whole face (the loop, every
    # engine) from below it. A submodule is named in full (`import trainwright.core.version`).
    assert _face_importers(_graph()) == []


def test_face_imports_are_found_even_inside_functions():
    known = set(_modules())
    module = "trainwright.loop.trainer"
    face = [
        "import trainwright",
        "def f():\n    from trainwright import __version__",
        "def f():\n    from trainwright import Trainer, data",
        "def f():\n    import trainwright as tw",
        "from .. import TrainingArguments",
    ]
    for source in face:
        assert _face_importers({module: _imports_of(source, module, known)}) == [module], source
    submodules = [
        "import trainwright.core.version",
        "from trainwright import data as data_utils",
        "from trainwright.core.version import __version__",
        "def f():\n    from ..core import version",
    ]
    for source in submodules:
        assert _face_importers({module: _imports_of(source, module, known)}) == [], source


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    # Tarjan's strongly connected components: any component of more than one module is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    graph = _graph()
    # A package's __init__ re-exporting its own submodules is not a cycle between concerns.
    for m, deps in graph.items():
        graph[m] = {t for t in deps if not (t.startswith(m + ".") or m.startswith(t + ".") and _is_init(t))}
    assert _cycles(graph) == []


def _is_init(module: str) -> bool:
    return (SRC.parent / module.replace(".", "/") / "__init__.py").exists()


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# Files that are purely declarative tables may be longer (none today).
LONG_TABLES: set[str] = set()
MAX_LINES = 600


def test_every_source_file_holds_at_most_600_lines():
    long = {
        str(p.relative_to(SRC)): n
        for p in SRC.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES and str(p.relative_to(SRC)) not in LONG_TABLES
    }
    assert long == {}, f"split these by concern (or list a pure table in LONG_TABLES): {long}"


def test_the_version_is_written_once_below_the_loop():
    tomllib = pytest.importorskip("tomllib")
    import trainwright
    from trainwright.core import version

    project = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text())
    assert "version" in project["project"]["dynamic"] and "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "trainwright.core.version.__version__"
    }
    assert trainwright.__version__ == version.__version__


def _folder(module: str, depth: int) -> str:
    """The folder (package) a module sits in, `depth` levels below the package: a package's own
    `__init__` sits in itself."""
    parts = module.split(".")
    folder = parts if _is_init(module) else parts[:-1]
    return ".".join(folder[: depth + 1])


def _folder_graph(depth: int, strict: bool = False) -> dict[str, set[str]]:
    """Folder -> folders its modules import. Strict: a sub-folder and its parent folder's own files
    count as two folders too (the package's root is its face, files each on a layer of its own, and
    stays out of that)."""
    graph: dict[str, set[str]] = {}
    for importer, imported in _graph().items():
        source = _folder(importer, depth)
        for target in imported:
            folder = _folder(target, depth)
            nested = folder.startswith(source + ".") or source.startswith(folder + ".")
            if folder != source and (not nested or (strict and "trainwright" not in (source, folder))):
                graph.setdefault(source, set()).add(folder)
    return graph


@pytest.mark.parametrize("depth", [1, 2])
def test_no_folder_imports_a_folder_that_imports_it(depth):
    # A module cycle-free tree can still tie two folders into one (a helper in the room of its
    # user's user): every folder, and every sub-folder of one, stays on one side of each other.
    assert _cycles(_folder_graph(depth)) == []


def test_no_sub_folder_imports_its_parents_files_that_import_it():
    # loop/eval, loop/search, loop/hub are rooms of their own: the Trainer's files use them, and they
    # take what they read as values, never a module of the folder above them (issue 39)
    assert _cycles(_folder_graph(2, strict=True)) == []
