"""TLS on every gRPC port and a shared token: the pipeline works with them, and without them
a client gets a clear refusal rather than data."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from injectors import Injector
from runtime.errors import MasterUnavailableError, MillstreamError
from runtime.security import Security
from tests.certs import make_certs as _certs
from tests.e2e.wordcount_run import run_wordcount
from tests.harness import Cluster, wait_until

TOKEN = "s3cret-token"
HTTP_TOKEN = "console-token"  # the console's own (--http-token-file): not the operator's
METRICS_TOKEN = "metrics-token"  # the workers' /metrics' (--metrics-token-file)


@pytest.fixture
def secure_cluster(tmp_path: object) -> Iterator[Cluster]:
    ca, cert, key = _certs(str(tmp_path))
    security = Security(ca=ca, token=TOKEN)
    http_token = os.path.join(str(tmp_path), "http.token")
    metrics_token = os.path.join(str(tmp_path), "metrics.token")
    for path, token in ((http_token, HTTP_TOKEN), (metrics_token, METRICS_TOKEN)):
        with open(path, "w") as f:
            f.write(token + "\n")
    with Cluster(str(tmp_path), workers=2, security=security,
                 daemon_args=["--tls-cert", cert, "--tls-key", key, "--tls-ca", ca, "--token", TOKEN],
                 master_args=["--http-tls", "--http-token-file", http_token],
                 worker_args=["--metrics-tls", "--metrics-token-file", metrics_token]).running() as c:
        yield c


def test_wordcount_over_tls_with_a_token(secure_cluster: Cluster) -> None:
    run_wordcount(secure_cluster, n_lines=500, name="tls")


def test_a_savepoint_restores_on_a_cluster_with_a_token(secure_cluster: Cluster) -> None:
    """The restore's ``LoadTablet`` calls (a stream of chunks to each worker) carry the token
    too: they went without it, so a savepoint never restored on a cluster that asks for one."""
    counts = run_wordcount(secure_cluster, n_lines=200, name="sp")
    saved = os.path.join(secure_cluster.data_dir, "savepoint")
    client = secure_cluster.client
    client.savepoint("sp", saved)
    client.cancel("sp")
    assert client.restore(saved) == "sp"
    secure_cluster.wait_assigned()
    word, n = max(counts.items(), key=lambda kv: kv[1])
    wait_until(lambda: client.state("counter", word.encode()) == str(n).encode(), 60,
               f"the restored count of {word!r}, {n}")


def test_the_console_is_served_over_tls_and_asks_for_its_token(secure_cluster: Cluster) -> None:
    page = secure_cluster.masters[0].http
    assert page.startswith("https://127.0.0.1:"), page
    ctx = ssl.create_default_context(cafile=secure_cluster.security.ca)

    def get(path: str, token: str | None) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        with urllib.request.urlopen(urllib.request.Request(page + path, headers=headers), context=ctx,
                                    timeout=30) as r:
            return dict(json.loads(r.read()))

    for token in (None, TOKEN):  # (the cluster's token is not the console's)
        with pytest.raises(urllib.error.HTTPError) as refused:
            get("status.json", token)
        assert refused.value.code == 401 and "Basic" in refused.value.headers["WWW-Authenticate"]
    wait_until(lambda: "error" not in get("status.json", HTTP_TOKEN), 30, "the leader's status on its console")
    assert len(get("status.json", HTTP_TOKEN)["workers"]) == 2


def test_the_workers_metrics_are_served_over_tls_and_ask_for_their_token(secure_cluster: Cluster) -> None:
    run_wordcount(secure_cluster, n_lines=50, name="scraped")
    ctx = ssl.create_default_context(cafile=secure_cluster.security.ca)
    for w in secure_cluster.workers:
        address = next(line.rsplit(" ", 1)[1] for line in w.lines if " metrics on " in line)

        def get(token: str | None, scheme: str = "https", address: str = address) -> str:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            with urllib.request.urlopen(urllib.request.Request(f"{scheme}://{address}/metrics", headers=headers),
                                        context=ctx if scheme == "https" else None, timeout=30) as r:
                return str(r.read().decode())

        for token in (None, TOKEN, HTTP_TOKEN):  # (neither the cluster's token nor the console's)
            with pytest.raises(urllib.error.HTTPError) as refused:
                get(token)
            assert refused.value.code == 401 and "--metrics-token" in refused.value.read().decode()
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            get(METRICS_TOKEN, "http")  # plaintext to the TLS port
        assert "millstream_records_processed" in get(METRICS_TOKEN)


def test_a_client_without_the_token_is_refused(secure_cluster: Cluster) -> None:
    no_token = Security(ca=secure_cluster.security.ca)
    with pytest.raises(MillstreamError, match="missing or wrong token"):
        Injector(secure_cluster.masters_arg, "lines", "intruder", security=no_token)


def test_a_plaintext_client_cannot_talk_to_a_tls_cluster(secure_cluster: Cluster) -> None:
    from runtime.client import Client

    with pytest.raises(MasterUnavailableError, match="cannot reach a millstream master"):
        Client(secure_cluster.masters_arg, timeout=1, security=Security(token=TOKEN)).status()


SYSTEMD_ENV = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "systemd", "millstream.env.example")
ROLE_VARS = ("MILLSTREAM_TLS_CERT", "MILLSTREAM_TLS_KEY", "MILLSTREAM_TLS_CA", "MILLSTREAM_TLS_CLIENT_CA",
             "MILLSTREAM_WORKER_TOKEN", "MILLSTREAM_INJECTOR_TOKEN", "MILLSTREAM_OPERATOR_TOKEN")


def test_a_cluster_set_up_like_the_systemd_example_refuses_strangers_and_forged_workers(
        tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemons read their security settings from the environment, as the systemd units
    do from deploy/systemd/millstream.env.example: mutual TLS and one token per role."""
    with open(SYSTEMD_ENV) as f:
        example = {line.split("=", 1)[0] for line in f if "=" in line and not line.startswith("#")}
    assert set(ROLE_VARS) <= example, "the systemd example must turn TLS and role tokens on"

    import grpc

    from runtime.wire import millstream_pb2 as pb
    from runtime.wire import millstream_pb2_grpc as rpc

    ca, cert, key = _certs(str(tmp_path))
    tokens = {"worker": "w-token", "injector": "i-token", "operator": "o-token"}
    env = {"MILLSTREAM_TLS_CERT": cert, "MILLSTREAM_TLS_KEY": key, "MILLSTREAM_TLS_CA": ca,
           "MILLSTREAM_TLS_CLIENT_CA": ca, **{f"MILLSTREAM_{r.upper()}_TOKEN": t for r, t in tokens.items()}}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    operator = Security(ca=ca, cert=cert, key=key, token=tokens["operator"])
    with Cluster(str(tmp_path), workers=2, security=operator).running() as c:
        run_wordcount(c, n_lines=200, name="roles")  # the operator submits, reads status

        def call(token: str | None, method: str, request: object) -> grpc.StatusCode:
            with Security(ca=ca, cert=cert, key=key, token=token).channel(c.masters_arg.split(",")[0]) as ch:
                try:
                    getattr(rpc.MasterStub(ch), method)(request, timeout=10)
                except grpc.RpcError as e:
                    return e.code()
            return grpc.StatusCode.OK

        wid = c.client.status()["workers"][0]["id"]
        forged = pb.HeartbeatRequest(worker_id=wid, tablets=[], report_seq=1 << 40)
        assert call(None, "Status", pb.StatusRequest()) == grpc.StatusCode.UNAUTHENTICATED
        assert call("guess", "Status", pb.StatusRequest()) == grpc.StatusCode.UNAUTHENTICATED
        # An injector's (or a Spark job's) token cannot pose as a worker or an operator.
        assert call(tokens["injector"], "Heartbeat", forged) == grpc.StatusCode.PERMISSION_DENIED
        assert call(tokens["injector"], "RegisterWorker",
                    pb.RegisterWorkerRequest(address="127.0.0.1:1")) == grpc.StatusCode.PERMISSION_DENIED
        assert call(tokens["injector"], "Submit", pb.SubmitRequest(topology_json="{}")) == \
            grpc.StatusCode.PERMISSION_DENIED
        assert call(tokens["operator"], "Heartbeat", forged) == grpc.StatusCode.PERMISSION_DENIED
        # Even the worker token cannot pose as another worker: each worker id has a secret, the
        # one it showed at its first registration.
        assert call(tokens["worker"], "Heartbeat", forged) == grpc.StatusCode.PERMISSION_DENIED
        assert call(tokens["worker"], "RegisterWorker", pb.RegisterWorkerRequest(
            address="127.0.0.1:1", worker_id=wid, secret="guess")) == grpc.StatusCode.PERMISSION_DENIED
        assert call(tokens["worker"], "LeaveWorker", pb.LeaveRequest(worker_id=wid)) == \
            grpc.StatusCode.PERMISSION_DENIED
        assert call(tokens["worker"], "UpdateInSync", pb.InSyncRequest(
            computation="counter", key_range=0, primary=wid, follower=wid)) == grpc.StatusCode.PERMISSION_DENIED
        # ... nor by naming no primary (review of security: no name, no secret checked)
        routed = [a for c_ in c.client.routing().computations if c_.name == "counter" for a in c_.assignments][0]
        assert call(tokens["worker"], "UpdateInSync", pb.InSyncRequest(
            computation="counter", key_range=0, token=routed.token, follower=wid, add=False)) == \
            grpc.StatusCode.PERMISSION_DENIED
        # A real worker back on its own disk shows its kept secret and is the same worker again.
        victim = c.workers[0]
        vid = open(os.path.join(victim.state_dir, "worker.id")).read().strip()
        assert oct(os.stat(os.path.join(victim.state_dir, "worker.secret")).st_mode & 0o777) == "0o600"
        c.kill(victim, graceful=False)
        back = c.restart_worker(victim)
        wait_until(lambda: any(w["id"] == vid and w["address"] == back.address for w in c.client.status()["workers"])
                   and c.client.status()["liveness"]["registrations"] >= 3, 30, "the worker to rejoin as itself")
        # ... while it can inject.
        with Injector(c.masters_arg, "lines", "roles-injector",
                      security=Security(ca=ca, cert=cert, key=key, token=tokens["injector"])) as inj:
            inj.send(b"", b"exactly once", 1_700_000_000_000_000)
        # Without a client certificate, nothing gets through at all (mutual TLS).
        with pytest.raises(MillstreamError):
            from runtime.client import Client

            Client(c.masters_arg, timeout=2, security=Security(ca=ca, token=tokens["operator"])).status()
        assert len(c.client.status()["workers"]) == 2  # no forged worker joined


