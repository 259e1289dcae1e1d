"""Word count, two ways.

As a :class:`~runtime.Dataflow` (:func:`flow`), the way most jobs are written::

    lines -> flat_map(words) -> key_by(word) -> map(one) -> reduce(add) -> sink(FileSink)

As classic computations wired into a :class:`~runtime.Topology` (:func:`topology`), the escape
hatch for anything a flow cannot say: lines -> splitter -> words (keyed by word) -> counter ->
counts -> file. Both write the same counts.
"""

from __future__ import annotations

from typing import Literal

from millstream import Computation, Context, Dataflow, Record, Topology, codecs
from millstream.sinks import FileSink


def words(line: str) -> list[str]:
    return line.lower().split()


def word(w: str) -> str:
    return w


def one(_: str) -> int:
    return 1


def add(a: int, b: int) -> int:
    return a + b


def flow(output_dir: str, name: str = "wordcount", key_ranges: int = 4) -> Dataflow:
    """The word count as a flow: a running count per word, every new count to ``output_dir``."""
    f = Dataflow(name, key_ranges=key_ranges)
    (f.input("lines", codec=codecs.STR)
     .flat_map(words)
     .key_by(word)
     .map(one)
     .reduce(add, name=f"{name}.counts")
     .sink(FileSink, name=f"{name}.sink", path=output_dir))
    return f


class Splitter(Computation):
    """Emits each word of a line, keyed by the word."""

    def process_record(self, ctx: Context, record: Record) -> None:
        for word in record.value.decode().split():
            ctx.produce("words", b"1", key=word.lower().encode())


class Counter(Computation):
    """Keeps a running count per word in state and emits every new count."""

    def process_record(self, ctx: Context, record: Record) -> None:
        n = int(ctx.state.get() or b"0") + 1
        ctx.state.set(str(n).encode())
        ctx.produce("counts", str(n).encode())


def topology(output_dir: str, name: str = "wordcount", key_ranges: int = 4,
             productions: Literal["strong", "weak"] = "strong") -> Topology:
    topo = Topology(name)
    topo.add_computation("splitter", Splitter, inputs={"lines": None},
                         outputs=["words"], key_ranges=key_ranges, productions=productions)
    topo.add_computation("counter", Counter, inputs={"words": None},
                         outputs=["counts"], key_ranges=key_ranges, productions=productions)
    topo.add_computation("counts_sink", FileSink, inputs={"counts": None},
                         params={"path": output_dir}, key_ranges=2)
    return topo


def final_counts(rows: list[dict[str, object]]) -> dict[str, int]:
    """The last count per word, from the sink's rows; checks no count appears twice."""
    seen: dict[str, set[int]] = {}
    for row in rows:
        word, n = str(row["key"]), int(str(row["value"]))
        if n in seen.setdefault(word, set()):
            raise AssertionError(f"count {n} of {word!r} was emitted twice")
        seen[word].add(n)
    for word, ns in seen.items():
        if ns != set(range(1, max(ns) + 1)):
            raise AssertionError(f"counts of {word!r} have gaps: {sorted(ns)[:20]}")
    return {w: max(ns) for w, ns in seen.items()}
