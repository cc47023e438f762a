"""The dashboard's queries and the alert rules, run by a real Prometheus against real nodes.

A two-node cluster serves some traffic (misses, peer reads, hits, a 404, a refused
signature, a refused peer call) while Debian's Prometheus scrapes both nodes every second
with deploy/prometheus/alerts.yml loaded. Then every query of deploy/grafana/lota.json
must return data, every rule must have been evaluated without error, and every series an
expression names must exist with the labels it groups by: a misspelt metric or label
returns nothing rather than an error, so nothing less would catch it. promtool checks the
rules (and the PrometheusRule's copy of them), and runs each alert against made-up series
of the trouble it is for: it must stay quiet until its `for` is over, then fire.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from lota.testing.cluster import LocalCluster
from lota.testing.credentials import PRINCIPALS
from lota.testing.processes import HOST, free_port
from tests.conftest import client_for

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "lota.json"
PROMETHEUS = "/usr/bin/prometheus"  # Debian's prometheus, installed by tests/setup_services.py
PROMTOOL = "/usr/bin/promtool"
# What Grafana puts in place of the dashboard's variables.
VARIABLES = {"$__rate_interval": "30s", "$job": ".+", "$instance": ".+"}
MiB = 1024 * 1024


def test_promtool_passes_the_rules_and_the_prometheus_rule_has_the_same(tmp_path: Path) -> None:
    rule = yaml.safe_load((ROOT / "deploy/kubernetes/base/prometheusrule.yaml").read_text())
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())
    (tmp_path / "spec.yml").write_text(yaml.safe_dump(rule["spec"]))
    for path in (ALERTS, tmp_path / "spec.yml"):
        done = subprocess.run(
            [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def cluster(
    origin: str, credentials_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("cluster")
    settings = {"cache": {"chunk_size": "1MiB"}}
    with LocalCluster(root, origin, credentials_file, 2, cache_size="1GiB", settings=settings) as c:
        yield c


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _wait(what: str, done: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def prometheus(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Prometheus scraping both nodes every second, the rules evaluated every second."""
    root = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {
                "job_name": "lota",
                "metrics_path": "/_lota/metrics",
                "static_configs": [{"targets": cluster.members}],
            }
        ],
    }
    (root / "prometheus.yml").write_text(yaml.safe_dump(config))
    url = f"http://{HOST}:{free_port()}"
    with (root / "prometheus.log").open("wb") as log:
        server = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={root / 'data'}",
                f"--web.listen-address={url.removeprefix('http://')}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait("both nodes scraped", lambda: _targets_up(url) == 2)
        yield url
    finally:
        server.terminate()
        server.wait(30)


def _targets_up(url: str) -> int:
    try:
        targets = _get(url + "/api/v1/targets")["data"]["activeTargets"]
    except OSError:
        return 0
    return sum(t["health"] == "up" for t in targets)


def _traffic(cluster: LocalCluster) -> None:
    """Misses, peer reads and hits on both nodes, a 404, a refused signature, a refused
    peer call."""
    first, second = (client_for(url) for url in cluster.urls)
    first.create_bucket(Bucket="dashboard")
    # One-chunk objects are HIT on their owner; three-chunk ones are spread over both nodes.
    sizes = [300 * 1024] * 6 + [2 * MiB + 5] * 2
    for i, size in enumerate(sizes):
        first.put_object(Bucket="dashboard", Key=f"o{i}", Body=bytes([i]) * size)
    for rounds in range(2):
        if rounds:
            time.sleep(1.5)  # in a later scrape: the series born in the first round rise
        for client in (first, second):
            for i in range(len(sizes)):
                client.get_object(Bucket="dashboard", Key=f"o{i}")["Body"].read()
    with pytest.raises(first.exceptions.NoSuchKey):
        first.get_object(Bucket="dashboard", Key="missing")
    stranger = boto3.client(
        "s3",
        endpoint_url=cluster.urls[0],
        aws_access_key_id=PRINCIPALS["admin"][0],
        aws_secret_access_key="not-the-secret",
        region_name="us-east-1",
    )
    with pytest.raises(stranger.exceptions.ClientError):
        stranger.list_objects_v2(Bucket="dashboard")
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(cluster.urls[1] + "/_lota/peer/dashboard/o0", timeout=5)


@pytest.fixture(scope="module")
def scraped(cluster: LocalCluster, prometheus: str) -> str:
    """Prometheus, once the traffic is in at least two scrapes and every rule has run."""
    _traffic(cluster)
    time.sleep(3)
    _wait(
        "every rule evaluated",
        lambda: (
            _rules(prometheus) and all(r["lastEvaluation"] > "2000" for r in _rules(prometheus))
        ),
    )
    return prometheus


def _rules(url: str) -> list[dict[str, Any]]:
    groups = _get(url + "/api/v1/rules")["data"]["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    answer = _get(url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert answer["status"] == "success", (expr, answer)
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


_SELECTOR = re.compile(r"\b(lota_[a-z_]+|up)\b(?:\{([^}]*)\})?")
_MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|ignoring|on)\s*\(([^)]*)\)")


