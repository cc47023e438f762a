"""What /_lota/metrics and the access log say, checked against what real clients received.

Each test has a node of its own, so nothing but the test moves its counters; the one thing
besides the clients that the node answers between two scrapes is the first scrape itself.
"""

from __future__ import annotations

import os
import re
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from prometheus_client.parser import text_string_to_metric_families

from lota.testing.credentials import PRINCIPALS
from lota.testing.processes import LotaProcess, aws_cli
from tests.conftest import client_for

MiB = 1024 * 1024
READS = ("GetObject", "HeadObject")


@pytest.fixture
def node(origin: str, credentials_file: Path, tmp_path: Path) -> Iterator[LotaProcess]:
    """A node of its own, with 1 MiB chunks so that a few MiB are a multi-chunk object."""
    config = tmp_path / "lota.toml"
    config.write_text(
        f'[cache]\ndirs = ["{tmp_path / "cache"}"]\nsize = "1GiB"\nchunk_size = "1MiB"\n'
        f'[auth]\nmode = "sigv4"\ncredentials = "{credentials_file}"\n'
        f'[regions.us-east]\nendpoint = "{origin}"\n'
    )
    lota = LotaProcess(["--config", str(config)], log_path=tmp_path / "lota.log").start()
    yield lota
    lota.stop()


class Scrape:
    """One read of /_lota/metrics."""

    def __init__(self, node: LotaProcess) -> None:
        self.text = node.metrics()
        self.size = len(self.text.encode())
        self.samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(self.text)
            for s in family.samples
        }

    def value(self, name: str, **labels: str) -> float:
        return self.samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before: Scrape, after: Scrape, name: str, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)


class Seen:
    """What a boto3 client was answered: the x-lota-cache header of each GetObject and
    HeadObject response, the body bytes of non-streamed responses (streamed ones are
    counted by whoever reads them) and the body bytes of every request it sent."""

    def __init__(self, client: Any) -> None:
        self.sources: Counter[str] = Counter()
        self.body_bytes = 0
        self.sent_bytes = 0
        client.meta.events.register("before-parse.s3.*", self._answered)
        client.meta.events.register("before-send.s3.*", self._sending)

    def _answered(self, operation_model: Any, response_dict: dict[str, Any], **_: Any) -> None:
        if operation_model.name in READS:
            self.sources[response_dict["headers"].get("x-lota-cache", "")] += 1
        if isinstance(response_dict["body"], bytes):
            self.body_bytes += len(response_dict["body"])

    def _sending(self, request: Any, **_: Any) -> None:
        self.sent_bytes += int(header(request, "Content-Length") or 0)


def header(request: Any, name: str) -> str:
    value = request.headers.get(name, "")
    return value.decode() if isinstance(value, bytes) else str(value)


def aws(node: LotaProcess, home: Path, *args: str) -> str:
    """Run the AWS CLI with --debug as admin; returns its log (botocore's, on stderr)."""
    return aws_cli(node.url, home, "--debug", *args)[1]


def cli_sources(debug_log: str) -> Counter[str]:
    """The x-lota-cache headers of the responses the AWS CLI logged (it logs every one)."""
    headers = re.findall(r"Response headers: (\{.*\})", debug_log)
    return Counter(re.search(r"'x-lota-cache': '(\w+)'", h)[1] for h in headers)  # type: ignore[index]


def read_until_hit(s3: Any, bucket: str, key: str, **kw: Any) -> int:
    """Read until a HIT (the read right after a miss may still follow the fill); returns
    the body bytes of all those reads."""
    received = 0
    for _ in range(40):
        got = s3.get_object(Bucket=bucket, Key=key, **kw)
        received += len(got["Body"].read())
        if got["ResponseMetadata"]["HTTPHeaders"]["x-lota-cache"] == "HIT":
            return received
        time.sleep(0.05)
    raise AssertionError(f"{key} never became a hit")


