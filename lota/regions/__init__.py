"""Regions: where buckets live, and writes to far ones that finish at local speed.

- :mod:`~lota.regions.origin`: LOTA's own signed requests to one region's S3 endpoint.
- :mod:`~lota.regions.accelerate`: a write to a bucket homed in a far region lands in the
  local staging area and the catalog (:mod:`lota.catalog`), and is answered at once.
- :mod:`~lota.regions.staging`: that staging area (a local bucket, or a directory).
- :mod:`~lota.regions.migrator`: moves staged writes home, under catalog leases.
- :mod:`~lota.regions.writes`: which requests the catalog decides (accelerated writes, reads
  of versions not yet home); :mod:`~lota.regions.listing` merges pending writes into the
  origin's listing (no I/O).
"""
