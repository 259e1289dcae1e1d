"""The Parquet sink's exactly-once file protocol, its rolling of rows into files, and reading
its output back with types."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from injectors import END_OF_TIME, Injector
from runtime.computation import Context, State, TimeDomain
from runtime.errors import MillstreamError, StaleTokenError, TopologyError
from runtime.record import Record
from runtime.topology import Topology
from spark_bridge import ParquetSink, ValueDecodeError, add_parquet_sink, count_rows, read_rows, read_stream
from spark_bridge.parquet_sink import END_TAG, ROLL_TAG
from spark_bridge.read import SinkNotFoundError
from tests.harness import Cluster, wait_until

FIELDS = "query:string,n:long,score:double,ok:boolean,at:timestamp"
T0 = 1_800_000_000_000_000  # a wall clock, in µs


def _sink(path: str, tablet: str, meta: bytes | None, token: int = 0, **params: str) -> ParquetSink:
    """A sink that writes one file per batch unless ``roll_rows`` says otherwise."""
    s = ParquetSink()
    s.setup({"path": path, "codec": "json", "fields": FIELDS, "roll_rows": "1", **params})
    s.restore(tablet, meta, token)
    return s


def _rec(i: int) -> Record:
    value = f'{{"query": "q{i}", "n": {i}, "score": {i / 2}, "ok": {str(i % 2 == 0).lower()}, "at": {i * 1000}}}'
    return Record(f"k{i}".encode(), value.encode(), 1_700_000_000_000_000 + i, bytes(16))


def _batch(sink: ParquetSink, ids: range, ctx: Context | None = None) -> bytes:
    for i in ids:
        sink.process_record(ctx, _rec(i))  # type: ignore[arg-type]
    return sink.prepare_commit()


def _files(d: str) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.endswith(".parquet"))


def _staging(d: str) -> dict[str, int]:
    return {n: os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if ".staging-" in n}


def _ns(d: str) -> list[int]:
    return sorted(r["n"] for r in read_rows(d))


class _Ctx(Context):
    """Just enough of a worker's context for the sink: a wall clock and the timers set."""

    def __init__(self, now: int) -> None:
        self.clock = now
        self.timers: dict[str, tuple[int, TimeDomain]] = {}

    @property
    def key(self) -> bytes:
        return b"k"

    @property
    def state(self) -> State:
        raise AssertionError("the sink keeps no state")

    @property
    def low_watermark(self) -> int:
        return 0

    @property
    def tablet(self) -> str:
        return "snk/0"

    @property
    def sequencer_token(self) -> int:
        return 1

    def produce(self, stream: str, value: bytes, *, key: bytes | None = None,
                timestamp: int | None = None) -> None:
        raise AssertionError("the sink produces nothing")

    def set_timer(self, tag: str, time: int, domain: TimeDomain = TimeDomain.EVENT_TIME) -> None:
        self.timers[tag] = (time, domain)

    def delete_timer(self, tag: str) -> None:
        self.timers.pop(tag, None)

    def now(self) -> int:
        return self.clock


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
    assert json.loads(m2) == {"next": 5, "prefix": "snk-0", "staged": 0, "rows": 0, "since": None}
    assert s2.prepare_commit() == m2  # an empty batch changes nothing
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
    assert json.loads(s.prepare_commit())["next"] == 0 and _staging(str(tmp_path)) == {}


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
    for kw, match in [({"roll_rows": 0}, r"roll_rows=0 is not a whole number of rows >= 1; pass e\.g\."),
                      ({"roll_rows": 2.5}, "roll_rows=2.5 is not a whole number"),
                      ({"roll_rows": "many"}, "roll_rows='many' is not a whole number"),
                      ({"roll_s": 0}, r"roll_s=0 is not a number of seconds > 0; pass e\.g\. roll_s=5"),
                      ({"roll_s": -1.5}, "roll_s=-1.5 is not a number of seconds"),
                      ({"roll_s": float("nan")}, "roll_s=nan is not a number of seconds"),
                      ({"roll_s": float("inf")}, "roll_s=inf is not a number of seconds")]:
        with pytest.raises(TopologyError, match=match):
            add_parquet_sink(t, "s", stream="x", path=str(tmp_path), **kw)  # type: ignore[arg-type]
    assert "s" not in t.computations
    with pytest.raises(TopologyError, match="roll_rows='0' is not a whole number"):
        ParquetSink().setup({"path": str(tmp_path), "roll_rows": "0"})  # params written by hand
    add_parquet_sink(t, "s", stream="x", path=str(tmp_path), roll_rows=500, roll_s=0.5)
    assert (t.computations["s"].params["roll_rows"], t.computations["s"].params["roll_s"]) == ("500", "0.5")
    add_parquet_sink(t, "d", stream="x", path=str(tmp_path))
    assert (t.computations["d"].params["roll_rows"], t.computations["d"].params["roll_s"]) == ("1000000", "5.0")


