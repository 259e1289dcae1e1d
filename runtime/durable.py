"""Making a rename durable: after ``os.replace`` or ``os.rename`` into a directory, the
directory itself is synced, or a power loss may forget the rename (and keep the old file or
none). One helper for every place that renames into place (state directories, tablets,
split builds, replicas, the Parquet sink)."""

from __future__ import annotations

import os


def sync_dir(path: str) -> None:
    """Make the renames in directory ``path`` durable."""
    fd = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
