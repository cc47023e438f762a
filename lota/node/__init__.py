"""The node: one composition root, its lifecycle, and the front end that answers requests.

::

    build.py         build_node(config): constructs every part, opens them in order and
                     closes them in reverse; build_cache and build_catalog
    node.py          Node: start serving, drain, stop (and Drain, the state they share)
    serve.py         serve(config): what `lota serve` runs
    front.py         the request handler: admin? → parse → auth → route; metrics, access log
    admin.py         the /_lota/ calls: healthz, readyz, metrics, warm, lifecycle rules,
                     migrations
    invalidation.py  dropping the cached copies a write makes stale, here and elsewhere
    features.py      the cache and the catalog as always-present objects, on or off
    listener.py      aiohttp's low-level server, its own errors as S3 XML; TLS
    errors.py        how a failure becomes an S3 answer
    requests.py      per-request context and request ids

Which origin serves a bucket is :class:`lota.regions.origins.Origins`' answer.
"""