def test_read_stream_types(spark: Any, tmp_path: Any) -> None:
    from pyspark.sql import functions as F

    d = str(tmp_path / "typed")
    with pytest.raises(SinkNotFoundError, match="is not a Parquet sink directory"):
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
    s2.setup({"path": d2, "codec": "json", "roll_rows": "1"})
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
    s3.setup({"path": d3, "key_codec": "bytes", "roll_rows": "1"})
    s3.restore("r/0", None)
    s3.process_record(None, Record(b"\x00\xff", b"\x01\x02", 7, bytes(16)))  # type: ignore[arg-type]
    s3.prepare_commit()
    df3 = read_stream(spark, d3)
    assert dict(df3.dtypes) == {"key": "binary", "value": "binary", "timestamp": "timestamp"}
    assert [(bytes(r.key), bytes(r.value)) for r in df3.collect()] == [(b"\x00\xff", b"\x01\x02")]


def test_small_batches_roll_into_few_files_and_the_staging_survives_a_reopen(tmp_path: Any) -> None:
    d = str(tmp_path)
    s = _sink(d, "snk/0", None, roll_rows="10")
    metas = [_batch(s, range(3 * i, 3 * i + 3)) for i in range(7)]  # 21 rows in 7 batches
    assert _files(d) == ["snk-0-0000000000000000.parquet"] and _ns(d) == list(range(12))
    staged = _staging(d)
    assert list(staged) == [".snk-0.staging-12"]  # hidden: readers skip it
    assert json.loads(metas[-1]) == {"next": 12, "prefix": "snk-0", "staged": staged[".snk-0.staging-12"],
                                     "rows": 9, "since": None}

    s = _sink(d, "snk/0", metas[-1], roll_rows="10")  # reopened at the committed meta: nothing cut
    assert _staging(d) == staged and _files(d) == ["snk-0-0000000000000000.parquet"]
    _batch(s, range(21, 22))  # the 10th staged row: one file of the 9 staged and this one
    assert _files(d) == ["snk-0-0000000000000000.parquet", "snk-0-0000000000000012.parquet"]
    assert _ns(d) == list(range(22))
    assert list(_staging(d)) == [".snk-0.staging-12"]  # kept until the roll's commit is known ...
    s.prepare_commit()
    assert _staging(d) == {}                             # ... which the next batch proves


def test_a_crash_before_the_commit_cuts_the_staging_back_and_the_replay_counts_once(tmp_path: Any) -> None:
    d = str(tmp_path)
    f0, f6 = "snk-0-0000000000000000.parquet", "snk-0-0000000000000006.parquet"
    s = _sink(d, "snk/0", None, roll_rows="5")
    m1 = _batch(s, range(0, 3))          # staged and committed
    committed = _staging(d)
    _batch(s, range(3, 6))               # 6 rows: rolled into one file; the commit never happens
    assert _files(d) == [f0]

    s = _sink(d, "snk/0", m1, roll_rows="5")  # the tablet reopens at m1
    assert _files(d) == [] and _staging(d) == committed
    m2 = _batch(s, range(3, 6))          # the redelivered batch rolls again, under the same name
    assert _files(d) == [f0] and _ns(d) == list(range(6))

    s = _sink(d, "snk/0", m2, roll_rows="5")  # reopened right after the roll's commit
    assert _staging(d) == {}                   # the rolled generation's staging file is gone
    m3 = _batch(s, range(6, 8))
    committed = _staging(d)
    _batch(s, range(8, 10))              # appended to the staging file; the commit never happens
    assert _staging(d)[".snk-0.staging-6"] > committed[".snk-0.staging-6"]

    s = _sink(d, "snk/0", m3, roll_rows="5")
    assert _staging(d) == committed      # the uncommitted tail is cut off
    _batch(s, range(8, 10))              # redelivered
    _batch(s, range(10, 11))
    assert _files(d) == [f0, f6] and _ns(d) == list(range(11))  # every row once



