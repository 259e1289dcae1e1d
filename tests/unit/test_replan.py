"""Properties of replicated placement (master/scheduler.py `replan`): the safety rules of
DESIGN.md §5 hold for any cluster state."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from master.scheduler import Ownership, TabletKey, replan

WORKERS = [f"w{i}" for i in range(5)]
NAMES = [*WORKERS, "dead0", "dead1"]
tablet_keys = st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 7))


@st.composite
def ownerships(draw: st.DrawFn) -> Ownership:
    token = draw(st.integers(0, 9))
    if token == 0:
        return Ownership("", 0)
    primary = draw(st.sampled_from([*NAMES, ""]))
    followers = tuple(draw(st.lists(st.sampled_from([n for n in NAMES if n != primary]), unique=True,
                                    max_size=3)))
    synced = tuple(f for f in followers if draw(st.booleans()))
    in_sync = ((primary,) if primary else ()) + synced
    if not primary:
        in_sync = tuple(draw(st.lists(st.sampled_from(NAMES), unique=True, min_size=1, max_size=2)))
    return Ownership(primary, token, followers if primary else (), in_sync)


@st.composite
def states(draw: st.DrawFn) -> tuple[list[TabletKey], dict[TabletKey, Ownership], list[str], dict[TabletKey, int]]:
    tablets = draw(st.lists(tablet_keys, unique=True, max_size=12))
    current = {t: draw(ownerships()) for t in tablets if draw(st.booleans())}
    live = draw(st.lists(st.sampled_from(WORKERS), unique=True, max_size=5))
    replication = {t: draw(st.integers(1, 3)) for t in tablets}
    return tablets, current, live, replication


@settings(max_examples=300)
@given(states(), st.data())
def test_replan_keeps_the_safety_rules(state, data) -> None:  # type: ignore[no-untyped-def]
    tablets, current, live, replication = state
    pinned = {t: data.draw(st.sampled_from(WORKERS)) for t in tablets if data.draw(st.booleans())}
    draining = set(data.draw(st.lists(st.sampled_from(live), unique=True))) if live else set()
    unheard = set(data.draw(st.lists(st.sampled_from(live), unique=True))) if live else set()
    out = replan(tablets, current, live, replication, {w: "z" + w[-1] for w in WORKERS if w != "w0"}, pinned,
                 draining, unheard)
    assert set(out) == set(tablets)
    for t, new in out.items():
        old = current.get(t)
        assert new.token >= (old.token if old else 0), "tokens never move backwards"
        if old is not None and old.existed:
            if new.worker and new.worker != old.worker:
                # A tablet that existed changes primary only to a copy of its in-sync set,
                # under the next token; the other members of its new in-sync set were in the
                # old one (the new primary has acknowledged nothing yet).
                assert new.worker in old.in_sync, (old, new)
                assert new.token == old.token + 1 and set(new.in_sync) <= set(old.in_sync), (old, new)
            if not new.worker:
                assert not any(w in live for w in old.in_sync), "an in-sync copy was alive"
                assert new.in_sync == old.in_sync, "a waiting tablet remembers its copies"
        if new.worker:
            assert new.worker in live
            assert new.in_sync[0] == new.worker
            assert set(new.in_sync) <= {new.worker, *new.followers}
            assert new.worker not in new.followers and len(set(new.followers)) == len(new.followers)
            assert all(f in live and f not in draining for f in new.followers)
            old_copies = set(old.followers) | {old.worker} if old is not None else set()
            assert all(f not in unheard or f in old_copies for f in new.followers), "no new copy on an unheard worker"
            if new.worker in unheard and (old is None or old.worker != new.worker):
                assert old is not None and all(w in unheard | draining for w in old.in_sync if w in live)
            if new.worker in draining:  # only what it had, or a failover with no other copy
                assert old is not None and (old.worker == new.worker or all(
                    w in draining for w in old.in_sync if w in live)), (old, new)
            if old is not None and old.existed and old.worker == new.worker:
                # The leader only ever drops members of a live primary's in-sync set.
                assert set(new.in_sync) <= set(old.in_sync)
            wanted = replication.get(t, 1) - 1
            eligible = [w for w in live if w not in draining and w not in unheard and w != new.worker]
            assert len(new.followers) >= min(wanted, len(eligible))


def test_a_new_tablets_copies_start_in_sync_and_spread_over_zones() -> None:
    zones = {"a": "z1", "b": "z1", "c": "z2"}
    out = replan([("c", 0)], {}, ["a", "b", "c"], {("c", 0): 2}, zones)
    own = out[("c", 0)]
    assert own.token == 1 and len(own.followers) == 1
    assert set(own.in_sync) == {own.worker, *own.followers}
    assert zones[own.worker] != zones[own.followers[0]]


def test_failover_promotes_an_in_sync_follower_never_a_catching_up_one() -> None:
    cur = {("c", 0): Ownership("dead", 4, ("b", "c"), ("dead", "c"))}
    own = replan([("c", 0)], cur, ["b", "c"], {("c", 0): 2})[("c", 0)]
    assert own.worker == "c" and own.token == 5 and own.in_sync == ("c",)


def test_a_moved_tablet_keeps_its_old_primary_in_sync_until_the_new_one_commits() -> None:
    """The chaos suite (seed 107): a merge moved a tablet onto a worker killed a moment
    before; alone in the in-sync set, it left the tablet unavailable when its lease ran out,
    though the old primary held every acknowledged commit."""
    cur = {("c", 0): Ownership("a", 3, ("b",), ("a", "b"))}
    moved = replan([("c", 0)], cur, ["a", "b"], {("c", 0): 2}, pinned={("c", 0): "b"})[("c", 0)]
    assert moved.worker == "b" and moved.token == 4 and moved.in_sync == ("b", "a")
    back = replan([("c", 0)], {("c", 0): moved}, ["a"], {("c", 0): 2})[("c", 0)]
    assert back.worker == "a" and back.token == 5, "the old primary's copy is promoted again"


def test_no_in_sync_copy_left_means_unassigned_until_one_returns() -> None:
    cur = {("c", 0): Ownership("dead", 4, ("b",), ("dead",))}
    own = replan([("c", 0)], cur, ["b"], {("c", 0): 2})[("c", 0)]
    assert own.worker == "" and own.in_sync == ("dead",) and own.token == 4
    back = replan([("c", 0)], {("c", 0): own}, ["b", "dead"], {("c", 0): 2})[("c", 0)]
    assert back.worker == "dead" and back.token == 5


def test_a_move_catches_the_target_up_before_promoting_it() -> None:
    cur = {("c", 0): Ownership("a", 3, ("b",), ("a", "b"))}
    step = replan([("c", 0)], cur, ["a", "b", "c"], {("c", 0): 2}, pinned={("c", 0): "c"})[("c", 0)]
    assert step.worker == "a" and step.token == 3
    assert set(step.followers) == {"b", "c"}, "the in-sync follower stays while the target catches up"
    synced = Ownership(step.worker, step.token, step.followers, (*step.in_sync, "c"))
    done = replan([("c", 0)], {("c", 0): synced}, ["a", "b", "c"], {("c", 0): 2}, pinned={("c", 0): "c"})
    assert done[("c", 0)].worker == "c" and done[("c", 0)].token == 4


def test_a_draining_worker_keeps_serving_until_a_target_caught_up_and_holds_no_copies() -> None:
    cur = {("c", 0): Ownership("a", 3, (), ("a",)), ("c", 1): Ownership("b", 2, ("a",), ("b", "a"))}
    step = replan(list(cur), cur, ["a", "b"], {("c", 0): 1, ("c", 1): 2}, draining=["a"])
    # replication=1: the target catches up as a follower; "a" still serves meanwhile.
    assert step[("c", 0)].worker == "a" and step[("c", 0)].followers == ("b",)
    # "a" holds no follower copy any more (and gets none new).
    assert "a" not in step[("c", 1)].followers
    synced = {**step, ("c", 0): Ownership("a", 3, ("b",), ("a", "b"))}
    done = replan(list(cur), synced, ["a", "b"], {("c", 0): 1, ("c", 1): 2}, draining=["a"])
    assert done[("c", 0)].worker == "b" and done[("c", 0)].token == 4 and done[("c", 0)].followers == ()


def test_a_failover_onto_a_pinned_copy_is_one_promotion() -> None:
    """Hypothesis found it: the dead primary's tablet was promoted to one in-sync copy, then
    promoted again to the copy an operator pinned it to, skipping a token in one replan."""
    t = ("a", 1)
    old = Ownership("w4", 1, ("w0", "w2", "w3"), ("w4", "w2", "w3"))
    out = replan([("a", 0), t], {t: old}, ["w0", "w2", "w3"], {("a", 0): 1, t: 1}, pinned={t: "w3"})
    assert out[t].worker == "w3" and out[t].token == 2 and set(out[t].in_sync) <= set(old.in_sync)


def test_health_counts_only_copies_on_live_workers() -> None:
    """An expired worker is removed before its tablets move (two writes): in between, its
    copies must not make a tablet look whole (the chaos suite then lost its last copy)."""
    from master.scheduler import replication_health

    own = Ownership("a", 5, ("b",), ("a", "b"))
    assert replication_health(own, 2, {"a", "b"}) == "ok"
    assert replication_health(own, 2, {"b", "c"}) == "under-replicated"  # "a" expired, not moved yet
    assert replication_health(own, 2, {"a", "c"}) == "under-replicated"  # its follower expired
    assert replication_health(own, 2, {"c"}) == "unavailable"
    assert replication_health(Ownership("a", 5, (), ("a",)), 1, {"a"}) == "ok"


def test_a_tablet_a_savepoint_copies_keeps_its_primary_unless_it_dies() -> None:
    """Lifecycle chaos seed 403: a new leader moved a tablet while the client copied it, and
    the savepoint failed ("it moved"). A move waits (its target catching up meanwhile); a
    failover does not."""
    t = ("c", 0)
    cur = {t: Ownership("a", 3, ("b",), ("a", "b"))}
    held = replan([t], cur, ["a", "b", "c"], {t: 2}, pinned={t: "b"}, frozen=[t])[t]
    assert held == cur[t]
    catching_up = replan([t], cur, ["a", "b", "c"], {t: 2}, pinned={t: "c"}, frozen=[t])[t]
    assert catching_up.worker == "a" and catching_up.token == 3 and "c" in catching_up.followers
    assert replan([t], cur, ["a", "b", "c"], {t: 2}, pinned={t: "b"})[t].worker == "b", "unfrozen, it moves"
    failover = replan([t], cur, ["b", "c"], {t: 2}, frozen=[t])[t]
    assert failover.worker == "b" and failover.token == 4
    # A draining primary's tablet moves all the same: its worker is leaving, and would only
    # wait out its drain timeout before a failover.
    drained = replan([t], cur, ["a", "b", "c"], {t: 2}, draining=["a"], frozen=[t])[t]
    assert drained.worker == "b" and drained.token == 4


def test_a_move_with_a_follower_to_spare_keeps_the_follower_not_the_old_primary() -> None:
    """The chaos suite (seed 107 again): a move promoted its caught-up target and kept the old
    primary as the one follower, dropping the follower. The old primary's copy needed a
    snapshot at the new primary's first commit (it may hold a commit nobody acknowledged), so
    the tablet had one copy until then; the new primary was killed meanwhile: unavailable."""
    cur = {("c", 0): Ownership("a", 3, ("b", "c"), ("a", "b", "c"))}
    moved = replan([("c", 0)], cur, ["a", "b", "c"], {("c", 0): 2}, pinned={("c", 0): "c"})[("c", 0)]
    assert (moved.worker, moved.token, moved.followers, moved.in_sync) == ("c", 4, ("b",), ("c", "b"))
    failover = replan([("c", 0)], {("c", 0): moved}, ["a", "b"], {("c", 0): 2})[("c", 0)]
    assert failover.worker == "b", "the follower kept is promoted when the new primary dies"
    unheard = replan([("c", 0)], cur, ["a", "b", "c"], {("c", 0): 2}, pinned={("c", 0): "c"}, unheard=["b"])[("c", 0)]
    assert unheard.followers == ("a",), "a follower not heard from yet (it may be dead) goes before the old primary"
