"""The runtime's own options of a computation: durability, dedup retention, replication.

They are fields of the computation (``add_computation(fsync=, dedup_retention=,
replication=)``, checked by :func:`runtime.topology.validate_spec` when the topology is
made), resolved by the leader into :class:`EngineOptions` with the defaults filled in, and
sent to the workers as typed fields of the computation's route (``ComputationRoute.options``),
never as user params. A worker checks what it receives once, before it opens a tablet: a
route that breaks the contract (from a master of another version, say) is refused with a
:class:`~runtime.errors.ConfigError` that the tablet reports, never guessed at: a mistyped
value must not turn durability off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from runtime.errors import ConfigError
from runtime.topology import ComputationSpec
from runtime.wire import millstream_pb2 as pb

DEFAULT_DEDUP_RETENTION_S = 600.0  # docs/exactly-once.md: why ten minutes
MAX_COPIES = 64  # what a worker accepts on the wire (a topology asks for at most MAX_REPLICATION)


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """A computation's engine options as a worker applies them."""

    fsync: bool               # fsync every commit
    dedup_retention_s: float  # how long opaque record ids are kept (seconds)
    replication: int          # copies of each tablet, primary included

    @classmethod
    def of_spec(cls, spec: ComputationSpec, default_replication: int) -> EngineOptions:
        """The options of ``spec`` with the defaults filled in (``default_replication``: the
        master's ``--replication``)."""
        retention = DEFAULT_DEDUP_RETENTION_S if spec.dedup_retention is None else float(spec.dedup_retention)
        return cls(spec.sync_commits, retention, spec.replication or default_replication)

    def to_wire(self) -> pb.EngineOptions:
        return pb.EngineOptions(fsync=self.fsync, dedup_retention_s=self.dedup_retention_s,
                                replication=self.replication)

    @classmethod
    def of_route(cls, route: pb.ComputationRoute) -> EngineOptions:
        """The options a route carries; :class:`ConfigError` if they break the contract."""
        if not route.HasField("options"):
            raise ConfigError(f"computation {route.name!r}: its route carries no engine options (fsync, "
                              "dedup retention, replication): the leader is of an older version; upgrade "
                              "the masters before the workers")
        o = route.options
        if not math.isfinite(o.dedup_retention_s) or o.dedup_retention_s <= 0:
            raise ConfigError(f"computation {route.name!r}: dedup retention {o.dedup_retention_s!r} s is not a "
                              "positive number of seconds; set dedup_retention= on the computation and submit "
                              "it again (`millstream update`)")
        if not 1 <= o.replication <= MAX_COPIES:
            raise ConfigError(f"computation {route.name!r}: replication {o.replication} is not a number of "
                              f"copies from 1 to {MAX_COPIES}; set replication= on the computation and submit "
                              "it again (`millstream update`)")
        return cls(o.fsync, o.dedup_retention_s, o.replication)