def test_a_savepoint_restored_over_later_output_takes_its_staged_rows_back(tmp_path: Any) -> None:
    """The meta of a savepoint names a staging file that the old cluster rolled (and removed)
    after the savepoint: its rows are the first of the rolled file, which is cut to them."""
    d = str(tmp_path)
    s = _sink(d, "snk/0", None, roll_rows="5")
    saved = _batch(s, range(0, 3))        # the savepoint: 3 rows staged
    _batch(s, range(3, 6))                # later output: rolled into file 0 ...
    _batch(s, range(6, 7))                # ... whose staging file the next batch removes
    assert _staging(d) == {".snk-0.staging-6": _staging(d)[".snk-0.staging-6"]}
    for _ in range(2):                    # and again: a crash before the first commit after it
        s = _sink(d, "snk/0", saved, roll_rows="5")
        assert _files(d) == ["snk-0-0000000000000000.parquet"] and _ns(d) == [0, 1, 2]
        assert _staging(d) == {}
    m = _batch(s, range(3, 6))            # the restored job goes on from the savepoint
    assert json.loads(m)["next"] == 3 and json.loads(m)["rows"] == 3
    _batch(s, range(6, 8))
    assert _files(d) == ["snk-0-0000000000000000.parquet", "snk-0-0000000000000003.parquet"]
    assert _ns(d) == list(range(8))

def test_an_old_owner_can_neither_stage_nor_roll_after_the_new_one_opened(tmp_path: Any) -> None:
    d = str(tmp_path)
    old = _sink(d, "snk/0", None, token=1, roll_rows="4")
    m = _batch(old, range(0, 2))
    staged = _staging(d)
    new = _sink(d, "snk/0", m, token=2, roll_rows="4")
    for ids in (range(2, 3), range(3, 9)):  # staged, then rolled
        for i in ids:
            old.process_record(None, _rec(i))  # type: ignore[arg-type]
        with pytest.raises(StaleTokenError, match="claimed by token 2"):
            old.prepare_commit()
    assert _staging(d) == staged and _files(d) == []
    _batch(new, range(2, 4))
    assert _ns(d) == [0, 1, 2, 3]


def test_a_roll_by_time_through_the_wall_clock_timer(tmp_path: Any) -> None:
    d = str(tmp_path)
    s = _sink(d, "snk/0", None, roll_rows="1000", roll_s="5")
    ctx = _Ctx(T0)
    _batch(s, range(0, 1), ctx)
    assert ctx.timers == {ROLL_TAG: (T0 + 5_000_000, TimeDomain.WALL_TIME),
                          END_TAG: (END_OF_TIME - 1, TimeDomain.EVENT_TIME)}
    ctx.timers.clear()
    ctx.clock = T0 + 1_000_000
    _batch(s, range(1, 2), ctx)
    assert ctx.timers == {} and _files(d) == []    # set once per file
    s.process_timer(ctx, ROLL_TAG, T0 + 4_000_000)  # an earlier file's timer: not this file's time
    assert s.prepare_commit() and _files(d) == []
    s.process_timer(ctx, ROLL_TAG, T0 + 5_000_000)
    s.prepare_commit()
    assert _files(d) == ["snk-0-0000000000000000.parquet"] and _ns(d) == [0, 1]

    ctx.clock = T0 + 6_000_000
    meta = _batch(s, range(2, 3), ctx)  # the next file's first row sets the next timer
    assert ctx.timers == {ROLL_TAG: (T0 + 11_000_000, TimeDomain.WALL_TIME)}
    assert json.loads(meta)["since"] == T0 + 6_000_000
    # Reopened (the timer may be with another tablet after a split): the first record sets
    # both timers again, and a record that comes after the file's time rolls it at once.
    s = _sink(d, "snk/0", meta, roll_rows="1000", roll_s="5")
    ctx = _Ctx(T0 + 12_000_000)
    _batch(s, range(3, 4), ctx)
    assert set(ctx.timers) == {ROLL_TAG, END_TAG} and ctx.timers[ROLL_TAG][0] == T0 + 11_000_000
    assert _files(d)[-1] == "snk-0-0000000000000002.parquet" and _ns(d) == [0, 1, 2, 3]


