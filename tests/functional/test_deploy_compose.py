"""docker-compose.yml's two regions without Docker: the README's lines, run against them.

No Docker engine here, so the compose file's parts run as processes: a moto server per
region (its buckets made as the ``buckets`` service makes them), PostgreSQL from the test
fixtures, and one ``lota serve`` per region with deploy/compose/lota.toml and the
environment the compose file gives it (hosts and paths rewritten to this machine). Then
the README's AWS CLI and boto3 lines for compose run as written, localhost ports mapped to
these processes, the cross-region write included.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml

from lota.embedded import moto_server
from lota.testing.processes import AWS_CLI, LotaProcess
from tests.postgres import PostgresServer

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
README = (ROOT / "README.md").read_text()
REGIONS = ("us-east", "eu-west")


def _readme_block(language: str) -> str:
    """The first `language` block of the README's compose section."""
    section = README[README.index("### Compose ports") :]
    opening = f"```{language}\n"
    block = section[section.index(opening) + len(opening) :]
    return block[: block.index("\n```")]


@pytest.fixture(scope="module")
def regions(
    postgres_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """The compose file's services as processes: localhost port -> URL standing in for it
    (and ``catalog``: the catalog's URL, a database of its own)."""
    root = tmp_path_factory.mktemp("compose")
    catalog = postgres_server.create_database("compose")
    with ExitStack() as stack:
        origins = {region: stack.enter_context(moto_server()) for region in REGIONS}
        _make_buckets(origins)
        urls = {}
        for region, origin in origins.items():
            service = COMPOSE["services"][f"lota-{region}"]
            node = LotaProcess(
                ["--config", str(_config(root / region, origins))],
                log_path=root / f"{region}.log",
                env={**service["environment"], "LOTA_CATALOG_URL": catalog},
            )
            stack.callback(node.stop)
            urls[_published(f"lota-{region}")] = node.start().url
            urls[_published(f"origin-{region}")] = origin
            urls[f"config:{region}"] = str(root / region / "lota.toml")
        yield {**urls, "catalog": catalog}


def _published(service: str) -> str:
    (port,) = COMPOSE["services"][service]["ports"]
    return "http://localhost:" + port.split(":")[0]


def _make_buckets(origins: dict[str, str]) -> None:
    """What the compose file's one-shot ``buckets`` service runs, on these origins."""
    script = COMPOSE["services"]["buckets"]["command"][0]
    endpoints = dict(re.findall(r"^(\w+)=\"aws --endpoint-url (\S+) ", script, re.M))
    hosts = {f"http://origin-{r}:5000": url for r, url in origins.items()}
    for name, bucket in re.findall(r"^\$\$(\w+) (\S+)$", script, re.M):
        _aws(hosts[endpoints[name]], "s3api", "create-bucket", "--bucket", bucket)


def _config(directory: Path, origins: dict[str, str]) -> Path:
    """deploy/compose/lota.toml with the compose hosts and container paths of this machine."""
    text = (ROOT / "deploy/compose/lota.toml").read_text()
    for region, url in origins.items():
        text = text.replace(f"http://origin-{region}:5000", url)
    text = text.replace('"/var/lib/lota/cache"', json.dumps(str(directory / "cache")))
    text = text.replace(
        '"/etc/lota/credentials.toml"', json.dumps(str(ROOT / "deploy/compose/credentials.toml"))
    )
    directory.mkdir()
    (directory / "lota.toml").write_text(text)
    return directory / "lota.toml"


def _aws(
    endpoint: str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> str:
    keys = {
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    done = subprocess.run(
        [AWS_CLI, "--endpoint-url", endpoint, *args],
        env={"PATH": os.environ["PATH"], "HOME": "/nonexistent", **(env or keys)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
    )
    assert done.returncode == 0, f"aws {' '.join(args)}:\n{done.stderr}"
    return done.stdout


def _pending(config: str, env: dict[str, str]) -> int:
    done = subprocess.run(
        [sys.executable, "-m", "lota", "migrations", "--config", config, "--json"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    pending: int = json.loads(done.stdout)["pending"]
    return pending


def test_the_readme_lines_work_against_the_compose_regions(
    regions: dict[str, str], tmp_path: Path
) -> None:
    block = _readme_block("sh").splitlines()
    lines = [line.split("  #")[0].strip() for line in block if line[:1] not in "#"]
    (export,) = [line for line in lines if line.startswith("export ")]
    env = dict(word.split("=", 1) for word in shlex.split(export)[1:])
    (tmp_path / "shard.tar").write_bytes(os.urandom(3 * 1024 * 1024))
    (tmp_path / "ckpt.pt").write_bytes(os.urandom(1024 * 1024))
    outputs: list[tuple[str, str]] = []
    for line in lines:
        words = shlex.split(line)
        if words[0] == "aws":
            endpoint = regions[words[2]]
            args = [re.sub("^/tmp/", f"{tmp_path}/", word) for word in words[3:]]
            outputs.append((line, _aws(endpoint, *args, env=env, cwd=tmp_path)))
        elif words[:3] == ["docker", "compose", "exec"]:
            region = words[3].removeprefix("lota-")
            service_env = COMPOSE["services"][words[3]]["environment"]
            node_env = {**service_env, "LOTA_CATALOG_URL": regions["catalog"]}
            deadline = time.monotonic() + 60
            while _pending(regions[f"config:{region}"], node_env):
                assert time.monotonic() < deadline, "the cross-region write never went home"
                time.sleep(0.5)
        else:
            assert words[0] == "export", line
    assert (tmp_path / "1.tar").read_bytes() == (tmp_path / "shard.tar").read_bytes()
    assert (tmp_path / "2.tar").read_bytes() == (tmp_path / "shard.tar").read_bytes()
    # The eu-west node lists the write at once, and eu-west's own origin has it in the end.
    listings = [out for line, out in outputs if " s3 ls " in line]
    assert len(listings) == 2 and all(" ckpt.pt" in out for out in listings), listings
    # The README's boto3 lines: a HIT, and another cross-region write.
    code = _readme_block("python").replace(
        _published("lota-us-east"), regions[_published("lota-us-east")]
    )
    printed: list[str] = []
    exec(code, {"print": lambda *args: printed.extend(map(str, args))})
    assert printed == ["HIT"]