def test_a_cluster_that_requires_injector_credentials(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review N4: masters and workers started with MILLSTREAM_REQUIRE_INJECTOR_CREDENTIALS=1 and
    one token per role. An injector with only the injector token is refused with one line that
    says how to get a credential, and nothing of it reaches the job; the word count's injector,
    with the credential `millstream credential test-creds` printed, is counted exactly once; a
    credential lets its holder report watermarks under the names it covers only."""
    import grpc

    from runtime.wire import millstream_pb2 as pb
    from runtime.wire import millstream_pb2_grpc as rpc

    tokens = {"worker": "w-token", "injector": "i-token", "operator": "o-token"}
    for role, token in tokens.items():
        monkeypatch.setenv(f"MILLSTREAM_{role.upper()}_TOKEN", token)
    monkeypatch.setenv("MILLSTREAM_REQUIRE_INJECTOR_CREDENTIALS", "1")
    made = subprocess.run([sys.executable, "-m", "cli", "credential", "test-creds"], capture_output=True,
                          text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    credential = made.stdout.strip()
    assert credential.startswith("test-creds:")
    with Cluster(str(tmp_path), workers=2, security=Security(token=tokens["operator"])).running() as c:
        got = run_wordcount(c, n_lines=300, name="creds",
                            injector_security=Security(token=tokens["injector"], injector_credential=credential))
        with pytest.raises(MillstreamError, match="millstream credential NAME"):
            with Injector(c.masters_arg, "lines", "test-nocreds", timeout=20,
                          security=Security(token=tokens["injector"])) as inj:
                inj.send(b"", b"refused words", 1_700_000_000_000_000)
        with pytest.raises(MillstreamError, match="not covered by its credential"):
            Injector(c.masters_arg, "lines", "someone-else", security=Security(
                token=tokens["injector"], injector_credential=credential))
        from examples import wordcount
        from runtime.sinks import read_file_sink

        counts = wordcount.final_counts(list(read_file_sink(os.path.join(c.data_dir, "out-creds"))))
        assert counts == got and "refused" not in counts

        def report(security: Security, name: str) -> grpc.StatusCode:
            with security.channel(c.masters_arg.split(",")[0]) as ch:
                try:
                    rpc.MasterStub(ch).ReportInjector(pb.InjectorReport(
                        name=name, stream="lines", watermark=0, incarnation="x"), timeout=10)
                except grpc.RpcError as e:
                    return e.code()
            return grpc.StatusCode.OK

        holder = Security(token=tokens["injector"], injector_credential=credential)
        assert report(holder, "test-creds/p0") == grpc.StatusCode.OK
        # Holding back another injector's stream under its name: refused, with or without one.
        assert report(holder, "test-other") == grpc.StatusCode.PERMISSION_DENIED
        assert report(Security(token=tokens["injector"]), "test-other") == grpc.StatusCode.PERMISSION_DENIED
