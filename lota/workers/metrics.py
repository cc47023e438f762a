"""One node's metrics from its workers' own: :func:`merge`.

Each worker counts what it served in its own registry; ``/_lota/metrics`` on any worker
asks the others for theirs and adds them up, so the node reports as one. Samples with the
same name and labels are summed (counters, histogram buckets, sums and counts, and the
gauges that add up: bytes held, connections, requests in flight), except the gauges that
every worker knows whole (the cluster's members, the migration backlog, which build runs,
a drive's free space: the largest value) and a drive's health (the smallest: one worker's
failing drive is the drive failing). Per-drive series name the drive, not the worker's
directory on it. No I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

# Gauges every worker reports whole: the node's value is the largest.
LARGEST = frozenset(
    {
        "lota_cluster_members",
        "lota_cluster_owners",
        "lota_build_info",
        "lota_ready",
        "lota_cache_dir_free_bytes",
        "lota_migration_pending",
        "lota_migration_pending_bytes",
        "lota_migration_oldest_seconds",
        "lota_migration_failing",
    }
)
SMALLEST = frozenset({"lota_cache_dir_healthy"})
_WORKER_DIR = re.compile(r"/worker-\d+/?$")

Labels = tuple[tuple[str, str], ...]


def merge(texts: Iterable[bytes]) -> bytes:
    """The Prometheus text of several workers' metrics, as one node's."""
    helps: dict[str, tuple[str, str]] = {}  # family -> (type, help), in first-seen order
    samples: dict[tuple[str, Labels], tuple[str, float]] = {}  # -> (family, value)
    for text in texts:
        for family in text_string_to_metric_families(text.decode()):
            helps.setdefault(family.name, (family.type, family.documentation))
            for sample in family.samples:
                labels = tuple(sorted(_drive(sample.labels).items()))
                key = (sample.name, labels)
                before = samples.get(key)
                value = sample.value
                if before is not None:
                    value = _combine(family.name, before[1], value)
                samples[key] = (family.name, value)
    lines: list[str] = []
    for name, (kind, documentation) in helps.items():
        lines.append(f"# HELP {_exposed(name, kind)} {_escape(documentation)}")
        lines.append(f"# TYPE {_exposed(name, kind)} {kind}")
        for (sample_name, labels), (owner, value) in samples.items():
            if owner == name:
                lines.append(f"{sample_name}{_labels(labels)} {_number(value)}")
    return ("\n".join(lines) + "\n").encode()


def _combine(family: str, before: float, value: float) -> float:
    if family in LARGEST:
        return max(before, value)
    if family in SMALLEST:
        return min(before, value)
    return before + value


def _drive(labels: dict[str, str]) -> dict[str, str]:
    """A worker's cache directory (``DRIVE/worker-K``) as the drive it is on."""
    if "dir" in labels:
        labels = {**labels, "dir": _WORKER_DIR.sub("", labels["dir"])}
    return labels


def _exposed(family: str, kind: str) -> str:
    # The parser names counter families without their _total suffix.
    return f"{family}_total" if kind == "counter" and not family.endswith("_total") else family


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{name}="{_escape_value(value)}"' for name, value in labels)
    return "{" + inner + "}"


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_value(text: str) -> str:
    return _escape(text).replace('"', '\\"')


def _number(value: float) -> str:
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]
