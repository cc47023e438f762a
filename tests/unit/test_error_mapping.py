"""Failures that must reach the client as the S3 errors it can act on, never as a 500."""

from __future__ import annotations

import base64
import json
import xml.etree.ElementTree as ET

import pytest

from lota.errors import CatalogError, CatalogUnavailable, OriginError
from lota.node.errors import as_s3_error
from lota.regions.uploads import UPLOAD_ID_TAG, decode_upload_id, encode_upload_id
from lota.s3.errors import S3Error


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (CatalogUnavailable("database locked"), 503, "ServiceUnavailable"),
        (OriginError("connection refused"), 503, "ServiceUnavailable"),
        (CatalogError("schema broken"), 500, "InternalError"),
        (S3Error("NoSuchKey", "gone", status=404), 404, "NoSuchKey"),
    ],
)
def test_failures_map_to_s3_errors(exc: Exception, status: int, code: str) -> None:
    error = as_s3_error(exc, "R1")
    assert (error.status, error.code) == (status, code)


def _forged(data: object) -> str:
    raw = base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")
    return UPLOAD_ID_TAG + raw


@pytest.mark.parametrize(
    "upload_id",
    [
        _forged({"k": "x", "u": "y", "h": ["not", "a", "map"]}),
        _forged({"k": "x", "u": "y", "h": "text"}),
        _forged(["k", "u", "h"]),
        _forged({"k": "x"}),
        UPLOAD_ID_TAG + "%%%not-base64",
        "someone-elses-upload",
    ],
)
def test_an_unreadable_upload_id_is_no_such_upload(upload_id: str) -> None:
    with pytest.raises(S3Error) as err:
        decode_upload_id(upload_id)
    assert (err.value.status, err.value.code) == (404, "NoSuchUpload")


def test_upload_ids_round_trip() -> None:
    upload_id = encode_upload_id("lota-staging/k", "u-1", {"Content-Type": "text/plain"})
    assert decode_upload_id(upload_id) == (
        "lota-staging/k",
        "u-1",
        {"content-type": "text/plain"},
        "",
    )


def test_an_error_echoing_what_xml_cannot_carry_still_parses() -> None:
    """A request path may hold control characters (``/%00``) and bytes that are not UTF-8;
    the error that echoes it is still well-formed XML, and says what was sent."""
    error = S3Error(
        "InvalidBucketName",
        "The specified bucket is not valid: \x01",
        resource="/\x00/\udcff\ufffe&<",
        extra={"BucketName": "\x1f"},
    )
    root = ET.fromstring(error.to_xml("R1"))
    assert root.findtext("Resource") == "/%00/%FF\ufffd&<"
    assert root.findtext("Message") == "The specified bucket is not valid: %01"
    assert root.findtext("BucketName") == "%1F"
