"""The layout's rules (docs/architecture.md): no import cycle, no module reaching into
another's underscore names, the layers, and one writer of a call. (A function's size is
ruff's to check: complexity and argument count, pyproject.toml.)"""

from __future__ import annotations

import ast
import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

import coalesce
from coalesce._calls import Job

SRC = Path(coalesce.__file__).parent


def _modules() -> dict[str, ast.Module]:
    trees = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        trees[".".join(parts)] = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return trees


MODULES = _modules()


def _is_package(name: str) -> bool:
    return (SRC.parent / name.replace(".", "/") / "__init__.py").exists()


def _imports(name: str, tree: ast.Module) -> Iterator[tuple[str, str]]:
    """``(module, imported name)`` for every ``from ... import`` of a coalesce module."""
    base = name.split(".") if _is_package(name) else name.split(".")[:-1]
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            target = ".".join([*base[: len(base) - node.level + 1], *filter(None, [node.module])])
        else:
            target = node.module or ""
        if target.split(".")[0] == "coalesce":
            for alias in node.names:
                yield target, alias.name


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, tree in MODULES.items():
        for target, imported in _imports(name, tree):
            module = f"{target}.{imported}"
            graph[name].add(module if module in MODULES else target)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle() -> None:
    assert _cycle(_graph()) is None


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own_private_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return {name for name in names if _private(name)}


def test_no_module_uses_another_modules_underscore_names() -> None:
    private = {name: _own_private_names(tree) for name, tree in MODULES.items()}
    everyone = set().union(*private.values())
    found = []
    for name, tree in MODULES.items():
        for target, imported in _imports(name, tree):
            if _private(imported) and f"{target}.{imported}" not in MODULES:
                found.append(f"{name}: from {target} import {imported}")
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or node.attr not in everyone:
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and ast.unparse(owner.func) == "super":
                continue
            if node.attr not in private[name]:
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


# Layers, lowest first. A module may import its own layer and any lower one, never a
# higher one, not even for type checking (docs/architecture.md draws them). The base is
# vocabulary every layer shares: errors, argument checks, defaults, prices. The calls
# and their reports sit above planning, which reads them through its own protocols.
LAYERS: list[tuple[str, ...]] = [
    (
        "coalesce._exceptions",
        "coalesce.exceptions",
        "coalesce._validate",
        "coalesce._options",
        "coalesce._pricing",
        "coalesce._paths",
    ),
    ("coalesce._batching",),
    # The fleet: where a call is coalesced (its partition's owner, over NATS); it knows
    # nothing of LLMs, and the surfaces above hand it their calls.
    ("coalesce._fleet",),
    ("coalesce._wire", "coalesce.providers"),
    ("coalesce._planning",),
    ("coalesce._calls",),
    ("coalesce._observe",),
    ("coalesce._accuracy",),
    ("coalesce._engine",),
    ("coalesce._lanes",),
    # Synchronous callers and many items: below the surfaces that offer them.
    ("coalesce._sync",),
    ("coalesce._wrap", "coalesce._prompt"),
    # The HTTP gateway (``coalesce serve``): a surface over the drop-in client.
    ("coalesce._gateway",),
]
#: Outside the layers: the public surface, the command line, the demo, the simulator.
TOP = ("coalesce", "coalesce.__main__", "coalesce.cli", "coalesce._demo", "coalesce.testing")


def _layer(module: str) -> int | None:
    for index, names in enumerate(LAYERS):
        if any(module == name or module.startswith(name + ".") for name in names):
            return index
    return None


def _all_imports(name: str, tree: ast.Module) -> Iterator[str]:
    """Every coalesce module ``name`` imports, type-checking imports included."""
    for target, imported in _imports(name, tree):
        module = f"{target}.{imported}"
        yield module if module in MODULES else target


def test_every_module_is_in_a_layer_or_on_top() -> None:
    lost = [
        name
        for name in MODULES
        if _layer(name) is None
        and not any(name == t or (t != "coalesce" and name.startswith(t + ".")) for t in TOP)
    ]
    assert lost == []


def test_no_layer_imports_a_higher_one() -> None:
    upward = []
    for name, tree in MODULES.items():
        own = _layer(name)
        if own is None:
            continue
        for target in _all_imports(name, tree):
            theirs = _layer(target)
            if theirs is not None and theirs > own:
                upward.append(f"{name} imports {target}")
    assert upward == []


def test_the_layer_check_finds_an_upward_import() -> None:
    assert _layer("coalesce._batching.batcher") == 1
    assert _layer("coalesce._engine.engine") == 8
    assert _layer("coalesce._engine.engine") > _layer("coalesce._planning.state")  # type: ignore[operator]
    assert _layer("coalesce.testing._provider") is None


# The simulated provider stands apart from the library it tests (issue 36): it imports
# nothing of coalesce but the public exceptions, so that it counts tokens, parses
# requests and serves HTTP its own way, and an error of the library's cannot hide in
# the simulator's numbers. (Python imports the package ``coalesce`` itself before
# ``coalesce.testing``; what is checked is what the simulator's code uses.)
SIMULATOR = "coalesce.testing"
SIMULATOR_MAY_IMPORT = {"coalesce.exceptions"}


