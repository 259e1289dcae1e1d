"""Readiness is the standard gRPC health service (runtime/health.py), not a printed line: a
worker is ready while it holds a lease from the leader, every daemon answers probes without a
token, and over plaintext on ``--health-listen`` when its gRPC port speaks TLS."""

from __future__ import annotations

from runtime import health
from runtime.security import Security
from tests.certs import make_certs as _certs
from tests.e2e.test_security import TOKEN
from tests.harness import Cluster, wait_until


def test_a_worker_is_ready_while_it_holds_a_lease_and_alive_throughout(tmp_path: object) -> None:
    with Cluster(str(tmp_path), masters=1, workers=1).running() as c:
        master, worker = c.masters[0], c.workers[0]
        assert health.is_serving(master.address, service=health.MASTER)
        wait_until(lambda: health.is_serving(worker.address, service=health.WORKER), 30, "the worker to be ready")
        assert not health.is_serving(worker.address, service="millstream.v1.Nothing")  # unknown: not serving
        c.kill(master)  # no leader: the worker's lease lapses
        wait_until(lambda: not health.is_serving(worker.address, service=health.WORKER), 30,
                   "the worker to be unready without a leader")
        assert health.is_serving(worker.address)  # alive all the same: a liveness probe keeps it
        c.restart_master(master)
        wait_until(lambda: health.is_serving(worker.address, service=health.WORKER), 30,
                   "the worker to be ready again under the new leader")


def test_probes_need_no_token_and_get_plaintext_beside_tls(tmp_path: object) -> None:
    ca, cert, key = _certs(str(tmp_path))
    security = Security(ca=ca, token=TOKEN)
    with Cluster(str(tmp_path), workers=1, security=security,
                 daemon_args=["--tls-cert", cert, "--tls-key", key, "--tls-ca", ca, "--token", TOKEN,
                              "--health-listen", "127.0.0.1:0"]).running() as c:
        worker = c.workers[0]
        # Over TLS, without the token the rest of the API demands.
        wait_until(lambda: health.is_serving(worker.address, Security(ca=ca), health.WORKER), 30,
                   "the worker to be ready (TLS, no token)")
        for proc, service in ((c.masters[0], health.MASTER), (worker, health.WORKER)):
            plain = next(line.rsplit(" ", 1)[1] for line in proc.lines if " health service on " in line)
            assert health.is_serving(plain, Security(), service), (proc.name, plain)
            assert not health.is_serving(proc.address, Security(), service)  # the gRPC port speaks TLS only