def _check_names(url: str, expr: str) -> None:
    """Every metric `expr` names has series, with every label it matches or groups by.
    (Label values are not checked here: a 5xx from the origin has no series on a healthy
    cluster; the query returning data is what checks them.)"""
    labels: set[str] = set()
    for name, matchers in _SELECTOR.findall(expr):
        series = _get(url + "/api/v1/series?" + urllib.parse.urlencode({"match[]": name}))
        assert series["data"], f"no series {name} (in {expr})"
        found = {label for s in series["data"] for label in s}
        for label in _MATCHER.findall(matchers):
            assert label in found, f"{name} has no label {label} (in {expr})"
        labels |= found
    for grouping in _GROUPING.findall(expr):
        for label in filter(None, (g.strip() for g in grouping.split(","))):
            assert label in labels or label == "le", f"no label {label} (in {expr})"


def _dashboard_queries() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    found = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in VARIABLES.items():
                expr = expr.replace(variable, value)
            found.append((panel["title"], expr))
    return found


def test_every_dashboard_query_returns_data(scraped: str) -> None:
    queries = _dashboard_queries()
    assert len(queries) > 30
    for title, expr in queries:
        assert "$" not in expr, f"{title}: a variable the test does not know: {expr}"
        _check_names(scraped, expr)
        assert _query(scraped, expr), f"{title}: no data for {expr}"


def test_the_sources_show_misses_peer_reads_and_hits(scraped: str) -> None:
    expr = 'sum by (source) (increase(lota_cache_requests_total{job="lota"}[1m]))'
    sources = {r["metric"]["source"]: float(r["value"][1]) for r in _query(scraped, expr)}
    assert {"HIT", "PEER", "MISS"} <= {s for s, n in sources.items() if n > 0}, sources


def test_every_alert_rule_runs_and_names_series_that_exist(scraped: str) -> None:
    rules = _rules(scraped)
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    assert sorted(r["name"] for r in rules) == sorted(
        rule["alert"] for group in groups for rule in group["rules"]
    )
    for rule in rules:
        assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
        assert rule["state"] == "inactive", f"{rule['name']} fires on a healthy cluster"
        _query(scraped, rule["query"])
        _check_names(scraped, rule["query"])


# Each alert against the trouble it is for, by `promtool test rules` on made-up series (a
# sample a minute; one every 10 minutes for the day-long one): the minute it must still be
# quiet (its `for` not yet over), the minute it must fire, and the labels it fires with.
N = 'job="lota", instance="n1"'
NODE = {"job": "lota", "instance": "n1"}
SCENARIOS: dict[str, tuple[dict[str, str], int, int, dict[str, str]]] = {
    "LotaCacheDriveFailed": (
        {f'lota_cache_dir_healthy{{{N}, dir="/cache/nvme0"}}': "1 1 0x10"},
        6,
        7,
        {**NODE, "dir": "/cache/nvme0"},
    ),
    # Connection failures alone (no 5xx series at all) are failures too.
    "LotaOriginErrors": (
        {
            f'lota_origin_errors_total{{{N}, region="us-east"}}': "0+10x20",
            f'lota_origin_requests_total{{{N}, region="us-east", method="GET", status="200"}}': (
                "0+10x20"
            ),
        },
        10,
        11,
        {"job": "lota", "region": "us-east"},
    ),
    "LotaPeerFallbacks": (
        {
            f'lota_peer_fallbacks_total{{{N}, to="origin"}}': "0+5x30",
            f'lota_peer_requests_total{{{N}, result="hit"}}': "0+10x30",
        },
        15,
        16,
        NODE,
    ),
    "LotaMigrationBacklogOld": (
        {f"lota_migration_oldest_seconds{{{N}}}": "4000x20"},
        9,
        10,
        {"job": "lota"},
    ),
    "LotaMigrationsFailing": ({f"lota_migration_failing{{{N}}}": "1x40"}, 29, 30, {"job": "lota"}),
    "LotaCorruptChunks": ({f"lota_cache_corrupt_total{{{N}}}": "0 0 1 1 1"}, 1, 2, NODE),
    "LotaNodeNotReady": ({f"lota_ready{{{N}}}": "0x20"}, 9, 10, NODE),
    "LotaNodeDown": ({f"up{{{N}}}": "0x20"}, 14, 15, NODE),
    # A day at 90% from the caches (10 reads/s), then half from the caches.
    "LotaHitRatioFalling": (
        {
            f'lota_cache_requests_total{{{N}, source="HIT"}}': "0+5400x143 775200+3000x12",
            f'lota_cache_requests_total{{{N}, source="MISS"}}': "0+600x143 88800+3000x12",
        },
        24 * 60 - 10,
        24 * 60 + 60,
        {"job": "lota"},
    ),
}


def test_every_alert_fires_on_the_trouble_it_is_for(tmp_path: Path) -> None:
    rules = yaml.safe_load(ALERTS.read_text())
    severity = {}
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations")  # promtool would want each text word for word
            severity[rule["alert"]] = rule["labels"]["severity"]
    assert set(severity) == set(SCENARIOS)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    tests = []
    for alert, (series, quiet, fires, labels) in SCENARIOS.items():
        firing = {**labels, "severity": severity[alert]}
        tests.append(
            {
                "interval": "10m" if alert == "LotaHitRatioFalling" else "1m",
                "input_series": [{"series": k, "values": v} for k, v in series.items()],
                "alert_rule_test": [
                    {"eval_time": f"{quiet}m", "alertname": alert, "exp_alerts": []},
                    {
                        "eval_time": f"{fires}m",
                        "alertname": alert,
                        "exp_alerts": [{"exp_labels": firing}],
                    },
                ],
            }
        )
    (tmp_path / "test.yml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yml"], "tests": tests})
    )
    done = subprocess.run(
        [PROMTOOL, "test", "rules", str(tmp_path / "test.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