def test_bytes_out_is_every_body_byte_received_hits_sendfile_fills_ranges_relays_and_cli(
    node: LotaProcess, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    origin_s3.put_object(Bucket=bucket, Key="big", Body=os.urandom(20 * MiB + 7))
    origin_s3.put_object(Bucket=bucket, Key="small", Body=os.urandom(1000))
    origin_s3.put_object(Bucket=bucket, Key="cli", Body=os.urandom(10 * MiB + 3))
    s3 = client_for(node.url)
    seen = Seen(s3)
    before = Scrape(node)
    received = len(s3.get_object(Bucket=bucket, Key="big")["Body"].read())  # cold: a fill
    received += read_until_hit(s3, bucket, "big")  # warm 1 MiB chunks go out with sendfile
    received += read_until_hit(s3, bucket, "small")  # a small hit, sent inline
    ranged = s3.get_object(Bucket=bucket, Key="big", Range="bytes=100-2000000")
    received += len(ranged["Body"].read())
    s3.list_objects_v2(Bucket=bucket)  # passed through to the origin
    s3.head_object(Bucket=bucket, Key="big")
    for n in range(2):  # HEAD, then ranged GETs: cold, then warm
        aws(node, tmp_path, "s3", "cp", f"s3://{bucket}/cli", str(tmp_path / f"cli-{n}"))
        received += (tmp_path / f"cli-{n}").stat().st_size
    after = Scrape(node)
    assert seen.body_bytes > 0  # the listing
    sent = received + seen.body_bytes + before.size
    assert delta(before, after, "lota_bytes_out_total") == sent


def test_bytes_in_is_every_body_byte_sent_single_put_and_multipart(
    node: LotaProcess, bucket: str, tmp_path: Path
) -> None:
    s3 = client_for(node.url)
    seen = Seen(s3)
    before = Scrape(node)
    s3.put_object(Bucket=bucket, Key="one", Body=os.urandom(3 * MiB + 5))
    (tmp_path / "up").write_bytes(os.urandom(9 * MiB))
    s3.upload_file(str(tmp_path / "up"), bucket, "multi")  # above 8 MiB: a multipart upload
    after = Scrape(node)
    assert seen.sent_bytes > 12 * MiB
    assert delta(before, after, "lota_bytes_in_total") == seen.sent_bytes


def test_source_counters_agree_with_x_lota_cache_aws_cli_head_then_ranged_gets_of_cold_object(
    node: LotaProcess, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    # The AWS CLI HEADs first (the metadata is cached: MISS), then GETs 8 MiB ranges whose
    # chunks are not cached yet: each of those says MISS, and must be counted MISS.
    origin_s3.put_object(Bucket=bucket, Key="cold", Body=os.urandom(30 * MiB))
    origin_s3.put_object(Bucket=bucket, Key="other", Body=os.urandom(3 * MiB))
    before = Scrape(node)
    seen = cli_sources(aws(node, tmp_path, "s3", "cp", f"s3://{bucket}/cold", str(tmp_path / "c")))
    assert seen["MISS"] >= 2 and seen.total() >= 5, seen  # HEAD + 4 GETs at least
    s3 = client_for(node.url)
    boto = Seen(s3)
    s3.head_object(Bucket=bucket, Key="other")
    s3.get_object(Bucket=bucket, Key="other", Range="bytes=0-1023")["Body"].read()
    s3.get_object(Bucket=bucket, Key="other", Range=f"bytes={2 * MiB}-")["Body"].read()
    read_until_hit(s3, bucket, "other", Range="bytes=0-1023")
    with pytest.raises(s3.exceptions.ClientError, match="InvalidRange"):
        s3.get_object(Bucket=bucket, Key="other", Range=f"bytes={4 * MiB}-")  # no header
    with pytest.raises(s3.exceptions.NoSuchKey):
        s3.get_object(Bucket=bucket, Key="missing")  # the origin's 404, relayed: MISS
    seen.update(boto.sources)
    seen.pop("", None)  # answers without the header are not counted by source
    after = Scrape(node)
    counted = {
        source: delta(before, after, "lota_cache_requests_total", source=source)
        for source in ("HIT", "PEER", "MISS", "STALE", "BYPASS", "PENDING")
    }
    assert counted == {source: seen.get(source, 0) for source in counted}
    timed = {
        source: delta(before, after, "lota_cache_request_seconds_count", source=source)
        for source in counted
    }
    assert timed == counted


def access_lines(node: LotaProcess, count: int, containing: str = "") -> list[str]:
    """The node's access log, once it holds `count` lines with `containing` in them (it is
    written in batches, so waiting for a number of lines alone can return too early)."""
    for _ in range(100):
        lines = [line for line in node.log_path.read_text().splitlines() if " lota.access " in line]
        if len([line for line in lines if containing in line]) >= count:
            return lines
        time.sleep(0.05)
    raise AssertionError(f"only {len(lines)} access lines:\n" + "\n".join(lines))


def test_access_log_has_cache_bytes_principal_and_why_auth_failed_never_a_secret(
    node: LotaProcess, origin_s3: Any, bucket: str
) -> None:
    origin_s3.put_object(Bucket=bucket, Key="k", Body=b"x" * 1000)
    admin, reader = client_for(node.url), client_for(node.url, "reader")
    signatures: list[str] = []
    for client in (admin, reader):
        client.meta.events.register(
            "before-send.s3.*",
            lambda request, **_: signatures.append(
                header(request, "Authorization").rsplit("Signature=", 1)[1]
            ),
        )
    admin.get_object(Bucket=bucket, Key="k")["Body"].read()
    read_until_hit(admin, bucket, "k")
    admin.put_object(Bucket=bucket, Key="up", Body=b"y" * 1234)
    with pytest.raises(reader.exceptions.ClientError, match="AccessDenied"):
        reader.put_object(Bucket=bucket, Key="denied", Body=b"z")
    key, secret, _ = PRINCIPALS["reader"]
    for key_id, wrong in ((key, "not-" + secret), ("AKIANOBODY000000001", secret)):
        stranger = boto3.client(
            "s3",
            endpoint_url=node.url,
            aws_access_key_id=key_id,
            aws_secret_access_key=wrong,
            region_name="us-east-1",
        )
        with pytest.raises(stranger.exceptions.ClientError):
            stranger.get_object(Bucket=bucket, Key="k")
    urls = [  # boto3's default presigns with SigV2 (Signature=), the other with SigV4
        s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"})
        for s3 in (admin, client_for(node.url, signature_version="s3v4"))
    ]
    for url in urls:
        with urllib.request.urlopen(url) as r:
            assert r.read() == b"x" * 1000
    presigned = [re.search(r"Signature=([^&]+)", url)[1] for url in urls]  # type: ignore[index]
    lines = access_lines(node, 2, containing="Signature=")  # the presigned reads come last
    log = "\n".join(lines)

    def matching(pattern: str) -> list[str]:
        found = [x for x in lines if re.search(pattern, x)]
        assert found, f"no access line like {pattern!r}:\n{log}"
        return found

    reads = matching(r'"GET /[^ ]+/k" 200 GetObject ')
    assert " cache=MISS out=1000 in=0 principal=admin" in reads[0]
    assert " cache=HIT out=1000 in=0 principal=admin" in reads[-1]
    assert " cache=BYPASS out=0 in=1234 principal=admin" in matching(" 200 PutObject ")[0]
    assert " principal=reader err=AccessDenied" in matching(r"/denied\" 403 PutObject ")[0]
    assert re.search(" 403 GetObject .* principal=- err=SignatureDoesNotMatch$", log, re.M)
    assert re.search(" 403 GetObject .* principal=- err=InvalidAccessKeyId$", log, re.M)
    for signed in matching(r"[?&](X-Amz-)?Signature="):
        assert " 200 GetObject " in signed and " principal=admin" in signed
    for secret_text in [s for _, s, _ in PRINCIPALS.values()] + signatures + presigned:
        assert secret_text not in log
    assert "Authorization" not in log and "AWS4-HMAC-SHA256 Credential" not in log
