"""Event-time windows: ``Tumbling``, ``Sliding`` and ``Session`` with allowed lateness, the
``Count`` and ``Sum`` aggregators, and :class:`WindowedComputation`, which fires each window
once. Implemented in ``runtime.windows`` (its module documentation says how windows fire)."""

from runtime.windows import SECOND, Aggregator, Count, Session, Sliding, Sum, Tumbling, WindowedComputation

__all__ = ["SECOND", "Aggregator", "Count", "Session", "Sliding", "Sum", "Tumbling", "WindowedComputation"]
