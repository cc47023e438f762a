"""LOTA: an S3-compatible caching proxy for GPU clusters."""

__version__ = "0.1.0"
