"""A sink into a SQLite table, idempotent and fenced by the sequencer token (docs/guide.md,
"Writing a sink").

Each record's ``(key, value)`` becomes the row of its key in table ``<table>`` (the last
value wins); every row also names the tablet and the token that wrote it. A second table,
``<table>_owners``, holds per tablet the newest token that claimed it. Params: ``path``
(the database file; every worker that may run the sink must reach it) and ``table``
(default ``kv``). One computation per table, and one job: tokens count one job's history, so
a new job (or one restored into another cluster) writes into a new table.

Why a zombie is harmless. A *zombie* is an old owner of a tablet still running after its
lease ran out (a long GC or a stopped VM): the worker checks its lease right before
``prepare_commit``, but it can stall just after that check, and wake up after the tablet
has a new owner. The new owner holds a higher token and, when it opens (``restore``),
claims the tablet's row in ``<table>_owners`` before it processes anything. Every write of
a batch checks that row *in the same SQLite transaction* as the write (``BEGIN IMMEDIATE``
takes the database's write lock first, so no claim can come between the check and the
write). So:

- a zombie that writes after the claim sees a newer token and is refused: its transaction
  rolls back, nothing of it is written, its batch fails (it was never acknowledged);
- a zombie that wrote before the claim wrote a batch whose commit never happens (its
  tablet's storage is fenced by token too): the new owner gets those records again and
  writes the same rows again, under its own, higher token. Upserts are idempotent.

A split or merge gives the new ranges new names and tokens above their parents'. The new
range claims its parents' rows too: their names come in ``meta`` (what the last committed
``prepare_commit`` returned: the name of the tablet that wrote, which for a range just made
is its parent) and ``absorbed`` (the metas of ranges merged into it). And each key's row
carries its writer's token, which only goes up along the key's owners: a write with an older
token than the key's row is refused as well, whatever the tablet names.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence

from millstream import Computation, Context, Record, Sink
from runtime.errors import StaleTokenError, TopologyError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def connect(path: str, table: str) -> sqlite3.Connection:
    """The database, with both tables. Transactions are explicit (``isolation_level=None``)."""
    db = sqlite3.connect(path, timeout=60, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")   # readers do not block the writers
    db.execute("PRAGMA synchronous=FULL")  # a committed transaction survives a power cut
    db.execute(f"CREATE TABLE IF NOT EXISTS {table} (key TEXT PRIMARY KEY, value TEXT NOT NULL, "
               "token INTEGER NOT NULL, tablet TEXT NOT NULL)")
    db.execute(f"CREATE TABLE IF NOT EXISTS {table}_owners (tablet TEXT PRIMARY KEY, token INTEGER NOT NULL)")
    return db


def claim(db: sqlite3.Connection, table: str, tablet: str, token: int, *, strict: bool = True) -> None:
    """Record ``token`` as ``tablet``'s owner unless a newer one is there; in a transaction.

    ``strict``: a newer token there means this writer lost the tablet: refuse. Not strict (a
    parent's or a merged range's name): a newer token there is a later owner's, fine.
    """
    row = db.execute(f"SELECT token FROM {table}_owners WHERE tablet = ?", (tablet,)).fetchone()
    if row is not None and row[0] > token:
        if strict:
            raise StaleTokenError(f"sqlite sink: tablet {tablet} was claimed by token {row[0]}, newer than "
                                  f"this writer's ({token}): it has a newer owner, which writes it now")
        return
    if row is None or row[0] < token:
        db.execute(f"INSERT INTO {table}_owners (tablet, token) VALUES (?, ?) "
                   "ON CONFLICT (tablet) DO UPDATE SET token = excluded.token", (tablet, token))


def write_fenced(db: sqlite3.Connection, table: str, tablet: str, token: int,
                 rows: Iterable[tuple[str, str]]) -> None:
    """Upsert ``(key, value)`` rows as ``tablet`` under ``token``, all or nothing: refused
    (``StaleTokenError``, nothing written) if a newer token claimed the tablet or wrote any
    of the keys."""
    batch = [(key, value, token, tablet) for key, value in rows]
    db.execute("BEGIN IMMEDIATE")  # the write lock first: nothing comes between check and write
    try:
        claim(db, table, tablet, token)
        cur = db.executemany(
            f"INSERT INTO {table} (key, value, token, tablet) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value, token = excluded.token, "
            f"tablet = excluded.tablet WHERE excluded.token >= {table}.token", batch)
        if cur.rowcount != len(batch):  # a row whose token was newer was left as it was
            raise StaleTokenError(f"sqlite sink: {len(batch) - cur.rowcount} of {len(batch)} keys were "
                                  f"written by a token newer than {tablet}'s ({token}): it lost them")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _params(params: Mapping[str, str], who: str) -> tuple[str, str]:
    """``path`` and ``table``, checked (a table name cannot be an SQL parameter)."""
    if not params.get("path"):
        raise TopologyError(f"{who} needs params={{'path': DATABASE FILE}}")
    table = params.get("table", "kv")
    if not _NAME.fullmatch(table):
        raise TopologyError(f"{who}: table={table!r} is not a plain SQL name; use letters, digits "
                            "and underscores, e.g. table='word_counts'")
    return params["path"], table


def _text(b: bytes) -> str:
    return b.decode("utf-8", "backslashreplace")


class SqliteSink(Sink):
    """Writes each record's ``(key, value)``, as UTF-8 text, to a SQLite table: one
    transaction per batch, in ``prepare_commit`` (see the module)."""

    local_paths = ("path",)  # the database file, the same for every worker

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self.path, self.table = _params(params, "SqliteSink")
        self._rows: dict[str, str] = {}  # the batch's rows: the last value of each key wins

    def restore(self, tablet: str, meta: bytes | None, token: int, absorbed: Sequence[bytes],
                uncommitted: Mapping[str, int] | None = None) -> None:
        # Nothing to undo: what a batch wrote without committing is written again, the same,
        # by its redelivery. Only claim: this tablet first, then the ranges it came from
        # (those that committed name themselves in a meta; ``uncommitted`` names the others).
        self.tablet, self.token = tablet, token
        self._rows = {}
        self.db = connect(self.path, self.table)
        self.db.execute("BEGIN IMMEDIATE")
        try:
            claim(self.db, self.table, tablet, token)
            for other in [*(m.decode() for m in [meta, *absorbed] if m), *(uncommitted or {})]:
                if other != tablet:
                    claim(self.db, self.table, other, token, strict=False)
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def process_record(self, ctx: Context, record: Record) -> None:
        self._rows[_text(record.key)] = _text(record.value)

    def prepare_commit(self) -> bytes:
        """One SQLite transaction for the batch's rows; the meta names the tablet that wrote."""
        rows, self._rows = self._rows, {}
        if rows:
            write_fenced(self.db, self.table, self.tablet, self.token, rows.items())
        return self.tablet.encode()


class SqliteWriter(Computation):
    """The same table written by a plain computation, without the sink hooks: one transaction
    per record, straight from ``process_record``, fenced by ``ctx.tablet`` and
    ``ctx.sequencer_token``. This is the pattern for any computation that calls an external
    system itself. A record may be written more than once (user code runs again after a
    failure), which the upsert makes harmless. A refused write raises in user code: the
    record is retried, then dead-lettered, in a batch that never commits (it is a zombie's).
    Its tablet is claimed by its first write, not when it opens."""

    def setup(self, params: Mapping[str, str]) -> None:
        super().setup(params)
        self.path, self.table = _params(params, "SqliteWriter")
        self.db: sqlite3.Connection | None = None

    def process_record(self, ctx: Context, record: Record) -> None:
        if self.db is None:
            self.db = connect(self.path, self.table)
        write_fenced(self.db, self.table, ctx.tablet, ctx.sequencer_token,
                     [(_text(record.key), _text(record.value))])