def test_a_roll_at_the_end_of_time(tmp_path: Any) -> None:
    d = str(tmp_path)
    s = _sink(d, "snk/0", None, roll_rows="1000", roll_s="3600")
    ctx = _Ctx(T0)
    _batch(s, range(0, 3), ctx)
    assert _files(d) == [] and ctx.timers[END_TAG] == (END_OF_TIME - 1, TimeDomain.EVENT_TIME)
    s.process_timer(ctx, END_TAG, END_OF_TIME - 1)  # the sink's input is finished
    s.prepare_commit()
    assert _files(d) == ["snk-0-0000000000000000.parquet"] and _ns(d) == [0, 1, 2]
    assert _staging(d) == {".snk-0.staging-0": os.path.getsize(os.path.join(d, ".snk-0.staging-0"))}
    ctx.timers.clear()
    _batch(s, range(3, 4), ctx)  # a record after the end sets the timer again (it fires at once)
    assert ctx.timers[END_TAG] == (END_OF_TIME - 1, TimeDomain.EVENT_TIME) and len(_files(d)) == 1
    s.process_timer(ctx, END_TAG, END_OF_TIME - 1)
    s.prepare_commit()
    assert _ns(d) == [0, 1, 2, 3]
    s.process_timer(ctx, END_TAG, END_OF_TIME - 1)  # nothing staged: no file ...
    s.prepare_commit()
    _batch(s, range(4, 5), ctx)                     # ... and the next batch is staged, not rolled
    assert len(_files(d)) == 2 and _ns(d) == [0, 1, 2, 3]


def test_inferred_fields_that_differ_between_batches_widen_in_one_file(tmp_path: Any) -> None:
    d = str(tmp_path)
    s = ParquetSink()
    s.setup({"path": d, "codec": "json", "roll_rows": "4"})
    s.restore("i/0", None)
    for i, value in enumerate([b'{"x": 1, "y": 1}', b'{"x": 2.5, "y": true}', b'{"x": 3, "z": null}',
                               b'{"x": 4, "w": [1]}']):
        s.process_record(None, Record(b"k%d" % i, value, i, bytes(16)))  # type: ignore[arg-type]
        s.prepare_commit()
    assert len(_files(d)) == 1
    rows = sorted(read_rows(d), key=lambda r: r["timestamp"])
    assert [r["x"] for r in rows] == [1.0, 2.5, 3.0, 4.0]
    assert [r["y"] for r in rows] == ["1", "true", None, None]
    assert [r["w"] for r in rows] == [None, None, None, "[1]"] and [r["z"] for r in rows] == [None] * 4


def test_rows_reach_files_by_time_and_when_the_input_ends(shared_cluster: Cluster) -> None:
    """On real workers: a wall-clock roll while the input is open, and an end-of-time roll
    that the sink's watermark waits for."""
    c = shared_cluster
    base = 1_700_000_000_000_000
    timed, ended = os.path.join(c.data_dir, "out-timed"), os.path.join(c.data_dir, "out-ended")
    topo = Topology("rolls")
    add_parquet_sink(topo, "rolls.timed", stream="rolls.a", path=timed, codec="text", roll_s=1)
    add_parquet_sink(topo, "rolls.ended", stream="rolls.b", path=ended, codec="text", roll_s=3600)
    c.client.submit(topo)
    c.wait_assigned()
    with Injector(c.masters_arg, "rolls.a", "rolls-a") as inj:
        for i in range(50):
            inj.send(b"k%d" % i, b"v", base + i)
        inj.flush()
        wait_until(lambda: os.path.isdir(timed) and count_rows(timed) == 50, 30, "50 rows rolled by time")
        assert c.client.status()["computations"]["rolls.timed"]["low_watermark"] < END_OF_TIME
    with Injector(c.masters_arg, "rolls.b", "rolls-b") as inj:
        for i in range(50):
            inj.send(b"k%d" % i, b"v", base + i)
    wait_until(lambda: c.client.status()["computations"]["rolls.ended"]["low_watermark"] == END_OF_TIME,
               30, "the sink's watermark to reach the end of time")
    assert count_rows(ended) == 50 and len(_files(ended)) <= 2  # one file per tablet


