"""The Parquet sink's exactly-once file protocol, and reading its output back with types."""

from __future__ import annotations

import os
from typing import Any

import pytest

from runtime.errors import MillstreamError, TopologyError
from runtime.record import Record
from runtime.topology import Topology
from spark_bridge import ParquetSink, ValueDecodeError, add_parquet_sink, read_rows, read_stream
from spark_bridge.read import SinkNotFound

FIELDS = "query:string,n:long,score:double,ok:boolean,at:timestamp"


def _sink(path: str, tablet: str, meta: bytes | None) -> ParquetSink:
    s = ParquetSink()
    s.setup({"path": path, "codec": "json", "fields": FIELDS})
    s.restore(tablet, meta)
    return s


def _rec(i: int) -> Record:
    value = f'{{"query": "q{i}", "n": {i}, "score": {i / 2}, "ok": {str(i % 2 == 0).lower()}, "at": {i * 1000}}}'
    return Record(f"k{i}".encode(), value.encode(), 1_700_000_000_000_000 + i, bytes(16))


def _batch(sink: ParquetSink, ids: range) -> bytes:
    for i in ids:
        sink.process_record(None, _rec(i))  # type: ignore[arg-type]
    return sink.prepare_commit()


def test_uncommitted_files_are_removed_and_rewritten_under_the_same_name(tmp_path: Any) -> None:
    d = str(tmp_path)
    s = _sink(d, "snk/0", None)
    m1 = _batch(s, range(0, 3))
    other = _sink(d, "snk/1", None)
    _batch(other, range(100, 102))  # another tablet's files are not ours to touch
    _batch(s, range(3, 5))           # written, but the commit never happens (a crash)
    open(os.path.join(d, ".snk-0-0000000000000005.parquet.dead.tmp"), "w").close()
    assert sorted(os.listdir(d)) == [".snk-0-0000000000000005.parquet.dead.tmp", ".snk-1.uncommitted",
                                     "_millstream_sink.json",
                                     "snk-0-0000000000000000.parquet", "snk-0-0000000000000003.parquet",
                                     "snk-1-0000000000000000.parquet"]

    s2 = _sink(d, "snk/0", m1)       # the tablet reopens at the committed meta
    assert sorted(os.listdir(d)) == [".snk-1.uncommitted", "_millstream_sink.json",
                                     "snk-0-0000000000000000.parquet", "snk-1-0000000000000000.parquet"]
    m2 = _batch(s2, range(3, 5))      # the redelivered batch gets the very same file name
    assert "snk-0-0000000000000003.parquet" in os.listdir(d)
    assert m2 == b'{"next": 5, "prefix": "snk-0"}' and s2.prepare_commit() == m2  # an empty batch changes nothing
    rows = read_rows(d)
    assert sorted(r["n"] for r in rows) == [0, 1, 2, 3, 4, 100, 101]
    r3 = next(r for r in rows if r["n"] == 3)
    assert r3["key"] == "k3" and r3["query"] == "q3" and r3["score"] == 1.5 and r3["ok"] is False
    assert r3["timestamp"] == 1_700_000_000_000_003


def test_output_of_an_earlier_cluster_is_left_alone(tmp_path: Any) -> None:
    """No committed meta (a new cluster, a lost state directory) used to delete every file of
    the tablet's name in the directory (review E4)."""
    d = str(tmp_path)
    old = _sink(d, "snk/0", None)
    _batch(old, range(0, 2))
    _batch(old, range(2, 4))  # committed output of an earlier cluster
    before = sorted(n for n in os.listdir(d) if n.endswith(".parquet"))
    new = _sink(d, "snk/0", None)
    assert sorted(n for n in os.listdir(d) if n.endswith(".parquet")) == before
    meta = _batch(new, range(10, 12))
    assert b'"prefix": "snk-0.g1"' in meta
    assert sorted(r["n"] for r in read_rows(d)) == [0, 1, 2, 3, 10, 11]


def test_never_overwrites_a_file(tmp_path: Any) -> None:
    """A writer that lost the tablet may have linked a file since restore: fail, do not overwrite."""
    d = str(tmp_path)
    s = _sink(d, "snk/0", None)
    open(os.path.join(d, "snk-0-0000000000000000.parquet"), "w").write("zombie")
    s.process_record(None, _rec(1))  # type: ignore[arg-type]
    with pytest.raises(MillstreamError, match="already exists but is not committed"):
        s.prepare_commit()
    assert open(os.path.join(d, "snk-0-0000000000000000.parquet")).read() == "zombie"
    assert [n for n in os.listdir(d) if n.endswith(".tmp")] == []
    _sink(d, "snk/0", None)  # reopening removes it
    assert "snk-0-0000000000000000.parquet" not in os.listdir(d)


