"""The SQLite sink example (examples/sqlite_sink.py): exact on a real cluster, through a
split, and a zombie's writes refused (issue 15, item 4)."""

from __future__ import annotations

import os
import sqlite3

import pytest

from cli.demo import oracle, sample_lines
from examples import sqlite_sink, wordcount
from runtime.errors import StaleTokenError
from runtime.record import Record
from runtime.topology import Topology
from tests.e2e.test_lifecycle import _inject
from tests.harness import Cluster, wait_until
from worker.context import KeyContext


def _table(path: str, table: str) -> dict[str, tuple[str, int, str]]:
    """key -> (value, token, tablet)."""
    if not os.path.exists(path):
        return {}
    db = sqlite3.connect(path, timeout=60)
    try:
        return {k: (v, t, tb) for k, v, t, tb in db.execute(f"SELECT key, value, token, tablet FROM {table}")}
    except sqlite3.OperationalError:  # no table yet
        return {}
    finally:
        db.close()


def _owners(path: str, table: str) -> dict[str, int]:
    db = sqlite3.connect(path, timeout=60)
    try:
        return dict(db.execute(f"SELECT tablet, token FROM {table}_owners"))
    finally:
        db.close()


def _values(path: str, table: str) -> dict[str, int]:
    return {k: int(v) for k, (v, _, _) in _table(path, table).items()}


def test_word_counts_land_in_sqlite_exactly_through_a_split(cluster: Cluster) -> None:
    db = os.path.join(cluster.data_dir, "counts.db")
    topo: Topology = wordcount.topology(os.path.join(cluster.data_dir, "files"), name="wc")
    topo.add_computation("sqlite_sink", "examples.sqlite_sink:SqliteSink", inputs={"counts": None},
                         params={"path": db, "table": "counts"}, key_ranges=2)
    topo.add_computation("sqlite_writer", "examples.sqlite_sink:SqliteWriter", inputs={"counts": None},
                         params={"path": db, "table": "direct"}, key_ranges=2)
    cluster.client.submit(topo)
    cluster.wait_assigned()
    first, second = sample_lines(600, seed=21), sample_lines(600, seed=22)
    _inject(cluster, "part-1", first)
    want = oracle(first)
    wait_until(lambda: _values(db, "counts") == want and _values(db, "direct") == want, 120,
               "the first part's counts in both tables")

    # Every row names the tablet that wrote it and its token, as the cluster has them.
    tokens = {f"{t['computation']}/{t['key_range']}": t["token"] for t in cluster.client.status()["tablets"]}
    for table, comp in (("counts", "sqlite_sink"), ("direct", "sqlite_writer")):
        writers = {(tablet, token) for _, token, tablet in _table(db, table).values()}
        assert {tablet for tablet, _ in writers} == {f"{comp}/0", f"{comp}/1"}, writers
        assert all(tokens[tablet] == token for tablet, token in writers), (writers, tokens)
    assert _owners(db, "counts") == {"sqlite_sink/0": tokens["sqlite_sink/0"],
                                     "sqlite_sink/1": tokens["sqlite_sink/1"]}

    halves = cluster.client.split("sqlite_sink", 0)
    cluster.wait_assigned()
    _inject(cluster, "part-2", second, finish=True)
    want = oracle(first + second)
    wait_until(lambda: _values(db, "counts") == want and _values(db, "direct") == want, 120,
               "both parts' counts in both tables")
    owners = _owners(db, "counts")
    half_token = halves[0]["token"]
    assert all(h["token"] == half_token for h in halves)
    # The halves claimed their parent's name (it came in their meta): its zombie is refused.
    assert owners["sqlite_sink/0"] == half_token > tokens["sqlite_sink/0"], owners
    written_by = {tablet for _, _, tablet in _table(db, "counts").values()}
    assert written_by & {f"sqlite_sink/{h['key_range']}" for h in halves}, written_by


def _batch(sink: sqlite_sink.SqliteSink, ctx: KeyContext, items: dict[str, str]) -> bytes:
    """One batch through the sink's hooks, as a worker runs it."""
    for key, value in items.items():
        ctx.begin(key.encode(), 0)
        sink.process_record(ctx, Record(key.encode(), value.encode(), 0, b"0" * 16))
    return sink.prepare_commit()


def _sink(path: str, tablet: str, meta: bytes | None, token: int,
          absorbed: tuple[bytes, ...] = ()) -> tuple[sqlite_sink.SqliteSink, KeyContext]:
    sink = sqlite_sink.SqliteSink()
    sink.setup({"path": path, "table": "kv"})
    sink.restore(tablet, meta, token, absorbed)
    ctx = KeyContext(frozenset(), lambda key: None, lambda: 0)
    ctx.bind_tablet(tablet, token)
    return sink, ctx


