"""millstream: MillWheel-style stream processing in Python.

The user API: say a job as a :class:`Dataflow` of steps (map, filter, key_by, reduce,
window, join, ...), or write :class:`Computation` classes and wire them into a
:class:`Topology`; :func:`connect` to the masters to submit either.
"""

from runtime import codecs
from runtime.client import Client, connect
from runtime.computation import Computation, Context, State, TimeDomain
from runtime.dataflow import Dataflow, KeyedStream, Stream
from runtime.errors import MillstreamError
from runtime.record import Record
from runtime.sinks import Sink
from runtime.state import ListState, MapState, ValueState
from runtime.topology import Topology

__all__ = [
    "Client",
    "Computation",
    "Context",
    "Dataflow",
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
    "codecs",
    "connect",
]
