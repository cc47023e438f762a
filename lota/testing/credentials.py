"""The fixed principals of tests, benchmarks and the demo: their access keys, secrets and
policies, and a credentials file for ``lota serve --credentials`` made from them.

These secrets are public (they are in this file): use them only for nodes a test started.
"""

from __future__ import annotations

from pathlib import Path

ADMIN_POLICY = '{"Statement":[{"Effect":"Allow","Action":"s3:*","Resource":"*"}]}'
READER_POLICY = '{"Statement":[{"Effect":"Allow","Action":["s3:Get*","s3:List*"],"Resource":"*"}]}'
# Everything, except writing or deleting under protected/ in any bucket.
GUARDED_POLICY = (
    '{"Statement":['
    '{"Effect":"Allow","Action":"s3:*","Resource":"*"},'
    '{"Effect":"Deny","Action":["s3:PutObject","s3:DeleteObject"],'
    '"Resource":"arn:aws:s3:::*/protected/*"}]}'
)
# Key-scoped grants, as in issue #10: reads under public/ except public/private.bin, deletes
# only under alpha/scratch/, writes anywhere.
SCOPED_POLICY = (
    '{"Statement":['
    '{"Effect":"Allow","Action":["s3:PutObject","s3:ListBucket","s3:AbortMultipartUpload"],'
    '"Resource":"*"},'
    '{"Effect":"Allow","Action":["s3:GetObject","s3:GetObjectVersion"],'
    '"Resource":"arn:aws:s3:::*/public/*"},'
    '{"Effect":"Deny","Action":["s3:GetObject","s3:GetObjectVersion"],'
    '"Resource":"arn:aws:s3:::*/public/private.bin"},'
    '{"Effect":"Allow","Action":"s3:DeleteObject","Resource":"arn:aws:s3:::*/alpha/scratch/*"}]}'
)
PRINCIPALS = {
    "admin": ("AKIAADMIN0000000001", "admin-secret-0000000000000000000000000", ADMIN_POLICY),
    "reader": ("AKIAREADER000000001", "reader-secret-000000000000000000000000", READER_POLICY),
    "guarded": ("AKIAGUARDED00000001", "guarded-secret-00000000000000000000000", GUARDED_POLICY),
    "scoped": ("AKIASCOPED000000001", "scoped-secret-000000000000000000000000", SCOPED_POLICY),
}
ORIGIN_KEYS = {"AWS_ACCESS_KEY_ID": "lota-origin", "AWS_SECRET_ACCESS_KEY": "lota-origin-secret"}


def write_credentials(path: Path) -> Path:
    entries = []
    for name, (key, secret, policy) in PRINCIPALS.items():
        entries.append(
            f'[[principal]]\nname = "{name}"\naccess_key_id = "{key}"\n'
            f"secret_access_key = \"{secret}\"\npolicy = '{policy}'\n"
        )
    path.write_text("\n".join(entries))
    return path
