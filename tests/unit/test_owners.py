"""Injector credentials and the producers they keep apart (review N4): pure logic."""

from __future__ import annotations

import pytest

from injectors import Injector
from runtime.columns import Columns
from runtime.errors import ConfigError, InjectionError
from runtime.record import is_worker_producer, producer_prefix, sequence_id
from runtime.security import Owner, Security, covers, credential_owner, injector_credential
from worker.owners import owned, owned_prefix

P = producer_prefix("injector/team-a")


def _owner(name: str, worker_token: str = "w-token") -> Owner:
    """What a server makes of the credential for ``name`` (runtime.security._TokenCheck)."""
    return Owner(name, bytes.fromhex(injector_credential(worker_token, name).rpartition(":")[2]))


def test_a_credential_names_its_owner_and_needs_the_worker_token() -> None:
    c = injector_credential("w-token", "team-a")
    assert credential_owner(c) == "team-a" and len(c) == len("team-a:") + 64
    assert injector_credential("w-token", "team-a") == c  # the operator can print it again
    assert injector_credential("other token", "team-a") != c
    assert injector_credential("w-token", "team-b") != c
    assert credential_owner("a:b:" + c.rsplit(":", 1)[1]) == "a:b"  # the name may hold ':'
    for bad in ("team-a", "team-a:xyz", ":" + "0" * 64, " team-a :" + "0" * 64):
        with pytest.raises(ConfigError):
            credential_owner(bad)
    with pytest.raises(ConfigError, match="printable name"):
        injector_credential("w-token", "tab\there")


def test_a_credential_covers_its_name_and_the_names_under_it() -> None:
    assert covers("team-a", "team-a") and covers("team-a", "team-a/p3") and covers("team-a", "team-a/x/y")
    assert not covers("team-a", "team-ab") and not covers("team-a", "team") and not covers("team-a", "b/team-a")


def test_an_owned_prefix_is_keyed_by_the_credential_and_stays_outside_the_cluster() -> None:
    """The digest is keyed with the credential's MAC: knowing the name and the prefix (both
    public) is not enough to compute it, so no caller without the credential can send under
    it (review of d6a2339: an unkeyed digest of name and prefix could be sent as it is)."""
    owners = [_owner("team-a"), _owner("team-b"), _owner("team-a/"), _owner("team-a", "another worker token")]
    seen = {owned_prefix(o, p) for o in owners for p in (P, producer_prefix("x"))}
    assert len(seen) == 8 and all(len(p) == 8 and not is_worker_producer(p) for p in seen)
    assert owned_prefix(_owner("team-a"), P) == owned_prefix(_owner("team-a"), P) != P
    assert "w-token" not in repr(Security(token="w-token", injector_credential=injector_credential("w", "a")))
    assert repr(_owner("team-a")) == "Owner(name='team-a')"  # the MAC is not printed


def test_owned_rewrites_every_prefix_of_a_delivery_and_keeps_the_sequences() -> None:
    cols = Columns([b"a", b"b"], [b"1", b"2"], [1, 2], producer=P, seqs=[7, 8])
    team_a = _owner("team-a")
    got, orders = owned(team_a, cols, {P: (6, 0)})
    mine = owned_prefix(team_a, P)
    assert got.producer == mine and got.seqs == [7, 8] and orders == {mine: (6, 0)}
    assert cols.producer == P  # the received columns are left as they were
    q = producer_prefix("source\x00team-a\x00app.log")
    rows = Columns([b"a", b"b", b"c"], [b"", b"", b""], [1, 2, 3],
                   ids=[sequence_id(P, 1), sequence_id(q, 5), b"opaque-id-16byte"])
    got, orders = owned(team_a, rows, None)
    assert got.ids == [sequence_id(mine, 1), sequence_id(owned_prefix(team_a, q), 5),
                       owned_prefix(team_a, b"opaque-i") + b"d-16byte"]
    assert orders is None


def test_an_injector_must_be_covered_by_the_credential_it_shows() -> None:
    security = Security(token="i-token", injector_credential=injector_credential("w", "team-a"))
    with pytest.raises(InjectionError, match="not covered by its credential, which is for 'team-a'"):
        Injector("127.0.0.1:1", "lines", "team-b", security=security)
