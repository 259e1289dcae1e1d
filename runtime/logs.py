"""Log records with the tablet, computation and key they are about, and one JSON object per line
(``millstream master|worker|up --log-format json``) for Loki, Elasticsearch and the like.

Library code only logs (``logging.getLogger(__name__)``); the command line installs the handler
(cli/main.py), with :class:`ContextFilter` and, for JSON, :class:`JsonFormatter`. The fields come,
first found first:

1. ``extra={"tablet": ..., "computation": ..., "key": ...}`` on the log call;
2. :func:`log_context`, set around work on one tablet or key (a context variable: each thread
   and each asyncio task sees its own);
3. what the message itself says, in the words the runtime's messages use: ``tablet counter/3``
   (or ``tablet counter/3:``), ``copy of counter/3``, ``key 'apple'``;
4. the thread: a tablet's user code runs on a thread named ``tablet counter/3``.
"""

from __future__ import annotations

import json
import logging
import re
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

FIELDS = ("tablet", "computation", "key")
_context: ContextVar[dict[str, str]] = ContextVar("millstream_log_context", default={})  # noqa: B039 (never mutated)
_TABLET = re.compile(r"\b(?:tablet|copy of|tablets? of) ([A-Za-z0-9_.\-]+)/(\d+)\b")
_KEY = re.compile(r"\bkey (b?'(?:[^'\\]|\\.)*'|b?\"(?:[^\"\\]|\\.)*\")")


@contextmanager
def log_context(**fields: str) -> Iterator[None]:
    """Records logged inside the block carry ``fields`` (``tablet=``, ``computation=``, ``key=``)."""
    token = _context.set({**_context.get(), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def fields_of(message: str) -> dict[str, str]:
    """The tablet, computation and key a runtime message names (see the module doc)."""
    found: dict[str, str] = {}
    m = _TABLET.search(message)
    if m:
        found["tablet"] = f"{m.group(1)}/{m.group(2)}"
        found["computation"] = m.group(1)
    k = _KEY.search(message)
    if k:
        text = k.group(1)
        found["key"] = text[2:-1] if text.startswith("b") else text[1:-1]
    return found


class ContextFilter(logging.Filter):
    """Sets ``tablet``, ``computation`` and ``key`` on every record, None where not known. Each
    source fills only what the ones before it left open; a tablet's computation is its own
    (``counter`` of ``counter/3``) unless one was given."""

    def filter(self, record: logging.LogRecord) -> bool:
        values: dict[str, Any] = {f: getattr(record, f, None) for f in FIELDS}

        def take(source: dict[str, str]) -> None:
            for f in FIELDS:
                if values[f] is None and source.get(f) is not None:
                    values[f] = source[f]
            if values["computation"] is None and values["tablet"]:
                values["computation"] = str(values["tablet"]).rpartition("/")[0]

        take({})
        take(_context.get())
        if None in values.values():
            try:
                take(fields_of(record.getMessage()))
            except Exception:  # a message its arguments do not fit: logging reports that itself
                pass
        if values["tablet"] is None and record.threadName:  # a tablet's own thread: "tablet c/3"
            take({k: v for k, v in fields_of(record.threadName).items() if k != "key"})
        for f, value in values.items():
            setattr(record, f, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``,
    ``process``, ``thread``, the fields of :class:`ContextFilter` that are known, and
    ``exception`` (the formatted traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
            "thread": record.threadName,
        }
        for f in FIELDS:
            value = getattr(record, f, None)
            if value is not None:
                doc[f] = value if isinstance(value, str) else str(value)
        if record.exc_info:
            doc["exception"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return json.dumps(doc, ensure_ascii=False)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def handler(stream: Any, log_format: str) -> logging.Handler:
    """A stream handler writing ``log_format`` ("text" or "json") with the fields filled in (for
    the command line: library code installs no handlers)."""
    if log_format not in ("text", "json"):
        raise ValueError(f"log format {log_format!r}: use 'text' or 'json'")
    h = logging.StreamHandler(stream)
    h.addFilter(ContextFilter())
    h.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    return h
