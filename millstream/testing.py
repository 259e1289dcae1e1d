"""The test kit: :class:`TestRun` runs a topology in this process on virtual time, with the
real worker inside (no etcd, no network). Implemented in ``runtime.testing``."""

from runtime.testing import TestRun

__all__ = ["TestRun"]