def _coalesce_imports(name: str, tree: ast.Module) -> Iterator[str]:
    """Every coalesce module ``name`` imports, however (``import``, ``from``, inside a
    function or under ``TYPE_CHECKING``)."""
    yield from _all_imports(name, tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "coalesce":
                    yield alias.name


def _outside(name: str) -> bool:
    return name != SIMULATOR and not name.startswith(SIMULATOR + ".")


def _simulator_imports(modules: dict[str, ast.Module]) -> dict[str, set[str]]:
    """For each simulator module, the coalesce modules outside the simulator it imports."""
    return {
        name: {target for target in _coalesce_imports(name, tree) if _outside(target)}
        for name, tree in modules.items()
        if not _outside(name)
    }


def test_the_simulator_imports_only_the_public_exceptions() -> None:
    imported = _simulator_imports(MODULES)
    assert {name: found - SIMULATOR_MAY_IMPORT for name, found in imported.items()} == {
        name: set() for name in imported
    }
    # ... and those import no more than the exceptions themselves.
    for name in SIMULATOR_MAY_IMPORT:
        assert set(_coalesce_imports(name, MODULES[name])) <= {"coalesce._exceptions"}


def test_the_public_exceptions_are_the_whole_hierarchy() -> None:
    import coalesce._exceptions
    import coalesce.exceptions

    assert coalesce.exceptions.__all__ == coalesce._exceptions.__all__
    for name in coalesce.exceptions.__all__:
        assert getattr(coalesce.exceptions, name) is getattr(coalesce, name)


def test_the_simulator_check_finds_an_import() -> None:
    code = {
        "coalesce.testing._a": "from coalesce._planning.tokens import count_tokens",
        "coalesce.testing._b": "def f():\n    import coalesce._planning.tokens",
        "coalesce.testing._c": "from coalesce import ConfigurationError",
        "coalesce.testing._d": "from coalesce.exceptions import ConfigurationError\nfrom . import _a",
    }
    imported = _simulator_imports({name: ast.parse(text) for name, text in code.items()})
    assert imported == {
        "coalesce.testing._a": {"coalesce._planning.tokens"},
        "coalesce.testing._b": {"coalesce._planning.tokens"},
        "coalesce.testing._c": {"coalesce"},
        "coalesce.testing._d": {"coalesce.exceptions"},
    }


def test_the_engine_imports_at_most_10_of_coalesces_modules() -> None:
    name = "coalesce._engine.engine"
    assert len(set(_all_imports(name, MODULES[name]))) <= 10


def test_docs_architecture_names_every_module() -> None:
    """Every module under src/ has a row in docs/architecture.md's table, by its path."""
    text = (SRC.parent.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = [
        name
        for name in MODULES
        if name != "coalesce"
        and not name.startswith("coalesce.testing.")
        and f"`{_path(name)}`" not in text
    ]
    assert missing == []


def _path(name: str) -> str:
    """``coalesce._engine.group`` -> ``_engine/group.py``; a package -> ``_engine/``."""
    relative = name.split(".", 1)[1].replace(".", "/")
    return f"{relative}/" if _is_package(name) else f"{relative}.py"


# A call has one writer (issue 21): its own data is frozen, and only the group runner
# moves its progress; listeners keep their own tables, keyed by the job.
PROGRESS_WRITER = "coalesce._engine.group"


def _progress_writes(tree: ast.Module) -> list[str]:
    """Every assignment (``=``, ``+=``, ...) to an attribute of a ``.progress`` object."""
    return [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and (
            (isinstance(node.value, ast.Attribute) and node.value.attr == "progress")
            or (isinstance(node.value, ast.Name) and node.value.id == "progress")
        )
    ]


def test_only_the_group_runner_writes_a_calls_progress() -> None:
    writers = {name for name, tree in MODULES.items() if _progress_writes(tree)}
    assert writers == {PROGRESS_WRITER}


def test_the_progress_check_finds_a_writer() -> None:
    tree = ast.parse("job.progress.done = True\njob.progress.attempts += 1\nx = job.progress.done")
    assert _progress_writes(tree) == ["job.progress.done", "job.progress.attempts"]
    assert _progress_writes(ast.parse("progress = job.progress\nprogress.company = 2")) == [
        "progress.company"
    ]


def test_a_job_is_frozen() -> None:
    assert dataclasses.is_dataclass(Job)
    assert Job.__dataclass_params__.frozen  # type: ignore[attr-defined]
    job = Job("item", '"item"', math.inf)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.plan = None  # type: ignore[misc]


def test_the_tests_mirror_the_source_folders() -> None:
    """Each folder of tests/ is named after a package of src/ (``_engine`` -> ``engine``),
    or holds the tests of benchmarks/ code, or those of coalesce under real frameworks."""
    tests = Path(__file__).parent
    packages = {
        name.split(".")[1].lstrip("_") for name in MODULES if _is_package(name) and "." in name
    }
    folders = {
        path.name for path in tests.iterdir() if path.is_dir() and path.name != "__pycache__"
    }
    assert folders - packages <= {"benchmarks", "integrations"}
    assert {"batching", "engine", "accuracy", "observe", "planning", "lanes", "wrap"} <= folders