def test_a_merged_range_settles_the_rows_the_other_range_had_staged(tmp_path: Any) -> None:
    d = str(tmp_path)
    left, right = _sink(d, "snk/0", None, roll_rows="100"), _sink(d, "snk/1", None, roll_rows="100")
    m_left = [_batch(left, range(i, i + 2)) for i in range(0, 6, 2)][-1]
    m_right = [_batch(right, range(i, i + 2)) for i in range(100, 106, 2)][-1]
    assert _files(d) == [] and len(_staging(d)) == 2  # both ranges hold committed rows, unrolled
    # The runtime merges snk/0 and snk/1 into snk/2: it goes on with the left's meta, and hands
    # the right's over (worker/reshard.py keeps it as an absorbed sink meta).
    merged = ParquetSink()
    merged.setup({"path": d, "codec": "json", "fields": FIELDS, "roll_rows": "100"})
    settled = os.path.join(d, "snk-1-0000000000000000.parquet")
    made = None
    for _ in range(2):  # opened twice (a reopen after a failure): settled once
        merged.restore("snk/2", m_left, 3, absorbed=[m_right])
        # The right range's rows settle into its own file; the left range's staged rows are
        # rolled at this open too (a range made by a merge or split: their timers may be gone).
        assert _files(d) == ["snk-0-0000000000000000.parquet", "snk-1-0000000000000000.parquet"]
        # ... and its staging file goes: a later open finds the file made and keeps it (review
        # of the sinks: it stayed, and every open deleted the file and wrote it again).
        assert not any(".snk-1.staging" in n for n in os.listdir(d)), os.listdir(d)
        made = made or os.stat(settled)
        assert (os.stat(settled).st_ino, os.stat(settled).st_mtime_ns) == (made.st_ino, made.st_mtime_ns)
    merged.process_record(None, _rec(50))  # type: ignore[arg-type]
    merged.roll_rows = 1
    merged.prepare_commit()
    assert _ns(d) == [0, 1, 2, 3, 4, 5, 50, 100, 101, 102, 103, 104, 105]


def test_a_replaced_range_that_never_committed_has_its_files_taken_back(tmp_path: Any) -> None:
    """Review: a range's first batch rolled into a file, its commit failed, and the range was
    split (or merged) before it opened again: nothing committed, no meta went on, and the file
    stayed beside the rows the range that goes on writes again (read twice)."""
    d = str(tmp_path)
    parent = _sink(d, "snk/0", None, token=1)
    _batch(parent, range(0, 3))  # rolled into a file; the commit never happened
    assert _files(d) == ["snk-0-0000000000000000.parquet"]
    child = ParquetSink()
    child.setup({"path": d, "codec": "json", "fields": FIELDS, "roll_rows": "1"})
    for _ in range(2):  # every open takes back the same way
        child.restore("snk/1", None, 2, absorbed=[], uncommitted={"snk/0": 1})
        assert _files(d) == [] and not any(n.startswith(".snk-0.") and "fence" not in n for n in os.listdir(d))
    with pytest.raises(StaleTokenError):
        _batch(parent, range(3, 4))  # the parent's old owner, still finishing, writes nothing more
    _batch(child, range(0, 3))
    assert _ns(d) == [0, 1, 2]


def test_merging_and_splitting_the_sink_s_ranges_while_rows_are_staged_loses_none(shared_cluster: Cluster) -> None:
    c = shared_cluster
    out = os.path.join(c.data_dir, "out-merged")
    topo = Topology("merged-sink")
    add_parquet_sink(topo, "merged.sink", stream="merged.in", path=out, codec="text", roll_s=3600)
    c.client.submit(topo)
    c.wait_assigned()
    with Injector(c.masters_arg, "merged.in", "merged-in") as inj:
        for i in range(200):
            inj.send(b"k%d" % i, b"%d" % i, 1_700_000_000_000_000 + i)
        inj.flush()
        assert not os.path.isdir(out) or count_rows(out) == 0, "nothing rolled yet: every row is staged"
        ranges = sorted((t for t in c.client.status()["tablets"] if t["computation"] == "merged.sink"),
                        key=lambda t: t["start"])
        merged = c.client.merge("merged.sink", ranges[0]["key_range"], ranges[1]["key_range"])
        for i in range(200, 300):
            inj.send(b"k%d" % i, b"%d" % i, 1_700_000_000_000_000 + i)
        inj.flush()
        c.client.split("merged.sink", merged[0]["key_range"])  # rows staged again: the halves keep them
        for i in range(300, 400):
            inj.send(b"k%d" % i, b"%d" % i, 1_700_000_000_000_000 + i)
    wait_until(lambda: c.client.status()["computations"]["merged.sink"]["low_watermark"] == END_OF_TIME,
               60, "the sink's input to end")
    assert sorted(int(r["value"]) for r in read_rows(out)) == list(range(400))


