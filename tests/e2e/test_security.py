"""TLS on every gRPC port and a shared token: the pipeline works with them, and without them
a client gets a clear refusal rather than data."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from injectors import Injector
from runtime.errors import MasterUnavailable, MillstreamError
from runtime.security import Security
from tests.e2e.wordcount_run import run_wordcount
from tests.harness import Cluster

TOKEN = "s3cret-token"


def _certs(d: str) -> tuple[str, str, str]:
    """A throwaway CA and a server certificate for 127.0.0.1 signed by it."""
    ca_key, ca, key, csr, cert = (os.path.join(d, n) for n in ("ca.key", "ca.pem", "srv.key", "srv.csr", "srv.pem"))
    ext = os.path.join(d, "ext.cnf")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, "-days", "2",
        "-subj", "/CN=millstream test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1")
    run("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
        "-days", "2", "-extfile", ext)
    return ca, cert, key


@pytest.fixture
def secure_cluster(tmp_path: object) -> Iterator[Cluster]:
    ca, cert, key = _certs(str(tmp_path))
    security = Security(ca=ca, token=TOKEN)
    with Cluster(str(tmp_path), workers=2, security=security,
                 daemon_args=["--tls-cert", cert, "--tls-key", key, "--tls-ca", ca, "--token", TOKEN]).running() as c:
        yield c


def test_wordcount_over_tls_with_a_token(secure_cluster: Cluster) -> None:
    run_wordcount(secure_cluster, n_lines=500, name="tls")


def test_a_client_without_the_token_is_refused(secure_cluster: Cluster) -> None:
    no_token = Security(ca=secure_cluster.security.ca)
    with pytest.raises(MillstreamError, match="missing or wrong token"):
        Injector(secure_cluster.masters_arg, "lines", "intruder", security=no_token)


def test_a_plaintext_client_cannot_talk_to_a_tls_cluster(secure_cluster: Cluster) -> None:
    from runtime.client import Client

    with pytest.raises(MasterUnavailable, match="cannot reach a millstream master"):
        Client(secure_cluster.masters_arg, timeout=1, security=Security(token=TOKEN)).status()