def test_bad_values_raise_before_anything_is_buffered(tmp_path: Any) -> None:
    s = _sink(str(tmp_path), "snk/0", None)
    for value, match in [(b"not json", "value is not JSON"), (b'{"n": "seven"}', "declared long"),
                         (b"\xff", "not UTF-8")]:
        with pytest.raises(ValueDecodeError, match=match):
            s.process_record(None, Record(b"k", value, 0, bytes(16)))  # type: ignore[arg-type]
    assert s.prepare_commit() == b'{"next": 0, "prefix": "snk-0"}'


def test_bad_sink_options_are_refused_at_the_client(tmp_path: Any) -> None:
    t = Topology("t")
    with pytest.raises(TopologyError, match="codec='avro' is not known"):
        add_parquet_sink(t, "s", stream="x", path=str(tmp_path), codec="avro")
    with pytest.raises(TopologyError, match="field 'n' has type 'int64'"):
        add_parquet_sink(t, "s", stream="x", path=str(tmp_path), codec="json", fields="n:int64")
    with pytest.raises(TopologyError, match="clashes with the 'key' column"):
        add_parquet_sink(t, "s", stream="x", path=str(tmp_path), codec="json", fields="key:string")
    with pytest.raises(TopologyError, match="fields= needs codec='json'"):
        add_parquet_sink(t, "s", stream="x", path=str(tmp_path), codec="text", fields="a:long")


def test_read_stream_types(spark: Any, tmp_path: Any) -> None:
    from pyspark.sql import functions as F

    d = str(tmp_path / "typed")
    with pytest.raises(SinkNotFound, match="is not a Parquet sink directory"):
        read_stream(spark, d)
    s = _sink(d, "snk/0", None)
    empty = read_stream(spark, d)
    assert empty.count() == 0 and empty.columns == ["key", "value", "timestamp", "query", "n", "score",
                                                    "ok", "at"]
    _batch(s, range(0, 4))
    _batch(s, range(4, 6))
    df = read_stream(spark, d)
    assert dict(df.dtypes) == {"key": "string", "value": "string", "timestamp": "timestamp",
                               "query": "string", "n": "bigint", "score": "double", "ok": "boolean",
                               "at": "timestamp"}
    got = df.select("n", F.unix_micros("timestamp").alias("us"), F.unix_micros("at").alias("at_us"),
                    "score").orderBy("n").collect()
    assert [tuple(r) for r in got] == [(i, 1_700_000_000_000_000 + i, i * 1000, i / 2) for i in range(6)]

    # Inferred JSON fields (no declaration) and the other codecs.
    d2 = str(tmp_path / "inferred")
    s2 = ParquetSink()
    s2.setup({"path": d2, "codec": "json"})
    s2.restore("i/0", None)
    s2.process_record(None, Record(b"a", b'{"x": 1, "tags": ["a"]}', 5, bytes(16)))  # type: ignore[arg-type]
    s2.prepare_commit()
    s2.process_record(None, Record(b"b", b'{"x": 2, "y": "z"}', 6, bytes(16)))  # type: ignore[arg-type]
    s2.prepare_commit()
    df2 = read_stream(spark, d2)
    assert dict(df2.dtypes)["x"] == "bigint" and dict(df2.dtypes)["tags"] == "string"
    assert sorted((r.key, r.x, r.y) for r in df2.collect()) == [("a", 1, None), ("b", 2, "z")]
    d3 = str(tmp_path / "raw")
    s3 = ParquetSink()
    s3.setup({"path": d3, "key_codec": "bytes"})
    s3.restore("r/0", None)
    s3.process_record(None, Record(b"\x00\xff", b"\x01\x02", 7, bytes(16)))  # type: ignore[arg-type]
    s3.prepare_commit()
    df3 = read_stream(spark, d3)
    assert dict(df3.dtypes) == {"key": "binary", "value": "binary", "timestamp": "timestamp"}
    assert [(bytes(r.key), bytes(r.value)) for r in df3.collect()] == [(b"\x00\xff", b"\x01\x02")]
