"""Regions: the origin client per region (later: catalog, write acceleration, migrator)."""
