"""The key extractor of a flow stage's raw inputs (``runtime.flows.keys:key_of`` in the
topology): built per reader from the stage's plan, it runs on the producing side (an
injector, a producing tablet) the stateless steps between the input and its ``key_by``, then
the key function; a record a ``filter`` drops is not sent to that stage at all
(:data:`runtime.routing.SKIP`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from runtime.errors import TopologyError
from runtime.flows import PLAN_PARAM, SKIP, refs
from runtime.flows.ops import as_key
from runtime.record import Record


def key_of(record: Record) -> bytes:
    """Stands for a flow's key extractor in a topology; routing builds the real one
    (:func:`build`) from the reader's plan."""
    raise TopologyError("runtime.flows.keys:key_of is the key extractor of a Dataflow's stages; routing builds "
                        "it from the stage's plan and it cannot be called alone")


def build(params: Mapping[str, str], stream: str, load: Callable[[str, str], Any]) -> Callable[[Record], Any]:
    """The key extractor of the stage whose params are ``params``, for ``stream``."""
    plan = json.loads(params[PLAN_PARAM])
    entry = plan["entries"][stream]
    decode = refs.load_codec(entry["codec"], load).decode
    steps = [(kind, load(path, f"{kind} of stream {stream!r}")) for kind, path in entry["prefix"]]
    key_step = _key_step(plan, stream)
    key_fn = load(key_step[1], f"key_by {key_step[0]!r}")
    name = key_step[0]

    def extract(record: Record) -> Any:
        value = decode(record.value)
        for kind, fn in steps:
            if kind == "map":
                value = fn(value)
            elif not fn(value):
                return SKIP
        return as_key(key_fn(value), name)

    return extract


def _key_step(plan: dict[str, Any], stream: str) -> tuple[str, str]:
    key = plan["keys"].get(stream)
    if key is None:
        raise TopologyError(f"stage {plan['stage']!r} keys no records of stream {stream!r} on the producing side")
    return key[0], key[1]
