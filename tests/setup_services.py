"""Install what the test suite needs from the system, once, before pytest runs.

`make test` calls this so that a fresh Debian machine (and CI) gets the AWS CLI the tests
drive (the ``awscli`` package), and the Prometheus server and ``promtool`` that check the
deployment's dashboard and alerts (the ``prometheus`` package; installing it starts no
server where there is no init system, and the test runs its own), without a step by hand. PostgreSQL's server binaries for the
catalog tests are not installed here: tests/postgres.py finds ``initdb`` and ``pg_ctl`` on
PATH or under ``/usr/lib/postgresql/*/bin``, and the catalog tests fail, naming the package
(``apt-get install postgresql``), when they are missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

DEBIAN_PACKAGES = {"/usr/bin/aws": "awscli", "/usr/bin/prometheus": "prometheus"}


def missing_packages() -> list[str]:
    return [pkg for path, pkg in DEBIAN_PACKAGES.items() if not Path(path).exists()]


def main() -> int:
    missing = missing_packages()
    if not missing:
        return 0
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        names = " ".join(missing)
        print(f"tests need Debian packages: apt-get install {names}", file=sys.stderr)
        return 1
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print(f"installing {' '.join(missing)} (apt-get)...", flush=True)
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
        check=True,
        env=env,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
