"""``python -m bench.sim run ...`` or ``python -m bench.sim model ...``: each imported only
when asked for, so that one does not pay for (or need) the other's dependencies."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {"run": "bench.sim.run", "model": "bench.sim.model"}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print("usage: python -m bench.sim {run,model} [--help]", file=sys.stderr)
        return 2
    command: int = importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])
    return command


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
