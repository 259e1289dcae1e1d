"""millstream: MillWheel-style stream processing in Python.

The user API: write a :class:`Computation`, wire computations into a
:class:`Topology`, and :func:`connect` to the masters to submit it.
"""

from runtime import codecs
from runtime.client import Client, connect
from runtime.computation import Computation, Context, State, TimeDomain
from runtime.errors import MillstreamError
from runtime.record import Record
from runtime.sinks import Sink
from runtime.state import ListState, MapState, ValueState
from runtime.topology import Topology

__all__ = [
    "Client",
    "Computation",
    "Context",
    "ListState",
    "MapState",
    "MillstreamError",
    "Record",
    "Sink",
    "State",
    "TimeDomain",
    "Topology",
    "ValueState",
    "codecs",
    "connect",
]
