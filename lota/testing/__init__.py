"""Harness for tests, benchmarks and the demo; nothing here runs when LOTA serves real traffic.

- :mod:`lota.testing.cachesim`: the cache store's keep-and-evict decisions, simulated with
  its own policy classes (the admission unit tests and ``bench.admission``).
- :mod:`lota.testing.credentials`: the fixed test principals (keys, secrets, policies) and
  a credentials file made from them.
- :mod:`lota.testing.processes`: ``lota serve`` as a subprocess (:class:`LotaProcess`), the
  AWS CLI run against a node, a free loopback port.
- :mod:`lota.testing.node`: a node served in this process, for tests that need no subprocess.
- :mod:`lota.testing.tls`: a client TLS context that trusts any certificate (test nodes use
  throw-away self-signed ones).
- :mod:`lota.testing.wan`: an emulated WAN link (latency, bandwidth) in front of an origin.

The embedded origin behind ``lota serve --embedded-origin`` (:mod:`lota.embedded`) is the one
shipped feature that uses this package: it puts :class:`lota.testing.wan.WanLink` in front
of moto when asked for a latency or a bandwidth. Import the modules themselves; this
``__init__`` stays empty so that importing one does not import the rest.
"""
