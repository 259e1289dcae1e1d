"""The due index of a flow's event-time steps (runtime/flows/due.py): a call that took what
was due and added to it, undone, leaves it as it was, the order of what is due included (the
worker's next try of a firing, and a firing given up, take what the failed try took: the same
windows, from the front). (An entry a call moved to another due time goes back to the end of
its old one: order within a due time only decides which window a firing takes first, and a
firing's call takes, it moves nothing in its own index.)"""

from __future__ import annotations

import random

from runtime.flows.due import DueIndex


def _snapshot(index: DueIndex) -> tuple[list[tuple[int, list[tuple[bytes, int]]]], dict[tuple[bytes, int], int]]:
    return sorted((t, list(e)) for t, e in index.due.items() if e), dict(index.where)


def test_a_firing_undone_leaves_what_it_took_in_front_in_its_order() -> None:
    index = DueIndex()
    for i in range(40):
        index.add(10, b"k%02d" % i, 0)
    index.commit()
    first = index.take(10, 16) + index.take(10, 16)  # a firing in two chunks that then raised
    index.rollback()
    again = index.take(10, 32)
    assert again == first, "the next try takes other windows than the failed one did"


def test_a_call_that_takes_and_adds_undone_leaves_the_index_as_it_was() -> None:
    rng = random.Random(7)
    index = DueIndex()
    added = 0
    for _ in range(300):
        before = _snapshot(index)
        for _ in range(rng.randrange(1, 6)):  # one call: new entries and takes, in any order
            if rng.random() < 0.5:
                added += 1
                index.add(rng.randrange(5), b"k%d" % added, rng.randrange(2))
            else:
                index.take(rng.randrange(5), rng.choice([None, 1, 3]))
        if rng.random() < 0.5:
            index.rollback()
            assert _snapshot(index) == before
        else:
            index.commit()
        assert {t for t, e in index.due.items() if e} <= set(index._heap), "a due time out of the heap"


def test_tries_undone_one_window_at_a_time_leave_one_heap_entry() -> None:
    """The tries of a firing that takes one window per call, each undone: the due time never
    left the heap, so putting what they took back adds nothing to it."""
    index = DueIndex()
    for i in range(3):
        index.add(10, b"k%d" % i, 0)
    index.commit()
    for _ in range(50):
        assert index.take(10, 1) == [(10, b"k0", 0)]
        index.rollback()
    assert index._heap == [10]
