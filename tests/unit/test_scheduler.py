"""Properties of tablet placement (master/scheduler.py `place`)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from master.scheduler import Ownership, TabletKey, place

WORKERS = [f"w{i}" for i in range(6)]
# Owners in `current` may be live workers, dead workers, or nobody ("").
OWNER_NAMES = [*WORKERS, "dead0", "dead1", ""]

tablet_keys = st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 15))


@st.composite
def cluster_states(draw: st.DrawFn) -> tuple[list[TabletKey], dict[TabletKey, Ownership], list[str]]:
    tablets = draw(st.lists(tablet_keys, max_size=40))
    # `current` may know tablets that are no longer in the topology, and miss new ones.
    known = draw(st.lists(st.sampled_from(tablets), unique=True)) if tablets else []
    known += draw(st.lists(tablet_keys, max_size=5))
    current = {
        t: Ownership(draw(st.sampled_from(OWNER_NAMES)), draw(st.integers(0, 50)))
        for t in known
    }
    live = draw(st.lists(st.sampled_from(WORKERS), max_size=6))
    return tablets, current, live


def _loads(result: dict[TabletKey, Ownership], live: set[str]) -> Counter[str]:
    loads: Counter[str] = Counter({w: 0 for w in live})
    loads.update(o.worker for o in result.values())
    return loads


@given(cluster_states())
def test_every_tablet_goes_to_a_live_worker(state) -> None:
    tablets, current, live = state
    result = place(tablets, current, live)
    assert set(result) == set(tablets)
    if live:
        assert all(o.worker in set(live) for o in result.values())


@given(cluster_states())
def test_loads_differ_by_at_most_one(state) -> None:
    tablets, current, live = state
    if not live:
        return
    loads = _loads(place(tablets, current, live), set(live))
    assert set(loads) == set(live)
    assert max(loads.values()) - min(loads.values()) <= 1


@given(cluster_states())
def test_owner_within_quota_keeps_tablet_and_token(state) -> None:
    tablets, current, live = state
    live_set = set(live)
    if not live_set:
        return
    result = place(tablets, current, live)
    base = len(set(tablets)) // len(live_set)
    held = Counter(current[t].worker for t in set(tablets) if t in current)
    for t in set(tablets):
        own = current.get(t)
        if own is not None and own.worker in live_set and held[own.worker] <= base:
            assert result[t] == own, f"{t} moved from {own} to {result[t]}"


@given(cluster_states())
def test_placement_moves_as_few_live_owned_tablets_as_possible(state) -> None:
    """Extras go to the most loaded workers, so the number of tablets kept is maximal."""
    tablets, current, live = state
    live_set = set(live)
    if not live_set:
        return
    tablets_set = set(tablets)
    result = place(tablets, current, live)
    held = Counter(current[t].worker for t in tablets_set if t in current and current[t].worker in live_set)
    base, extra = divmod(len(tablets_set), len(live_set))
    by_load = sorted((held[w] for w in live_set), reverse=True)
    best = sum(min(n, base + (1 if i < extra else 0)) for i, n in enumerate(by_load))
    kept = sum(1 for t in tablets_set if t in current and current[t].worker in live_set
               and result[t].worker == current[t].worker)
    assert kept == best


@given(cluster_states())
def test_owner_change_increments_token_by_exactly_one(state) -> None:
    tablets, current, live = state
    result = place(tablets, current, live)
    for t, new in result.items():
        old = current.get(t)
        old_worker, old_token = (old.worker, old.token) if old else ("", 0)
        if new.worker and new.worker != old_worker:
            assert new.token == old_token + 1, (t, old, new)
        else:
            # Same owner, or nobody (no live workers): the token is kept.
            assert new.token == old_token, (t, old, new)


@given(cluster_states())
def test_tokens_never_decrease(state) -> None:
    tablets, current, live = state
    result = place(tablets, current, live)
    for t, new in result.items():
        if t in current:
            assert new.token >= current[t].token


@given(cluster_states())
def test_no_workers_keeps_tokens_and_owns_nothing(state) -> None:
    tablets, current, _ = state
    result = place(tablets, current, [])
    assert set(result) == set(tablets)
    for t, o in result.items():
        assert o.worker == ""
        assert o.token == (current[t].token if t in current else 0)


@given(cluster_states())
def test_placement_is_stable(state) -> None:
    """Placing again with nothing changed moves nothing and issues no token."""
    tablets, current, live = state
    first = place(tablets, current, live)
    assert place(tablets, first, live) == first


@settings(max_examples=50, deadline=None)
@given(
    st.lists(tablet_keys, min_size=1, max_size=30),
    st.lists(st.lists(st.sampled_from(WORKERS), max_size=6), min_size=1, max_size=8),
)
def test_tokens_strictly_increase_over_a_history_of_changes(tablets, worker_sets) -> None:
    """Through joins, deaths and empty clusters, a tablet never sees a token twice for two owners."""
    current: dict[TabletKey, Ownership] = {}
    issued: dict[TabletKey, dict[int, str]] = {t: {} for t in tablets}
    for live in worker_sets:
        nxt = place(tablets, current, live)
        for t, o in nxt.items():
            prev = current.get(t)
            assert prev is None or o.token >= prev.token
            if o.worker:
                owner = issued[t].setdefault(o.token, o.worker)
                assert owner == o.worker, f"token {o.token} of {t} issued to {owner} and {o.worker}"
        current = nxt


def test_orphans_of_a_dead_worker_get_new_tokens() -> None:
    tablets = [("c", i) for i in range(4)]
    current = {("c", 0): Ownership("w0", 3), ("c", 1): Ownership("w0", 7),
               ("c", 2): Ownership("w1", 1), ("c", 3): Ownership("w1", 2)}
    result = place(tablets, current, ["w1", "w2"])
    assert result[("c", 2)] == Ownership("w1", 1)
    assert result[("c", 3)] == Ownership("w1", 2)
    assert result[("c", 0)] == Ownership("w2", 4)
    assert result[("c", 1)] == Ownership("w2", 8)
