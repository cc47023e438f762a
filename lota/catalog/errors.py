"""The catalog's errors; the tree is drawn in the package docstring (:mod:`lota.catalog`)."""

from __future__ import annotations

from lota.s3.errors import LotaError


class CatalogError(LotaError):
    """A catalog operation failed: a bad URL, a database error, a closed catalog."""


class CatalogUnavailable(CatalogError):
    """The database cannot be reached or stayed locked too long. Transient: retry later."""


class CatalogVersionError(CatalogError):
    """The database's schema is newer than this LOTA knows: upgrade LOTA, never downgrade."""
