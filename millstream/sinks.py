"""Exactly-once sinks: :class:`Sink`, the contract a sink implements (its output committed
with the batch that made it), :class:`FileSink` (JSON lines, one file per tablet) and
:func:`read_file_sink` (what a ``FileSink`` wrote, safe while the job runs). Implemented in
``runtime.sinks``; docs/guide.md, "Writing a sink", says how to write one."""

from runtime.sinks import FileSink, Sink, read_file_sink

__all__ = ["FileSink", "Sink", "read_file_sink"]
