"""millstream: MillWheel-style distributed stream processing in Python.

The one import of the user API::

    from millstream import Dataflow, Computation, Context, Record, Topology, ValueState, codecs, connect
    from millstream.windows import SECOND, Count, Tumbling, WindowedComputation
    from millstream.sinks import FileSink
    from millstream.testing import TestRun

Everything here is re-exported from the packages that implement it (``runtime`` for the user
API and the test kit, ``injectors`` for :class:`Injector`); those stay importable under their
own names. ``__all__`` is pinned by ``tests/unit/test_exports.py``, which also checks that every
name ``runtime`` exports is exported here: a name added to ``runtime.__all__`` is added below too.
"""

from importlib import metadata as _metadata

from injectors import Injector
from millstream import codecs, sinks, testing, windows
from runtime import (
    Client,
    Computation,
    Context,
    Dataflow,
    KeyedStream,
    ListState,
    MapState,
    MillstreamError,
    Record,
    Sink,
    State,
    Stream,
    TimeDomain,
    Topology,
    ValueState,
    connect,
)


def _version() -> str:
    try:
        return _metadata.version("millstream")
    except _metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
        return "0+unknown"


__version__ = _version()

__all__ = [
    "Client",
    "Computation",
    "Context",
    "Dataflow",
    "Injector",
    "KeyedStream",
    "ListState",
    "MapState",
    "MillstreamError",
    "Record",
    "Sink",
    "State",
    "Stream",
    "TimeDomain",
    "Topology",
    "ValueState",
    "__version__",
    "codecs",
    "connect",
    "sinks",
    "testing",
    "windows",
]
