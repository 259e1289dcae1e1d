"""Nexmark on millstream: the auction-site benchmark as Beam's Nexmark suite defines it.

- :mod:`bench.nexmark.generator`: the deterministic event generator (event number -> one
  Person, Auction or Bid), its wire encoding, and the watermark an injector may promise.
- :mod:`bench.nexmark.queries`: queries 0, 1, 2, 3, 5, 7, 8, 11 and 12 as millstream topologies.
- :mod:`bench.nexmark.oracle`: the same queries in plain Python over the same events, the
  exact expected output (query 12 works on processing time, so only its totals).

The generator and the oracle import nothing from millstream, so the oracle checks the runtime
rather than sharing its code.
"""
