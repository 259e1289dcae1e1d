"""Tablet placement: pure functions from the cluster's state to an assignment.

:func:`place` balances primaries: tablets stay where they are while their owner lives;
orphans go to the least loaded workers; then the most loaded give tablets to the least
loaded until no two workers differ by more than one.

:func:`replan` adds replication (DESIGN.md §5, docs/replication.md): a tablet whose
primary is gone is promoted to a live copy of its in-sync set, or stays unassigned if
none is left (it is never opened empty); a primary moves only to an in-sync copy (a
target that is not yet in sync first becomes a follower and catches up); and every
tablet gets ``replication - 1`` followers, in other zones when possible. Every change
of primary issues the tablet's next sequencer token (tokens never move backwards) and
leaves the new primary alone in the in-sync set: the other copies catch up again.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass

from runtime.routing import TabletKey


@dataclass(frozen=True, slots=True)
class Ownership:
    """Who owns a tablet, under which sequencer token ("" = nobody), and its copies.

    ``in_sync`` holds the primary and the followers that hold every acknowledged commit;
    for an unassigned tablet it names the (gone) workers whose copies may still be
    promoted if they come back."""

    worker: str
    token: int
    followers: tuple[str, ...] = ()
    in_sync: tuple[str, ...] = ()

    @property
    def existed(self) -> bool:
        """Whether some copy of the tablet was ever opened (then it is never opened empty)."""
        return self.token > 0

    def promoted(self, worker: str) -> Ownership:
        """``worker`` (a copy in the in-sync set) becomes primary under the next token; the
        other copies stay followers and catch up from it.

        The other members of the in-sync set (the old primary included, on a move) stay in
        it: each still holds every acknowledged commit, and the new primary acknowledges
        nothing until each has taken its commits or been removed through the leader (a copy
        built under the old token answers NEED_SNAPSHOT, so it is removed before the first
        commit). So a new primary that dies before it commits (a move onto a worker killed
        a moment before) leaves a copy to fail over to, not an unavailable tablet."""
        followers = tuple(f for f in (*self.followers, self.worker) if f and f != worker)
        return Ownership(worker, self.token + 1, followers,
                         (worker, *(w for w in self.in_sync if w != worker and w in followers)))


def place(
    tablets: Iterable[TabletKey],
    current: Mapping[TabletKey, Ownership],
    live_workers: Iterable[str],
) -> dict[TabletKey, Ownership]:
    """The new ownership of every tablet; unchanged entries keep their token."""
    workers = sorted(set(live_workers))
    tablets = sorted(set(tablets))
    if not workers:
        return {t: Ownership("", current[t].token if t in current else 0) for t in tablets}
    load: dict[str, list[TabletKey]] = {w: [] for w in workers}
    orphans: list[TabletKey] = []
    for t in tablets:
        own = current.get(t)
        if own is not None and own.worker in load:
            load[own.worker].append(t)
        else:
            orphans.append(t)
    base, extra = divmod(len(tablets), len(workers))
    # The most loaded workers keep the extra tablets, so fewer tablets move.
    by_load = sorted(workers, key=lambda w: (-len(load[w]), w))
    quota = {w: base + (1 if i < extra else 0) for i, w in enumerate(by_load)}
    for w in workers:
        while len(load[w]) > quota[w]:
            orphans.append(load[w].pop())
    orphans.sort()
    for t in orphans:
        w = min(workers, key=lambda w: (len(load[w]) - quota[w], len(load[w]), w))
        load[w].append(t)
    result: dict[TabletKey, Ownership] = {}
    for w, ts in load.items():
        for t in ts:
            old = current.get(t)
            if old is not None and old.worker == w:
                result[t] = old
            else:
                result[t] = Ownership(w, (old.token if old else 0) + 1)
    return result


def replication_health(o: Ownership, wanted: int, live: Container[str]) -> str:
    """``ok``; ``under-replicated`` (fewer live in-sync copies than wanted: a follower
    catching up, fewer live workers than copies, or a primary that just expired and whose
    failover is not written yet); ``unavailable`` (no live in-sync copy: it waits for one to
    come back, never opened empty); ``unassigned`` (new, no worker yet). Only copies on
    ``live`` workers count: an expired worker is removed before its tablets are moved (two
    writes), and in between its copies must not make a tablet look whole."""
    if not o.worker:
        return "unavailable" if o.existed else "unassigned"
    copies = sum(1 for w in o.in_sync if w in live)
    if o.worker not in live and not copies:
        return "unavailable"
    return "ok" if o.worker in live and copies >= wanted else "under-replicated"


def _pick(candidates: Sequence[str], load: Mapping[str, int], avoid_zones: set[str],
          zones: Mapping[str, str]) -> str:
    """The least loaded candidate, preferring one whose zone holds no copy yet."""
    return min(candidates, key=lambda w: (zones.get(w, "") in avoid_zones and zones.get(w, "") != "",
                                          load.get(w, 0), w))


def replan(tablets: Iterable[TabletKey], current: Mapping[TabletKey, Ownership], live_workers: Iterable[str],
           replication: Mapping[TabletKey, int], zones: Mapping[str, str] | None = None,
           pinned: Mapping[TabletKey, str] | None = None,
           draining: Iterable[str] = (), unheard: Iterable[str] = (),
           frozen: Iterable[TabletKey] = ()) -> dict[TabletKey, Ownership]:
    """The next ownership of every tablet, with its followers and in-sync set.

    ``replication``: copies wanted per tablet (primary included; missing = 1).
    ``pinned``: tablets an operator moves, to the worker they go to.
    ``draining``: live workers on their way out: they keep their primaries until a target
    has caught up (then it is promoted), hold no followers, and get nothing new.
    ``unheard``: live workers this leader has not heard from yet (after a failover every
    known worker counts as alive for a lease period, the dead too): they keep what they
    have, but no move, promotion or new copy goes to them while another worker can take it.
    ``frozen``: tablets a savepoint is copying: their primary stays while it lives (a balance
    move or an operator's pin waits, its target catching up meanwhile); not a failover, nor
    a draining primary's move (its worker is leaving: the savepoint fails rather than the
    drain waiting out its timeout).
    """
    zones = zones or {}
    pinned = pinned or {}
    leaving = set(draining)
    alive = set(live_workers)
    live = sorted(alive - leaving)
    eligible = set(live) - set(unheard)  # may take new copies
    tablets = sorted(set(tablets))
    frozen = set(frozen)
    out: dict[TabletKey, Ownership] = {}
    assignable: dict[TabletKey, Ownership] = {}
    for t in tablets:
        own = current.get(t)
        if own is None or not own.existed:
            continue  # new: placed below
        if own.worker in alive:
            in_sync = (own.worker, *(f for f in own.in_sync if f != own.worker and f in alive
                                    and f in own.followers))
            assignable[t] = Ownership(own.worker, own.token, own.followers, in_sync)
            continue
        candidates = [w for w in own.in_sync if w in alive]
        if candidates:  # failover: the least loaded in-sync copy (a draining one only if alone)
            counts = {w: sum(1 for o in assignable.values() if o.worker == w) for w in candidates}
            pin = pinned.get(t)
            # A copy an operator pinned it to, if it can take it: promoted once, not promoted
            # here and then again below to follow the pin.
            assignable[t] = own.promoted(pin if pin in candidates and pin in eligible else min(
                candidates, key=lambda w: (w in leaving, w not in eligible, counts[w], w)))
        else:  # no in-sync copy left: unassigned until one comes back
            out[t] = Ownership("", own.token, (), own.in_sync)
    new = [t for t in tablets if t not in out and t not in assignable]
    desired = place([*assignable, *new], assignable, live) if live else {}
    load: dict[str, int] = {w: 0 for w in live}
    for t in [*assignable, *new]:
        own = assignable.get(t)
        want = pinned.get(t) if pinned.get(t) in eligible else (desired[t].worker if t in desired else "")
        if want and want not in eligible and (own is None or want != own.worker):
            want = ""  # not heard from yet: it may be dead (placed again once it reports)
        if own is None:
            if not want:
                out[t] = Ownership("", 0)
                continue
            own = Ownership(want, 1, (), (want,))
        elif want and want != own.worker:
            if want in own.in_sync and own.token == current[t].token and (t not in frozen or own.worker in leaving):
                own = own.promoted(want)  # (one promotion per replan: a failover above was one)
            elif want not in own.followers:  # catch it up first, then promote it
                own = Ownership(own.worker, own.token, (*own.followers, want), own.in_sync)
        out[t] = own
        load[own.worker] = load.get(own.worker, 0) + 1
    for t, own in list(out.items()):
        if not own.worker:
            continue
        n = max(1, replication.get(t, 1)) - 1
        keep = [f for f in own.followers if f in alive and f not in leaving and f != own.worker]
        target = pinned.get(t) if pinned.get(t) in eligible else (desired[t].worker if t in desired else "")
        # Too many (after a move or a lower factor): drop copies not in sync first, never
        # the move's target, and never an in-sync copy while the target catches up (until
        # then the tablet has one follower more than it needs). Of in-sync copies, one on a
        # worker not heard from yet first (it may be dead), then the old primary's, on a move:
        # a follower's copy continues under the new primary, but the old primary's may not (it
        # may hold the commit of the batch it closed on, which nobody acknowledged, or still be
        # closing at the new primary's first commit), and then needs a snapshot. Kept instead of
        # a follower, it left the tablet one copy until that snapshot (chaos seed 107: the new
        # primary killed meanwhile, the tablet unavailable).
        previous = current[t].worker if t in current else ""
        while len(keep) > n:
            synced = [f for f in keep if f in own.in_sync]
            drop = [f for f in keep if f != target and (f not in own.in_sync or len(synced) > n)]
            if not drop:
                break
            drop.sort(key=lambda f: (f in own.in_sync, f in eligible, f != previous, -load.get(f, 0)))
            keep.remove(drop[0])
        while len(keep) < n:
            free = [w for w in live if w != own.worker and w not in keep and w in eligible]
            if not free:
                break
            used = {zones.get(w, "") for w in (own.worker, *keep)}
            keep.append(_pick(free, load, used, zones))
        for f in keep:
            load[f] = load.get(f, 0) + 1
        # A new tablet's copies are all empty, so all in sync: the followers start with an
        # empty copy, and a primary lost at once is replaced by one of them.
        fresh = t not in current or not current[t].existed
        in_sync = (own.worker, *(f for f in keep if fresh or f in own.in_sync))
        out[t] = Ownership(own.worker, own.token, tuple(keep), in_sync)
    return out
