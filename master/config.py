"""The master's settings, parsed once at the command line (cli/main.py) and passed down."""

from __future__ import annotations

from dataclasses import dataclass

from master.rebalance import Policy


@dataclass(frozen=True)
class MasterConfig:
    """Timing settings of the master."""

    lease_ms: int = 3000
    tick_ms: int = 50
    # Extra margin before a reported increase counts (master.watermarks.Settler). Receipts
    # already make hand-overs exact (see docs/time.md); this is only a safety margin.
    settle_ms: int = 0
    # A tablet silent for this long (its worker died or stalled right after a commit its
    # last report predates) holds its computation at the published watermark.
    report_timeout_ms: int = 500
    # etcd upkeep: its size is read this often, and it is defragmented (at most hourly)
    # once it holds more than this (compaction alone does not shrink the file).
    etcd_check_s: float = 10.0
    # An injector silent this long is flagged stale in status (it still holds its stream).
    injector_stale_s: float = 600.0
    # An injector silent this long is gone (a live Injector reports every 10 s, idle or not):
    # its name is released as an operator's release would (review G4). 0: never.
    injector_expiry_s: float = 86_400.0
    defrag_above_bytes: int = 512 << 20
    # Copies of every tablet (primary included) unless its computation says otherwise.
    replication: int = 2
    # Split hot ranges and merge cold ones (master/rebalance.py) unless a computation says.
    rebalance: bool = False
    policy: Policy = Policy()
