"""Record identifiers (runtime/record.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runtime.record import ID_BYTES, derived_id, producer_prefix, sequence_id

seqs = st.integers(0, 2**64 - 1)
parts = st.lists(st.binary(max_size=20), max_size=4)


def test_producer_prefix_is_8_stable_bytes() -> None:
    p = producer_prefix("counter/3")
    assert len(p) == 8
    assert p == producer_prefix("counter/3")
    assert p != producer_prefix("counter/4")


@given(st.text(), seqs)
def test_sequence_id_is_16_bytes_and_deterministic(producer: str, seq: int) -> None:
    rid = sequence_id(producer_prefix(producer), seq)
    assert len(rid) == ID_BYTES == 16
    assert rid == sequence_id(producer_prefix(producer), seq)


@given(st.text(), seqs, st.text(), seqs)
def test_sequence_ids_are_distinct_for_distinct_inputs(p1: str, s1: int, p2: str, s2: int) -> None:
    a = sequence_id(producer_prefix(p1), s1)
    b = sequence_id(producer_prefix(p2), s2)
    assert (a == b) == ((producer_prefix(p1), s1) == (producer_prefix(p2), s2))


@given(st.text(), seqs, seqs)
def test_sequence_ids_of_one_producer_sort_by_sequence(producer: str, s1: int, s2: int) -> None:
    prefix = producer_prefix(producer)
    assert (sequence_id(prefix, s1) < sequence_id(prefix, s2)) == (s1 < s2)


@given(parts)
def test_derived_id_is_16_bytes_and_deterministic(ps: list[bytes]) -> None:
    rid = derived_id(*ps)
    assert len(rid) == ID_BYTES
    assert rid == derived_id(*ps)


@given(parts, parts)
def test_derived_ids_are_distinct_for_distinct_parts(a: list[bytes], b: list[bytes]) -> None:
    assert (derived_id(*a) == derived_id(*b)) == (a == b)


def test_derived_id_separates_part_boundaries() -> None:
    assert derived_id(b"ab", b"c") != derived_id(b"a", b"bc")
    assert derived_id(b"ab") != derived_id(b"a", b"b")
    assert derived_id(b"") != derived_id()


def test_the_start_and_end_of_time_are_defined_once() -> None:
    """runtime/record.py's MIN_TIME and END_OF_TIME; other modules import them. Left: the
    storage's order-preserving offset, Spark's signed 64-bit column checks (not time bounds),
    and the profile driver, which also runs an older commit's runtime (bench/ab.py)."""
    import os
    import re

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    allowed = {"runtime/record.py", "worker/storage.py", "spark_bridge/codecs.py", "bench/profile.py"}
    found = []
    for package in ("runtime", "master", "worker", "injectors", "spark_bridge", "cli", "bench", "examples"):
        for d, _, files in os.walk(os.path.join(root, package)):
            for f in files:
                path = os.path.relpath(os.path.join(d, f), root)
                if f.endswith(".py") and "_pb2" not in f and path not in allowed:
                    with open(os.path.join(d, f)) as text:
                        found += [f"{path}: {line.strip()}" for line in text if re.search(r"1\s*<<\s*63", line)]
    assert found == []
