"""`--log-format json` (runtime/logs.py): one JSON object per line with the tablet, computation and
key a record is about, from `extra=`, from a log context, or from the message's own words."""

from __future__ import annotations

import io
import json
import logging
import threading

import pytest

from runtime.logs import ContextFilter, JsonFormatter, fields_of, handler, log_context


def _logged(fmt: str, emit: object) -> list[str]:
    out = io.StringIO()
    log = logging.getLogger(f"millstream.test.{fmt}.{id(emit)}")
    log.propagate = False
    log.setLevel(logging.DEBUG)
    h = handler(out, fmt)
    log.addHandler(h)
    try:
        emit(log)  # type: ignore[operator]
    finally:
        log.removeHandler(h)
    return out.getvalue().splitlines()


@pytest.mark.parametrize("message, fields", [
    ("tablet counter/3 closed (token 7)", {"tablet": "counter/3", "computation": "counter"}),
    ("tablet wc.counts_sink/12: follower w2 is 3 MiB behind", {"tablet": "wc.counts_sink/12",
                                                              "computation": "wc.counts_sink"}),
    ("follower copy of splitter/0 deleted", {"tablet": "splitter/0", "computation": "splitter"}),
    ("tablet counter/1: user code for key 'apple pie' took 2.0 s",
     {"tablet": "counter/1", "computation": "counter", "key": "apple pie"}),
    ("tablet c/0: dead-lettering a record of key 'it\\'s' after 3 failures", {"tablet": "c/0", "computation": "c",
                                                                              "key": "it\\'s"}),
    ("leading: 2 topologies, 3 workers, 8 tablets", {}),
])
def test_the_fields_a_message_names(message: str, fields: dict[str, str]) -> None:
    assert fields_of(message) == fields


def test_json_lines_carry_the_fields_from_extra_then_context_then_message() -> None:
    def emit(log: logging.Logger) -> None:
        log.info("tablet %s/%d open under token %d", "counter", 2, 5)
        with log_context(tablet="splitter/1", key="k1"):
            log.warning("a batch took %d s", 3)
            log.info("tablet counter/0 closed", extra={"key": "given"})  # extra wins, then the context
        log.error("plain")

    lines = [json.loads(line) for line in _logged("json", emit)]
    assert [(d["level"], d["message"]) for d in lines] == [
        ("INFO", "tablet counter/2 open under token 5"), ("WARNING", "a batch took 3 s"),
        ("INFO", "tablet counter/0 closed"), ("ERROR", "plain")]
    assert [(d.get("tablet"), d.get("computation"), d.get("key")) for d in lines] == [
        ("counter/2", "counter", None), ("splitter/1", "splitter", "k1"), ("splitter/1", "splitter", "given"),
        (None, None, None)]
    assert all(d["time"].endswith("+00:00") and d["logger"].startswith("millstream.test") for d in lines)


def test_an_exception_is_one_json_line_with_its_traceback() -> None:
    def emit(log: logging.Logger) -> None:
        try:
            raise ValueError("bad value\nover two lines")
        except ValueError:
            log.exception("tablet c/0: batch failed")

    lines = _logged("json", emit)
    assert len(lines) == 1
    doc = json.loads(lines[0])
    assert doc["tablet"] == "c/0" and "ValueError: bad value\nover two lines" in doc["exception"]


def test_the_context_is_per_thread() -> None:
    seen: list[object] = []

    def other() -> None:
        record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", (), None)
        ContextFilter().filter(record)
        seen.append(record.tablet)  # type: ignore[attr-defined]

    with log_context(tablet="a/1"):
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen == [None]


def test_a_tablets_thread_names_the_tablet() -> None:
    seen: list[tuple[object, object]] = []

    def on_tablet_thread() -> None:
        record = logging.LogRecord("x", logging.INFO, __file__, 1, "a slow commit", (), None)
        ContextFilter().filter(record)
        seen.append((record.tablet, record.computation))  # type: ignore[attr-defined]

    t = threading.Thread(target=on_tablet_thread, name="tablet counter/5")
    t.start()
    t.join()
    assert seen == [("counter/5", "counter")]


def test_text_stays_the_default_format_and_a_bad_format_is_refused() -> None:
    lines = _logged("text", lambda log: log.info("tablet c/0 open"))
    assert len(lines) == 1 and " INFO millstream.test." in lines[0] and lines[0].endswith(": tablet c/0 open")
    with pytest.raises(ValueError, match="use 'text' or 'json'"):
        handler(io.StringIO(), "xml")


def test_a_message_its_arguments_do_not_fit_does_not_break_the_filter() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "tablet %s/%d", ("c",), None)
    assert ContextFilter().filter(record) and record.tablet is None  # type: ignore[attr-defined]
    assert JsonFormatter is not None
