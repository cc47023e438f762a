"""The shape of the package, checked: which module may import which.

The helpers read the source with :mod:`ast` (nothing is imported), so they see what a
module imports when it is loaded: its module-level imports, including those under a
top-level ``if`` or ``try``, but not those under ``if TYPE_CHECKING:`` (never run) nor
those inside functions (run later, when every module is loaded). They are meant to be
reused by further structural assertions (say, "``lota.cache`` imports nothing of
``lota.regions``"): :func:`imports` for one module, :func:`import_graph` for all of them.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator, Mapping, Set
from functools import cache
from pathlib import Path

from lota import errors

PACKAGE = Path(__file__).resolve().parents[2] / "lota"


@cache
def modules() -> Mapping[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(module: str, *, in_functions: bool = False) -> set[str]:
    """The package's modules that `module` imports when it is loaded (with `in_functions`,
    also those it imports inside functions and classes' methods)."""
    path = modules()[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _import_nodes(tree.body, in_functions):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = _absolute(node, package)
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        found.update(name for name in map(_known, names) if name and name != module)
    return found


def outside_imports(module: str) -> set[str]:
    """The top-level names of what `module` imports from outside the package when it is
    loaded (``asyncio``, ``aiohttp``...)."""
    path = modules()[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: set[str] = set()
    for node in _import_nodes(tree.body, False):
        if isinstance(node, ast.Import):
            found.update(alias.name.partition(".")[0] for alias in node.names)
        elif not node.level and node.module:
            found.add(node.module.partition(".")[0])
    return found - {"lota"}


def reachable(module: str) -> set[str]:
    """`module` and every module of the package loading it loads."""
    graph = import_graph()
    seen = {module}
    frontier = [module]
    while frontier:
        for child in graph[frontier.pop()]:
            if child not in seen:
                seen.add(child)
                frontier.append(child)
    return seen


@cache
def import_graph(*, in_functions: bool = False) -> Mapping[str, Set[str]]:
    """Each module of the package and the package's modules it imports."""
    return {module: imports(module, in_functions=in_functions) for module in modules()}


def cycles(graph: Mapping[str, Set[str]]) -> list[list[str]]:
    """The import cycles of `graph`: each strongly connected group of two or more modules
    (or a module importing itself), sorted, as ``[a, b, ..., a]`` along one cycle."""
    found = []
    for group in _strongly_connected(graph):
        if len(group) > 1 or group[0] in graph.get(group[0], ()):
            found.append(_one_cycle(graph, set(group)))
    return sorted(found)


def _import_nodes(
    body: list[ast.stmt], in_functions: bool
) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _import_nodes(node.orelse, in_functions)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if in_functions or isinstance(node, ast.ClassDef):
                yield from _import_nodes(node.body, in_functions)
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(node, field, ()):
                    inner = (
                        child.body
                        if isinstance(child, ast.excepthandler | ast.match_case)
                        else [child]
                    )
                    yield from _import_nodes(inner, in_functions)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = parts[: len(parts) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def _known(name: str) -> str | None:
    """`name` if it is a module of the package, else None (a name inside a module is
    reached through the module: ``from lota.x import f`` is an import of ``lota.x``)."""
    return name if name in modules() else None


def _strongly_connected(graph: Mapping[str, Set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    groups.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return groups


def _one_cycle(graph: Mapping[str, Set[str]], group: set[str]) -> list[str]:
    """A path from the group's first module back to itself, within the group (BFS)."""
    start = min(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph.get(node, ())):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if child in group and child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start}")


# -- the assertions ---------------------------------------------------------------------------


def test_there_is_no_import_cycle_among_the_modules_of_lota() -> None:
    assert cycles(import_graph()) == []


def test_no_import_inside_a_function_dodges_a_cycle() -> None:
    """A function-level import is for a slow or optional dependency (the server, moto, a
    database driver), never to hide a cycle: lota.lifecycle.rules once imported
    lota.config inside a function because lota.config imports the lifecycle's config."""
    assert cycles(import_graph(in_functions=True)) == []


def test_the_cycle_finder_finds_a_cycle_and_names_its_path() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c", "a"], ["e", "e"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_reader_sees_module_level_imports_only() -> None:
    # lota.config imports the lifecycle's config section at module level...
    assert "lota.lifecycle.config" in imports("lota.config")
    # ...and lota.cli imports the node only inside the command that serves.
    assert "lota.node.serve" not in imports("lota.cli")
    assert "lota.node.serve" in imports("lota.cli", in_functions=True)


def exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class the package defines, by name, from importing each module
    (``lota.__main__`` runs the command, so it is left out)."""
    found: dict[str, type[BaseException]] = {}
    for name in modules():
        if name == "lota.__main__":
            continue
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__ == name
            ):
                found[value.__name__] = value
    return found


def test_every_exception_of_lota_is_a_lota_error_and_is_drawn_in_the_tree() -> None:
    """lota.errors draws the one error tree; private control-flow signals (a leading
    underscore) are the only exceptions outside it."""
    public = {name: cls for name, cls in exception_classes().items() if not name.startswith("_")}
    assert [name for name, cls in public.items() if not issubclass(cls, errors.LotaError)] == []
    assert errors.__doc__ is not None
    drawn = set(re.findall(r"^ {4}([A-Z]\w+)", errors.__doc__, re.M))  # the root
    drawn |= set(re.findall(r"^ {4}[│ ]*[├└]── ([A-Z]\w+)", errors.__doc__, re.M))
    assert drawn == set(public)


def test_the_cache_reaches_its_sources_only_through_the_chunk_source_protocol() -> None:
    """lota.cache never names the origins: the origin is one ChunkSource (built in
    lota.node.build), and a peer will be another, without a change to the cache."""
    cache = [name for name in modules() if name == "lota.cache" or name.startswith("lota.cache.")]
    loaded = {name: reachable(name) for name in cache}
    assert {
        name: sorted(m for m in found if m.startswith("lota.regions"))
        for name, found in loaded.items()
        if any(m.startswith("lota.regions") for m in found)
    } == {}


def test_the_read_plan_is_sans_io() -> None:
    """lota.cache.plan decides, it does not talk: nothing it loads uses asyncio or aiohttp."""
    loaded = reachable("lota.cache.plan")
    io = {name: outside_imports(name) & {"asyncio", "aiohttp", "uvloop"} for name in loaded}
    assert {name: found for name, found in io.items() if found} == {}
    assert "lota.cache.store" not in loaded  # the plan takes the entry's fields, not the store


def test_the_import_readers_see_outside_imports_and_what_a_module_loads() -> None:
    assert {"asyncio", "aiohttp"} <= outside_imports("lota.cache.fill") | outside_imports(
        "lota.cache.reads"
    )
    assert "lota.errors" in reachable("lota.s3.errors")


MAX_MODULE_LINES = 600  # past this a module holds more than one concern: split it


def test_no_module_of_lota_is_over_600_lines() -> None:
    long = {
        name: lines
        for name, path in modules().items()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"split these modules (lines): {long}"