def test_a_committed_first_batch_loses_its_marker_so_a_later_cluster_leaves_it_alone(tmp_path: Any) -> None:
    """Review of the sinks: a tablet whose input was one batch kept the marker of its first
    files beside committed output, and a later cluster writing to the same directory (fresh
    state) removed them as its own uncommitted ones. ``committed()`` (the worker calls it once
    the commit is durable and replicated) removes the marker."""
    d = str(tmp_path)
    old = _sink(d, "snk/0", None)
    _batch(old, range(0, 2))
    old.committed()
    before = _files(d)
    assert before and not [n for n in os.listdir(d) if n.endswith(".uncommitted")]
    _sink(d, "snk/0", None)  # a new cluster, the same directory
    assert _files(d) == before and _ns(d) == [0, 1]


def test_an_inferred_integer_no_parquet_integer_holds_is_kept_as_its_digits(tmp_path: Any) -> None:
    """Review of the sinks: an inferred JSON int outside signed 64 bits (a uint64 hash) failed
    the batch at prepare_commit, again on every retry: the tablet stalled for good."""
    s = ParquetSink()
    s.setup({"path": str(tmp_path), "codec": "json", "roll_rows": "1"})
    s.restore("snk/0", None, 0)
    for i, h in enumerate((18446744073709551615, 7)):
        s.process_record(None, Record(b"k", json.dumps({"h": h}).encode(), i, bytes(16)))  # type: ignore[arg-type]
    s.prepare_commit()
    assert sorted(r["h"] for r in read_rows(str(tmp_path))) == ["18446744073709551615", "7"]


def test_an_earlier_cluster_s_range_that_never_committed_does_not_stop_a_new_tablet_opening(tmp_path: Any) -> None:
    """Review of the runs: a range that opened under token 4 and never committed left its
    marker and fence; a new cluster's tablet (token 1) took that prefix for its own, and its
    claim failed: it could never open."""
    d = str(tmp_path)
    _sink(d, "snk/0", None, token=4)
    s = _sink(d, "snk/0", None, token=1)
    assert b'"prefix": "snk-0.g1"' in _batch(s, range(0, 1))


def test_a_committed_tablet_that_opens_again_drops_its_marker(tmp_path: Any) -> None:
    """Review of the runs: a reopen with a committed meta kept the first files' marker until the
    next commit; an idle tablet kept it for good, and a later cluster took the generation for
    its own uncommitted output and removed committed files."""
    d = str(tmp_path)
    s = _sink(d, "snk/0", None, token=1)
    meta = _batch(s, range(0, 2))  # committed; committed() never came (a crash)
    _sink(d, "snk/0", meta, token=2)  # reopened, then idle
    assert not [n for n in os.listdir(d) if n.endswith(".uncommitted")]
    _sink(d, "snk/0", None, token=5)  # a later cluster, the same directory
    assert _ns(d) == [0, 1]


def test_read_rows_takes_a_timestamp_past_the_year_9999(tmp_path: Any) -> None:
    """After review: read_rows made each row a dict with its timestamp as a datetime first, which
    raised OverflowError for a record stamped past the year 9999 (a flush at the end of input,
    stamped just below the end of time), and returned nothing."""
    d = str(tmp_path)
    sink = _sink(d, "snk/0", None)
    late = Record(b"k", _rec(1).value, END_OF_TIME - 1, bytes(16))
    sink.process_record(None, late)  # type: ignore[arg-type]
    sink.prepare_commit()
    [row] = read_rows(d)
    assert row["timestamp"] == END_OF_TIME - 1 and row["query"] == "q1"
