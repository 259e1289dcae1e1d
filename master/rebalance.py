"""The automatic rebalancing policy: when to split a hot range and merge cold neighbours.

Opt-in, per computation (``rebalance=True``) or for the cluster (master ``--rebalance``).
Load is records per second per tablet, from the ``processed`` counts in the workers'
progress reports, over the last ``window_s``. A computation's *fair share* is its total
load over the live workers (its ranges could spread over all of them).

- **Split** the hottest range whose load has stayed above ``split_above`` x the fair share
  (and above ``min_rate``) for ``hold_s``; one half then moves to the least loaded worker.
- **Merge** two adjacent ranges whose load together has stayed below ``merge_below`` x the
  fair share (at least ``min_rate`` counts as fair) for ``hold_s``.
- **Hysteresis**: a merged pair is far below the split threshold, so it is not split back;
  a computation is left alone for ``cooldown_s`` after each change (its new ranges need
  reports); and a range a split did not divide (one half kept ``indivisible`` of the
  load: one hot key) is not split again for ``stuck_s``.

Pure: the leader feeds it reports and a clock and carries out what it returns
(master/reshard.py). Every decision carries its reason, for the log and status.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from runtime.routing import TabletKey


@dataclass(frozen=True)
class Policy:
    """Thresholds of the rebalancing policy (docs/rescaling.md)."""

    split_above: float = 1.5
    merge_below: float = 0.5
    min_rate: float = 200.0
    hold_s: float = 10.0
    cooldown_s: float = 30.0
    window_s: float = 5.0
    max_ranges: int = 64
    indivisible: float = 0.9
    stuck_s: float = 3600.0


@dataclass(frozen=True)
class Decision:
    """A split (``ranges`` = one id) or merge (two adjacent ids), and why."""

    kind: str
    computation: str
    ranges: tuple[int, ...]
    reason: str


@dataclass
class LoadMeter:
    """Records per second per tablet, from cumulative ``processed`` counts."""

    window_s: float = 5.0
    _samples: dict[TabletKey, tuple[int, deque[tuple[float, int]]]] = field(default_factory=dict)

    def observe(self, key: TabletKey, token: int, processed: int, now_ms: float) -> None:
        entry = self._samples.get(key)
        if entry is None or entry[0] != token:
            entry = self._samples[key] = (token, deque())
        samples = entry[1]
        samples.append((now_ms, processed))
        while len(samples) > 2 and samples[1][0] <= now_ms - self.window_s * 1000:
            samples.popleft()

    def rate(self, key: TabletKey, now_ms: float) -> float | None:
        """Records/s over the window (None: not reported long enough to say)."""
        entry = self._samples.get(key)
        if entry is None or len(entry[1]) < 2:
            return None
        (t0, n0), (t1, n1) = entry[1][0], entry[1][-1]
        if t1 - t0 < self.window_s * 500 or now_ms - t1 > self.window_s * 1000:
            return None
        return max(0, n1 - n0) * 1000 / (t1 - t0)

    def forget(self, key: TabletKey) -> None:
        self._samples.pop(key, None)


def candidates(ranges: Mapping[str, Sequence[tuple[int, int, int]]], rates: Mapping[TabletKey, float],
               workers: int, policy: Policy, stuck: Mapping[TabletKey, float] | None = None,
               now_ms: float = 0.0) -> list[Decision]:
    """What the policy would do now (before hysteresis in time). ``ranges``: per computation,
    its ranges as ``(id, start, end)``; every range must have a rate, or it is left alone."""
    out = []
    for c, rs in ranges.items():
        rs = sorted(rs, key=lambda r: r[1])
        if any((c, r) not in rates for r, _, _ in rs):
            continue  # a range without a measured load: wait for its reports
        total = sum(rates[(c, r)] for r, _, _ in rs)
        fair = total / max(1, workers)
        hot = [(rates[(c, r)], r) for r, lo, hi in rs
               if hi - lo >= 2 and rates[(c, r)] > policy.split_above * fair and rates[(c, r)] >= policy.min_rate
               and (stuck or {}).get((c, r), -1e18) <= now_ms]
        if hot and len(rs) < policy.max_ranges:
            rate, r = max(hot)
            out.append(Decision("split", c, (r,), f"{rate:.0f} rec/s, above {policy.split_above:g} x the fair "
                                f"share of {fair:.0f} rec/s ({total:.0f} rec/s over {workers} workers)"))
            continue
        cold = [(rates[(c, a)] + rates[(c, b)], a, b) for (a, _, _), (b, _, _) in zip(rs, rs[1:], strict=False)
                if rates[(c, a)] + rates[(c, b)] < policy.merge_below * max(fair, policy.min_rate)]
        if cold:
            rate, a, b = min(cold)
            out.append(Decision("merge", c, (a, b), f"{rate:.0f} rec/s together, below {policy.merge_below:g} x "
                                f"the fair share of {max(fair, policy.min_rate):.0f} rec/s"))
    return out


class Rebalancer:
    """Applies the policy over time: a candidate must hold for ``hold_s`` (and its computation
    be out of its cooldown) before it is returned."""

    def __init__(self, policy: Policy, load: LoadMeter | None = None) -> None:
        self.policy = policy
        self.load = load if load is not None else LoadMeter(policy.window_s)
        self._since: dict[tuple[str, str, tuple[int, ...]], float] = {}
        self._cooldown: dict[str, float] = {}
        self.stuck: dict[TabletKey, float] = {}      # ranges a split could not divide -> until
        self._children: dict[TabletKey, tuple[TabletKey, TabletKey]] = {}  # split -> its halves, to judge

    def decide(self, ranges: Mapping[str, Sequence[tuple[int, int, int]]], workers: int,
               now_ms: float) -> list[Decision]:
        rates = {}
        for c, rs in ranges.items():
            for r, _, _ in rs:
                rate = self.load.rate((c, r), now_ms)
                if rate is not None:
                    rates[(c, r)] = rate
        self._judge(rates, now_ms)
        found = candidates(ranges, rates, workers, self.policy, self.stuck, now_ms)
        keys = {(d.kind, d.computation, d.ranges) for d in found}
        self._since = {k: t for k, t in self._since.items() if k in keys}
        ready = []
        for d in found:
            k = (d.kind, d.computation, d.ranges)
            since = self._since.setdefault(k, now_ms)
            if now_ms - since >= self.policy.hold_s * 1000 and now_ms >= self._cooldown.get(d.computation, -1e18):
                ready.append(d)
        return ready

    def done(self, d: Decision, new_ids: Sequence[int], now_ms: float) -> None:
        """``d`` was carried out, making ``new_ids``."""
        self._cooldown[d.computation] = now_ms + self.policy.cooldown_s * 1000
        self._since = {k: t for k, t in self._since.items() if k[1] != d.computation}
        for r in d.ranges:
            self.load.forget((d.computation, r))
        if d.kind == "split" and len(new_ids) == 2:
            self._children[(d.computation, d.ranges[0])] = ((d.computation, new_ids[0]), (d.computation, new_ids[1]))

    def _judge(self, rates: Mapping[TabletKey, float], now_ms: float) -> None:
        """A split whose halves both report: if one carries nearly all the load, the load is
        one key (or a few) and splitting that half again would not help."""
        for parent, (a, b) in list(self._children.items()):
            if a in rates and b in rates:
                del self._children[parent]
                total = rates[a] + rates[b]
                for half in (a, b):
                    if total > 0 and rates[half] >= self.policy.indivisible * total:
                        self.stuck[half] = now_ms + self.policy.stuck_s * 1000
        self.stuck = {k: t for k, t in self.stuck.items() if t > now_ms}
