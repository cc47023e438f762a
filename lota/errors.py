"""Every exception LOTA raises on purpose, as one tree under :class:`LotaError`.

::

    LotaError                       anything LOTA raises on purpose
    ├── ConfigError                 the configuration is invalid; the message names the setting
    │                               (``lota`` prints "configuration error: ..." and exits 2)
    ├── StartupError                LOTA cannot start (a held cache directory, a port in use,
    │                               the embedded origin); ``lota`` prints it and exits 2
    ├── S3Error                     lota.s3.errors: answered to the client as S3 XML, status +
    │   │                           Code + Message from the one table of S3 codes there
    │   ├── Refused                 lota.auth: an authentication or authorization failure,
    │   │                           naming the operation and principal for the access log
    │   └── PeerRefused             lota.cluster.signing: a peer request not signed with the
    │                               cluster secret, out of its time window, or replayed
    ├── OriginError                 the origin could not be reached, or broke off mid-stream:
    │                               a 503 ServiceUnavailable, or an aborted response
    ├── PeerError                   lota.cluster.peers: another node of the cluster could not
    │                               be reached or did not answer in time; the next owner, then
    │                               the origin, is asked
    ├── BodyFailed                  lota.regions.origin: the source of a request body failed
    │                               (not the origin); marks aiohttp's exception chain so
    │                               OriginClient re-raises the cause: never leaves that module
    ├── CatalogError                a catalog operation failed (bad URL, SQL error, closed)
    │   ├── CatalogUnavailable      unreachable or locked too long: transient, a 503
    │   ├── CatalogVersionError     the database's schema is newer than this LOTA
    │   └── StagingSwept            a commit named a staging copy the orphan sweep took: the
    │                               write fails unacknowledged (a 503, retried)
    ├── CacheError                  lota.cache.store: the store cannot serve or open; the
    │   │                           request passes through to the origin
    │   ├── CacheDirInUse           another process holds a cache directory's lock
    │   └── CacheWriteError         a chunk could not be written; its writer is aborted
    ├── CacheFull                   lota.cache.fill: a fill stopped, the store took no more
    │   └── ChunkDeclined           the admission rule does not keep its next chunk
    ├── ChunkDamaged                lota.cache.files: a chunk file is short or fails its digest
    ├── DirLocked                   lota.cache.files: a cache directory's lock is held
    ├── ChunkUnreadable             lota.cache.deliver: a cached chunk failed mid-send (also
    │                               an OSError, which is how the delivery path catches it)
    ├── SourceBroke                 lota.cache.source: a peer's body broke off; the relay
    │                               resumes from the next owner or the origin
    ├── ObjectChanged               lota.cache.reads: the origin's object is not the cached one
    ├── NotModified                 lota.s3.conditions: the client's copy is current, answer 304
    ├── Superseded                  lota.regions.home: a newer version of the key was committed;
    │                               the one being migrated need not go home
    ├── Fenced                      lota.regions.home: the home origin refused a conditional
    │                               write (a newer version landed); retried
    ├── LeaseLost                   the lifecycle lease ran out or another node took it
    ├── WarmFailed                  ``lota warm`` did not complete; the message is its last line
    └── OriginStartError            the embedded origin (moto) did not start

An exception whose module is named is defined there, next to the code that raises it;
the others are defined here (and re-exported where most code imports them:
:mod:`lota.s3.errors` has LotaError and OriginError, :mod:`lota.config` ConfigError and
StartupError, :mod:`lota.catalog` the catalog's). Private control-flow signals stay
private and outside the tree: ``lota.s3.xml._Refused`` (a DOCTYPE, refused mid-parse) and
``lota.testing.wan._Reset`` (the test WAN emulator tears a connection down).

Foreign exceptions are translated once, where they enter (``raise OriginError(...) from
exc``); ``asyncio.CancelledError`` is never caught.
"""

from __future__ import annotations


class LotaError(Exception):
    """Base of every error LOTA raises on purpose."""


class ConfigError(LotaError):
    """The configuration is invalid; the message says which setting and why."""


class StartupError(LotaError):
    """LOTA cannot start: the message is the whole line ``lota`` prints (after ``lota: ``)
    before it exits with status 2, e.g. a cache directory another process holds."""


class OriginError(LotaError):
    """The origin could not be reached, or a response from it broke off."""


class CatalogError(LotaError):
    """A catalog operation failed: a bad URL, a database error, a closed catalog."""


class CatalogUnavailable(CatalogError):
    """The database cannot be reached or stayed locked too long. Transient: retry later."""


class CatalogVersionError(CatalogError):
    """The database's schema is newer than this LOTA knows: upgrade LOTA, never downgrade."""


class StagingSwept(CatalogError):
    """A write's staging copy was swept as an orphan before it was committed: the write
    fails (unacknowledged) and the client retries."""


class LeaseLost(LotaError):
    """Another node holds the lifecycle lease now; this run must stop."""


class WarmFailed(LotaError):
    """The warm did not complete; the message is the line the command prints."""


class OriginStartError(LotaError):
    """moto could not be started or did not answer in time; the message ends with its log tail."""
