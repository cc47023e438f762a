"""Every task in lota/ has an owner: what ruff's banned-api rule cannot see, this does.

Ruff (TID251, pyproject.toml) bans ``asyncio.create_task`` and ``asyncio.ensure_future`` by
name; it cannot know that ``loop`` in ``loop.create_task(...)`` is an event loop. This scans
the package's syntax for any ``X.create_task(...)`` or ``X.ensure_future(...)`` outside
lota/tasks.py, allowing only ``create_task`` on the target of an
``async with asyncio.TaskGroup() as X``, whose tasks end inside that block.
"""

from __future__ import annotations

import ast
from pathlib import Path

import lota

PACKAGE = Path(lota.__file__).parent
OWNER = PACKAGE / "tasks.py"
SPAWNERS = {"create_task", "ensure_future"}


def _structured_groups(tree: ast.AST) -> set[str]:
    """Names bound by ``async with asyncio.TaskGroup() as NAME`` anywhere in the module."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.AsyncWith):
            for item in node.items:
                call, target = item.context_expr, item.optional_vars
                if (
                    isinstance(call, ast.Call)
                    and ast.unparse(call.func) == "asyncio.TaskGroup"
                    and isinstance(target, ast.Name)
                ):
                    names.add(target.id)
    return names


def _unowned_spawns(path: Path, root: Path = PACKAGE) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    groups = _structured_groups(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        func = node.func
        if func.attr not in SPAWNERS:
            continue
        receiver = func.value
        if func.attr == "create_task" and isinstance(receiver, ast.Name) and receiver.id in groups:
            continue
        found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(func)}(...)")
    return found


def test_no_task_in_lota_is_started_outside_lota_tasks() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path != OWNER:
            found += _unowned_spawns(path)
    assert found == [], "start these through lota.tasks.TaskGroup:\n" + "\n".join(found)


def test_the_scan_sees_a_loop_create_task_and_allows_a_structured_group(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import asyncio\n"
        "async def f(c):\n"
        "    loop = asyncio.get_running_loop()\n"
        "    loop.create_task(c)\n"
        "    async with asyncio.TaskGroup() as group:\n"
        "        group.create_task(c)\n"
    )
    assert _unowned_spawns(probe, tmp_path) == ["probe.py:4: loop.create_task(...)"]
