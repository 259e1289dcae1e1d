"""Event-time windows: ``Tumbling``, ``Sliding`` and ``Session`` with allowed lateness, the
``Count``, ``Sum``, ``Min``, ``Max``, ``Mean`` and ``Collect`` aggregators, a window's
result (``WindowResult``), and :class:`WindowedComputation`, which fires each window once.
Implemented in ``runtime.windows`` (its module documentation says how windows fire)."""

from runtime.windows import (
    SECOND,
    Aggregator,
    Collect,
    Count,
    Max,
    Mean,
    Min,
    Session,
    Sliding,
    Sum,
    Tumbling,
    WindowedComputation,
    WindowResult,
)

__all__ = ["SECOND", "Aggregator", "Collect", "Count", "Max", "Mean", "Min", "Session", "Sliding", "Sum",
           "Tumbling", "WindowResult", "WindowedComputation"]
