"""Which workers may load a computation's code: checked by the leader against the code
policy each worker reported when it registered (``millstream worker --allow-code``).

A submit (or update, or restore) naming code some live worker would refuse to load is
refused with the computation, the module, the workers and the flag to add; a worker that
joins later with a narrower policy is named in status and `millstream jobs` at once, not
after its tablets failed to open a thousand times.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from runtime.flows import FLOW_CODES, FLOW_KEY, PLAN_PARAM
from runtime.flows.refs import code_paths
from runtime.imports import CodeNotAllowedError, CodePolicy
from runtime.topology import ComputationSpec


@dataclass(frozen=True)
class Refusal:
    """Code of ``computation`` (at ``path``) whose module ``workers`` do not allow."""

    computation: str
    what: str     # "code", "key extractor of STREAM", or what of a flow's plan (step 'x' (map), ...)
    path: str
    workers: tuple[str, ...]

    @property
    def module(self) -> str:
        return self.path.partition(":")[0]

    @property
    def flag(self) -> str:
        return f"--allow-code {self.module.split('.')[0]}"


def refusals(specs: Iterable[ComputationSpec], policies: Mapping[str, tuple[str, ...]],
             workers: Iterable[str]) -> list[Refusal]:
    """The code of ``specs`` some of ``workers`` may not load (a worker with no policy
    reported, from before workers reported one, is assumed to load anything)."""
    live = [(w, CodePolicy(policies[w])) for w in sorted(workers) if policies.get(w)]
    out = []
    for s in specs:
        paths = [("code", s.code)] + [(f"key extractor of {stream!r}", ex) for stream, ex in s.inputs.items()
                                      if ex and ex != FLOW_KEY]
        if s.code in FLOW_CODES and PLAN_PARAM in s.params:  # a flow's stage: the code its plan names
            paths += _plan_paths(s.params[PLAN_PARAM])
        for what, path in paths:
            module = path.partition(":")[0]
            refused = tuple(w for w, policy in live if not policy.permits(module))
            if refused:
                out.append(Refusal(s.name, what, path, refused))
    return out


def _plan_paths(plan: str) -> list[tuple[str, str]]:
    """The code a stage's plan names; none if the plan cannot be read (its stage then fails to
    open with the reason, in status: a submit or a status call must not fail on it here)."""
    try:
        return code_paths(json.loads(plan))
    except (ValueError, TypeError, AttributeError, KeyError):
        return []


def check_loadable(specs: Iterable[ComputationSpec], policies: Mapping[str, tuple[str, ...]],
                   workers: Mapping[str, str]) -> None:
    """Raise :class:`CodeNotAllowedError` naming every computation whose code a live worker
    may not load, the workers, and the flag to start them with."""
    found = refusals(specs, policies, workers)
    if not found:
        return
    lines = [describe(r, workers) for r in found]
    raise CodeNotAllowedError(
        "workers would refuse to load this topology's code, so its tablets could not open: "
        + "; ".join(lines) + ". Nothing was changed")


def describe(r: Refusal, workers: Mapping[str, str]) -> str:
    """One refusal for people: what, where, and how to fix it."""
    names = ", ".join(f"{w} ({workers.get(w, '?')})" for w in r.workers[:5])
    more = f" and {len(r.workers) - 5} more" if len(r.workers) > 5 else ""
    one = len(r.workers) == 1
    return (f"computation {r.computation!r}: {r.what} {r.path!r} is from module {r.module!r}, which "
            f"{'worker' if one else 'workers'} {names}{more} {'does' if one else 'do'} not allow; start "
            f"{'it' if one else 'them'} with {r.flag} (or MILLSTREAM_ALLOW_CODE), "
            "or move the code into a module they allow")