def test_a_zombie_owner_writes_nothing_once_the_new_owner_opened(tmp_path: object) -> None:
    """The old owner (token 1) commits a batch, then stalls in its next one past its lease;
    the tablet moves (token 2), the new owner opens and writes. The old owner wakes up and
    finishes its batch: refused, all of it, and the table holds the new owner's values."""
    db = os.path.join(str(tmp_path), "kv.db")
    old, old_ctx = _sink(db, "out/0", None, 1)
    meta = _batch(old, old_ctx, {"a": "1", "b": "1"})  # committed
    for key, value in {"a": "2", "c": "1"}.items():    # its next batch: user code ran, then it stalled
        old.process_record(old_ctx, Record(key.encode(), value.encode(), 0, b"0" * 16))

    new, new_ctx = _sink(db, "out/0", meta, 2)  # the new owner claims the tablet on opening ...
    assert _owners(db, "kv") == {"out/0": 2}
    with pytest.raises(StaleTokenError, match="claimed by token 2, newer than this writer's"):
        old.prepare_commit()  # ... so the zombie's write is refused even before the new owner writes
    assert _values(db, "kv") == {"a": 1, "b": 1}
    _batch(new, new_ctx, {"a": "2", "c": "1"})  # the stalled batch, redelivered to the new owner
    _batch(new, new_ctx, {"a": "3"})
    for key, value in {"a": "9", "d": "9"}.items():  # the zombie keeps going: still refused
        old.process_record(old_ctx, Record(key.encode(), value.encode(), 0, b"0" * 16))
    with pytest.raises(StaleTokenError):
        old.prepare_commit()
    assert _table(db, "kv") == {"a": ("3", 2, "out/0"), "b": ("1", 1, "out/0"), "c": ("1", 2, "out/0")}


def test_a_zombie_that_wrote_before_the_claim_is_overwritten_by_the_redelivery(tmp_path: object) -> None:
    """The zombie's write got in before the new owner opened: its batch never commits, the new
    owner gets the same records and writes the same rows under its token."""
    db = os.path.join(str(tmp_path), "kv.db")
    old, old_ctx = _sink(db, "out/0", None, 1)
    meta = _batch(old, old_ctx, {"a": "1"})
    _batch(old, old_ctx, {"a": "2", "b": "1"})  # written to SQLite; its storage commit is fenced off
    new, new_ctx = _sink(db, "out/0", meta, 2)
    _batch(new, new_ctx, {"a": "2", "b": "1"})  # the redelivery
    assert _table(db, "kv") == {"a": ("2", 2, "out/0"), "b": ("1", 2, "out/0")}


def test_a_parent_range_zombie_is_refused_after_a_split(tmp_path: object) -> None:
    """A split's halves have new names; their first open's meta names the parent, which they
    claim: the parent's late batch is refused. And per key: an older token never overwrites
    a key a newer one wrote, whatever the tablet's name (the plain computation's path)."""
    db = os.path.join(str(tmp_path), "kv.db")
    parent, parent_ctx = _sink(db, "out/0", None, 4)
    meta = _batch(parent, parent_ctx, {"a": "1", "z": "1"})
    left, left_ctx = _sink(db, "out/1", meta, 5)
    right, right_ctx = _sink(db, "out/2", meta, 5)
    assert _owners(db, "kv") == {"out/0": 5, "out/1": 5, "out/2": 5}
    parent.process_record(parent_ctx, Record(b"a", b"7", 0, b"0" * 16))
    with pytest.raises(StaleTokenError, match="out/0 was claimed by token 5"):
        parent.prepare_commit()
    _batch(left, left_ctx, {"a": "2"})

    writer = sqlite_sink.SqliteWriter()  # unclaimed name, older token: the key's own token refuses it
    writer.setup({"path": db, "table": "kv"})
    ctx = KeyContext(frozenset(), lambda key: None, lambda: 0)
    ctx.bind_tablet("elsewhere/0", 4)
    with pytest.raises(StaleTokenError, match="1 of 1 keys were written by a token newer"):
        writer.process_record(ctx, Record(b"a", b"8", 0, b"0" * 16))
    assert _table(db, "kv") == {"a": ("2", 5, "out/1"), "z": ("1", 4, "out/0")}

    # A merge: the merged range claims both halves (the right one comes in ``absorbed``).
    right_meta = _batch(right, right_ctx, {"z": "2"})
    merged, _ = _sink(db, "out/3", b"out/1", 6, (right_meta,))
    assert _owners(db, "kv") == {"out/0": 5, "out/1": 6, "out/2": 6, "out/3": 6}
    right.process_record(right_ctx, Record(b"q", b"1", 0, b"0" * 16))
    with pytest.raises(StaleTokenError, match="out/2 was claimed by token 6"):
        right.prepare_commit()
    assert merged.prepare_commit() == b"out/3"  # an empty batch writes nothing
    assert _values(db, "kv") == {"a": 2, "z": 2}
