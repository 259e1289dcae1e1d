"""The ``millstream`` command line. Flags are parsed here, once, into frozen options.

Every address flag also reads a ``MILLSTREAM_*`` environment variable.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from collections.abc import Sequence

from cli.flags import (
    address,
    data_port,
    etcd_binary_flag,
    float_in,
    from_env,
    hash_flag,
    health_flag,
    int_in,
    log_format_flag,
    masters_flag,
    need,
    read_secrets,
    require_credentials_flag,
    secret_flag,
    security,
    security_flags,
    tablet,
    version,
)
from runtime import logs
from runtime.errors import ConfigError, MillstreamError

log = logging.getLogger("millstream")



def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="millstream", description="MillWheel-style stream processing.")
    parser.add_argument("--version", action="version", version=f"millstream {version()}")
    parser.add_argument("--log-level", default=from_env("MILLSTREAM_LOG_LEVEL", "INFO"),
                        choices=["DEBUG", "INFO", "WARNING", "ERROR", "debug", "info", "warning", "error"],
                        help="DEBUG, INFO (default), WARNING or ERROR (env MILLSTREAM_LOG_LEVEL)")
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run a complete local cluster in the foreground")
    up.add_argument("--workers", type=int_in(0, 64, "--workers"), default=2)
    up.add_argument("--masters", type=int_in(1, 7, "--masters"), default=1)
    up.add_argument("--data-dir", default=from_env("MILLSTREAM_DATA_DIR", "./millstream-data"))
    up.add_argument("--lease-ms", type=int_in(500, 3_600_000, "--lease-ms or MILLSTREAM_LEASE_MS, milliseconds"),
                    default=from_env("MILLSTREAM_LEASE_MS", "3000"))
    up.add_argument("--port", type=int_in(0, 65535, "--port"), default=7070,
                    help="port of the first master (0: chosen by the OS; falls back to that if taken)")
    up.add_argument("--allow-code", default=from_env("MILLSTREAM_ALLOW_CODE"), metavar="PREFIXES",
                    help="comma-separated module prefixes the workers may load code from, besides the modules and "
                         "packages of the directory `up` starts in (env MILLSTREAM_ALLOW_CODE): a module you "
                         "write there later, say")
    etcd_binary_flag(up)
    log_format_flag(up)

    m = sub.add_parser("master", help="run one master")
    m.add_argument("--etcd", default=from_env("MILLSTREAM_ETCD"), help="etcd URL(s) (env MILLSTREAM_ETCD)")
    m.add_argument("--listen", default=from_env("MILLSTREAM_MASTER_LISTEN", from_env("MILLSTREAM_LISTEN", "127.0.0.1:7070")),
                   type=address("--listen or MILLSTREAM_MASTER_LISTEN"),
                   help="HOST:PORT to serve on (env MILLSTREAM_MASTER_LISTEN or MILLSTREAM_LISTEN)")
    m.add_argument("--advertise", default=from_env("MILLSTREAM_MASTER_ADVERTISE"),
                   help="HOST:PORT others dial, when it differs from --listen (e.g. 0.0.0.0)")
    m.add_argument("--http-listen", default=from_env("MILLSTREAM_HTTP_LISTEN", "127.0.0.1:0"),
                   type=address("--http-listen or MILLSTREAM_HTTP_LISTEN", optional=True),
                   help="HOST:PORT of the web page and /metrics (port 0: chosen by the OS and "
                        "printed; '' = off)")
    m.add_argument("--http-tls", action="store_true",
                   default=(from_env("MILLSTREAM_HTTP_TLS") or "").lower() in ("1", "true", "yes"),
                   help="serve the web page and /metrics over HTTPS, with --tls-cert and --tls-key (env "
                        "MILLSTREAM_HTTP_TLS=1)")
    secret_flag(m.add_argument_group("web page"), "http-token", "MILLSTREAM_HTTP_TOKEN",
                "token the web page and /metrics ask for: Authorization: Bearer TOKEN, or a browser's login "
                "with the token as the password")
    log_format_flag(m)
    health_flag(m)
    m.add_argument("--etcd-ca", default=from_env("MILLSTREAM_ETCD_CA"), help="CA certificate for https etcd")
    m.add_argument("--lease-ms", type=int_in(500, 3_600_000, "--lease-ms or MILLSTREAM_LEASE_MS, milliseconds"),
                   default=from_env("MILLSTREAM_LEASE_MS", "3000"))
    m.add_argument("--replication", type=int_in(1, 7, "--replication or MILLSTREAM_REPLICATION, copies"),
                   default=from_env("MILLSTREAM_REPLICATION", "2"),
                   help="copies of every tablet on different workers, primary included (default 2; "
                        "a computation's replication= overrides it; env MILLSTREAM_REPLICATION)")
    m.add_argument("--rebalance", action="store_true", default=from_env("MILLSTREAM_REBALANCE", "") in ("1", "true"),
                   help="split hot key ranges and merge cold ones while jobs run (a computation's "
                        "rebalance= overrides it; env MILLSTREAM_REBALANCE=1); docs/rescaling.md")
    m.add_argument("--rebalance-hold-s", type=float_in(0, 3600, "--rebalance-hold-s, seconds"),
                   default=from_env("MILLSTREAM_REBALANCE_HOLD_S", "10"),
                   help="how long a range must stay hot (or cold) before it is split (or merged)")
    m.add_argument("--rebalance-cooldown-s", type=float_in(0, 86400, "--rebalance-cooldown-s, seconds"),
                   default=from_env("MILLSTREAM_REBALANCE_COOLDOWN_S", "30"),
                   help="how long a computation is left alone after a split or merge")
    m.add_argument("--rebalance-min-rate", type=float_in(0, 1e9, "--rebalance-min-rate, records/s"),
                   default=from_env("MILLSTREAM_REBALANCE_MIN_RATE", "200"),
                   help="ranges slower than this (records/s) are never split")
    m.add_argument("--injector-expiry-s", type=float_in(0, 1e9, "--injector-expiry-s, seconds"),
                   default=from_env("MILLSTREAM_INJECTOR_EXPIRY_S", "86400"),
                   help="release an injector's hold on its stream after this long without a report "
                        "(a live one reports every 10 s; 0 = never; default a day); docs/time.md")
    require_credentials_flag(m, "injectors' watermark reports")
    security_flags(m, server=True)
    m.add_argument("--etcd-user", default=from_env("MILLSTREAM_ETCD_USER"), help="etcd user (env MILLSTREAM_ETCD_USER)")
    secret_flag(m.add_argument_group("etcd password"), "etcd-password", "MILLSTREAM_ETCD_PASSWORD",
                 "password of --etcd-user")

    w = sub.add_parser("worker", help="run one worker")
    masters_flag(w)
    w.add_argument("--listen", default=from_env("MILLSTREAM_WORKER_LISTEN", from_env("MILLSTREAM_LISTEN", "127.0.0.1:0")),
                   type=address("--listen or MILLSTREAM_WORKER_LISTEN"),
                   help="HOST:PORT to serve on (env MILLSTREAM_WORKER_LISTEN or MILLSTREAM_LISTEN)")
    w.add_argument("--advertise", default=from_env("MILLSTREAM_WORKER_ADVERTISE"),
                   help="HOST:PORT others dial, when it differs from --listen (e.g. 0.0.0.0)")
    w.add_argument("--state-dir", default=from_env("MILLSTREAM_STATE_DIR"),
                   help="this worker's own directory for its tablet copies and identity; never shared "
                        "with another worker (env MILLSTREAM_STATE_DIR)")
    log_format_flag(w)
    w.add_argument("--zone", default=from_env("MILLSTREAM_ZONE", ""),
                   help="failure domain (rack, availability zone): a tablet's copies go to different "
                        "zones when possible (env MILLSTREAM_ZONE)")
    w.add_argument("--data-port", default=from_env("MILLSTREAM_DATA_PORT", "0"), type=data_port,
                   help="port of the data plane (deliveries and replication as frames on connections of "
                        "their own, runtime/frames.py) on the --listen host: 0 (default) one the OS "
                        "chooses, 'off' none, and they go over the gRPC port (env MILLSTREAM_DATA_PORT)")
    w.add_argument("--metrics-listen", default=from_env("MILLSTREAM_METRICS_LISTEN", "127.0.0.1:0"),
                   type=address("--metrics-listen or MILLSTREAM_METRICS_LISTEN", optional=True),
                   help="HOST:PORT for Prometheus /metrics (port 0: chosen by the OS; '' = off)")
    w.add_argument("--metrics-tls", action="store_true",
                   default=(from_env("MILLSTREAM_METRICS_TLS") or "").lower() in ("1", "true", "yes"),
                   help="serve /metrics over HTTPS, with --tls-cert and --tls-key (env MILLSTREAM_METRICS_TLS=1)")
    secret_flag(w.add_argument_group("metrics"), "metrics-token", "MILLSTREAM_METRICS_TOKEN",
                "token /metrics asks for: Authorization: Bearer TOKEN (Prometheus' authorization)")
    health_flag(w)
    w.add_argument("--allow-code", default=from_env("MILLSTREAM_ALLOW_CODE"),
                   help="comma-separated module prefixes topologies may load code from, e.g. my_jobs,"
                        "acme.pipelines (env MILLSTREAM_ALLOW_CODE); millstream's own sinks and "
                        "examples are always allowed; '*' allows any module (trusted setups only)")
    require_credentials_flag(w, "records from callers outside the worker role")
    security_flags(w, server=True)

    cr = sub.add_parser("credential", help="print the credential of the injectors named NAME or NAME/..., "
                                            "made with the cluster's worker token")
    cr.add_argument("name", help="the injector's name (a credential for NAME also covers NAME/anything)")
    secret_flag(cr.add_argument_group("worker token"), "worker-token", "MILLSTREAM_WORKER_TOKEN",
                "the cluster's worker token")

    rn = sub.add_parser("run", help="run the Dataflow or Topology named by MODULE:ATTR once over files, in this "
                                     "process (no cluster), and print its outputs as JSON lines")
    rn.add_argument("job", metavar="MODULE:ATTR")
    rn.add_argument("--input", action="append", default=[], metavar="STREAM=PATH",
                    help="a file whose lines are the records of an input stream ('-': standard input); repeat "
                         "for each input (an input given none is finished empty)")
    rn.add_argument("--key-field", default=None, metavar="FIELD",
                    help="JSON lines: each record's key is this field (default: empty)")
    rn.add_argument("--timestamp-field", default=None, metavar="FIELD",
                    help="JSON lines: each record's event time is this field, microseconds since the epoch or "
                         "an ISO 8601 time with a zone (default: the run's start, a microsecond apart)")
    rn.add_argument("--timestamp-unit", choices=["s", "ms", "us", "ns"], default=None,
                    help="the unit of numeric times in --timestamp-field (default: microseconds, and times that look "
                         "like another unit are refused)")
    rn.add_argument("--out", default=None, metavar="DIR",
                    help="write each output stream to DIR/STREAM.jsonl instead of standard output")

    ex = sub.add_parser("explain", help="print what the Dataflow or Topology named by MODULE:ATTR runs as: its "
                                         "stages, the steps each fuses, the streams between them")
    ex.add_argument("job", metavar="MODULE:ATTR")

    s = sub.add_parser("submit", help="submit the Dataflow or Topology named by MODULE:ATTR")
    s.add_argument("topology")
    masters_flag(s)
    security_flags(s, server=False)

    st = sub.add_parser("status", help="show the cluster")
    masters_flag(st)
    security_flags(st, server=False)
    st.add_argument("--json", action="store_true")
    st.add_argument("--watch", nargs="?", const=2.0, default=None, metavar="SECONDS",
                    type=float_in(0.1, 3600, "--watch, seconds between reports"),
                    help="report again every SECONDS (default 2) until Ctrl-C")
    st.add_argument("--computation", default=None, metavar="NAME",
                    help="show only this computation: its watermark, counts, slow keys, tablets and injectors")

    mv = sub.add_parser("move", help="move one tablet (COMPUTATION/RANGE) to a worker (id or address)")
    mv.add_argument("tablet")
    mv.add_argument("worker")
    masters_flag(mv)
    security_flags(mv, server=False)

    sp = sub.add_parser("split", help="cut a key range (COMPUTATION/RANGE) in two while the job runs")
    sp.add_argument("tablet")
    sp.add_argument("--at", type=hash_flag, default=None,
                    help="first hash of the right half (decimal or 0x hex; default: where the range's recent load "
                         "divides evenly, else the middle)")
    masters_flag(sp)
    security_flags(sp, server=False)

    mg = sub.add_parser("merge", help="join two adjacent key ranges (COMPUTATION/RANGE COMPUTATION/RANGE)")
    mg.add_argument("left")
    mg.add_argument("right")
    masters_flag(mg)
    security_flags(mg, server=False)

    jb = sub.add_parser("jobs", help="list the jobs (running, draining, drained, cancelled)")
    jb.add_argument("--json", action="store_true")
    up_ = sub.add_parser("update", help="change a running job in place to the Dataflow or Topology named by MODULE:ATTR")
    up_.add_argument("topology")
    up_.add_argument("--drop-state", action="store_true",
                     help="confirm that computations the new topology removes lose their state")
    up_.add_argument("--reset-state", action="append", default=[], metavar="COMPUTATION",
                     help="start this computation over with empty state (repeatable)")
    dr = sub.add_parser("drain", help="stop a job's input, fire every timer and window, then mark it drained")
    dr.add_argument("job", metavar="TOPOLOGY")
    dr.add_argument("--no-wait", action="store_true", help="return once the drain has begun")
    dr.add_argument("--wait-s", type=float, default=None, help="give up waiting after this many seconds")
    ca = sub.add_parser("cancel", help="stop a job at once and delete its state")
    ca.add_argument("job", metavar="TOPOLOGY")
    ca.add_argument("--keep-state", action="store_true",
                    help="keep its state on the workers; submitting the job again resumes it")
    sg = sub.add_parser("state", help="read one key's state from a running job: state get COMPUTATION KEY "
                                      "[--state NAME]")
    sg.add_argument("action", choices=["get"])
    sg.add_argument("computation")
    sg.add_argument("key", help="the key (UTF-8 text; 0x... for hex bytes)")
    sg.add_argument("--state", default=None, metavar="NAME",
                    help="a typed state (ValueState, ListState, MapState) declared on the computation's class, by "
                         "its name; printed as JSON. Without it: ctx.state's bytes")
    sg.add_argument("--json", action="store_true")
    sv = sub.add_parser("savepoint", help="write a consistent copy of a running job into a new directory")
    sv.add_argument("job", metavar="TOPOLOGY")
    sv.add_argument("directory", metavar="DIR")
    sv.add_argument("--timeout-s", type=float, default=60.0,
                    help="how long the job may take to come to rest (default 60)")
    rs = sub.add_parser("restore", help="submit a job from a savepoint directory")
    rs.add_argument("directory", metavar="DIR")
    rs.add_argument("--as", dest="as_name", default=None, metavar="NAME", help="the job's name here")
    ri = sub.add_parser("release-injector", help="drop every hold the injectors named NAME have on a stream's watermark "
                                                 "(one that crashed, or was refused and left its hold)")
    ri.add_argument("name", metavar="NAME")
    ri.add_argument("--stream", required=True, help="the stream it holds")
    for p in (jb, up_, dr, ca, sg, sv, rs, ri):
        masters_flag(p)
        security_flags(p, server=False)

    inj = sub.add_parser("inject-files", help="inject the lines of the files in a directory")
    inj.add_argument("directory")
    inj.add_argument("--stream", required=True)
    inj.add_argument("--name", default=None, help="injector name (default: the directory's)")
    inj.add_argument("--key-field", default=None, metavar="FIELD",
                     help="JSON lines: each record's key is this field (default: the file's name)")
    inj.add_argument("--timestamp-field", default=None, metavar="FIELD",
                     help="JSON lines: each record's event time is this field, microseconds since the epoch or an "
                          "ISO 8601 time with a zone (default: the file's creation time); the watermark then stays "
                          "put until every file is sent, then finishes")
    inj.add_argument("--timestamp-unit", choices=["s", "ms", "us", "ns"], default=None,
                     help="the unit of numeric times in --timestamp-field (default: microseconds, and times that "
                          "look like another unit are refused)")
    inj.add_argument("--allow-code", default=from_env("MILLSTREAM_ALLOW_CODE"),
                     help="comma-separated module prefixes the stream's key extractors may be loaded "
                          "from (env MILLSTREAM_ALLOW_CODE); millstream's own are always allowed")
    inj.add_argument("--follow", action="store_true",
                     help="keep going: send each file that comes into the directory later too (move files in "
                          "whole), until Ctrl-C; the stream is not finished")
    inj.add_argument("--poll-s", type=float_in(0.01, 3600, "--poll-s"), default=None, metavar="S",
                     help="--follow: seconds between looks at the directory (default 1)")
    inj.add_argument("--max-delay-s", type=float_in(0, 10**9, "--max-delay-s"), default=None, metavar="S",
                     help="--follow with --timestamp-field: the watermark trails the latest time sent by S seconds; "
                          "a record further behind is late")
    inj.add_argument("--done-dir", default=None, metavar="DIR",
                     help="--follow: move each file here once its records are committed (same file system)")
    masters_flag(inj)
    security_flags(inj, server=False)

    b = sub.add_parser("bench", help="run the benchmarks on a local cluster; writes bench/results/")
    b.add_argument("--peer", choices=["spark", "flink", "bytewax"], action="append", default=None,
                   help="also run the workloads on a peer (repeat for several); Flink and Bytewax get a "
                        "virtualenv of their own, .venv-flink and .venv-bytewax, made on first use")
    b.add_argument("--quick", action="store_true", help="short runs, for smoke tests")
    b.add_argument("--nexmark", action="store_true", help="run only the Nexmark queries (same as --only nexmark)")
    b.add_argument("--nexmark-classic", action="store_true",
                   help="run Nexmark's classic computations (bench/nexmark/queries.py) instead of its Dataflows")
    b.add_argument("--only", default=None, help="comma-separated workloads to run (default: all); \"ab\": none but the "
                        "A/B of --against")
    b.add_argument("--soak-records", type=int_in(1_000, 10**10, "records"), default=None, metavar="N",
                   help="records the soak sends at 10,000 rec/s (default 3,000,000; 200,000 with --quick)")
    b.add_argument("--out", default="bench/results", help="directory for the JSON and Markdown reports")
    b.add_argument("--against", default=None, metavar="COMMIT",
                   help="also run the headline figures of an older commit (git archive of it) and of this "
                        "checkout alternately, and report both with their ratio (bench/ab.py); skipped, with "
                        "a line in the report, if the checkout lacks the commit (a shallow clone)")
    b.add_argument("--ab-rounds", type=int_in(1, 50, "--ab-rounds"), default=None, metavar="R",
                   help="rounds of the A/B: each runs every figure on both sides (default 3)")
    b.add_argument("--ab-figures", default=None, metavar="LIST",
                   help="comma-separated A/B figures: recordpath, w1-1stage, w1-3stages, w1-user-1stage, "
                        "w1-user-3stages, w2-user, nexmark-q0-user (the default); w2, nexmark-q0 (classic "
                        "computations on both sides); and on flows, against a commit that has them: "
                        "recordpath-flow3, w1-flow-1stage, w1-flow-3stages, w2-flow, nexmark-q0-flow; replica-writes")

    d = sub.add_parser("demo", help="run the main example end to end on an embedded cluster")
    d.add_argument("--data-dir", default=None)
    d.add_argument("--workers", type=int_in(1, 64, "--workers"), default=2)
    etcd_binary_flag(d)
    return parser


def _run(args: argparse.Namespace) -> int:
    cmd = args.command
    if cmd == "master":
        from master.core import MasterConfig
        from master.rebalance import Policy
        from master.server import MasterOptions, main
        from master.store import EtcdConfig

        etcd = EtcdConfig.parse(need(args.etcd, "--etcd", "MILLSTREAM_ETCD"),
                                user=args.etcd_user, password=args.etcd_password, ca_cert=args.etcd_ca)
        if args.lease_ms < 500:
            raise ConfigError(f"--lease-ms {args.lease_ms} is too short; use 500 or more")
        policy = Policy(hold_s=args.rebalance_hold_s, cooldown_s=args.rebalance_cooldown_s,
                        min_rate=args.rebalance_min_rate)
        config = MasterConfig(lease_ms=args.lease_ms, replication=args.replication, rebalance=args.rebalance,
                              policy=policy, injector_expiry_s=args.injector_expiry_s)
        main(MasterOptions(etcd, args.listen, config,
                           advertise=args.advertise, http_listen=args.http_listen, security=security(args),
                           health_listen=args.health_listen or None,
                           require_injector_credentials=args.require_injector_credentials,
                           http_token=args.http_token, http_tls=args.http_tls))
        return 0
    if cmd == "worker":
        from runtime.client import parse_addresses
        from runtime.imports import CodePolicy
        from worker.server import WorkerOptions
        from worker.server import main as worker_main

        masters = parse_addresses(need(args.masters, "--masters", "MILLSTREAM_MASTERS"))
        state = os.path.abspath(need(args.state_dir, "--state-dir", "MILLSTREAM_STATE_DIR"))
        worker_main(WorkerOptions(tuple(masters), args.listen, state, args.metrics_listen,
                                  advertise=args.advertise, security=security(args),
                                  code_policy=CodePolicy.parse(args.allow_code), zone=args.zone,
                                  health_listen=args.health_listen or None,
                                  require_injector_credentials=args.require_injector_credentials,
                                  metrics_token=args.metrics_token, metrics_tls=args.metrics_tls,
                                  data_port=args.data_port))
        return 0
    if cmd == "credential":
        from runtime.security import injector_credential

        print(injector_credential(need(args.worker_token, "--worker-token-file", "MILLSTREAM_WORKER_TOKEN_FILE"),
                                  args.name))
        return 0
    if cmd == "up":
        from cli.up import run_up

        return run_up(args.data_dir, masters=args.masters, workers=args.workers, lease_ms=args.lease_ms,
                      port=args.port, etcd_binary=args.etcd_binary, log_format=args.log_format,
                      allow_code=args.allow_code)
    if cmd == "run":
        from cli.run import run_job

        return run_job(args.job, args.input, key_field=args.key_field, time_field=args.timestamp_field,
                       unit=args.timestamp_unit, out_dir=args.out)
    if cmd == "explain":
        from cli.explain import explain_job

        print(explain_job(args.job))
        return 0
    if cmd == "submit":
        from cli.lifecycle import topology_at
        from runtime.client import connect

        topo = topology_at(args.topology)
        with connect(need(args.masters, "--masters", "MILLSTREAM_MASTERS"), timeout=args.timeout,
                     security=security(args)) as c:
            n = c.submit(topo)
        print(f"submitted topology {topo.name!r}: {n} tablets")
        return 0
    if cmd in ("jobs", "update", "drain", "cancel", "state", "savepoint", "restore", "release-injector"):
        from cli.lifecycle import run_lifecycle
        from runtime.client import connect

        with connect(need(args.masters, "--masters", "MILLSTREAM_MASTERS"), timeout=args.timeout,
                     security=security(args)) as c:
            return run_lifecycle(c, args)
    if cmd == "status":
        from cli.status import run_status
        from runtime.client import connect

        with connect(need(args.masters, "--masters", "MILLSTREAM_MASTERS"), timeout=args.timeout,
                     security=security(args)) as c:
            return run_status(c, args)
    if cmd in ("move", "split", "merge"):
        from runtime.client import connect

        with connect(need(args.masters, "--masters", "MILLSTREAM_MASTERS"), timeout=args.timeout,
                     security=security(args)) as c:
            if cmd == "move":
                comp, r = tablet(args.tablet)
                token = c.move(comp, r, args.worker)
                print(f"tablet {args.tablet} -> {args.worker} (token {token})")
                return 0
            if cmd == "split":
                comp, r = tablet(args.tablet)
                ranges = c.split(comp, r, args.at)
            else:
                comp, left = tablet(args.left)
                comp2, right = tablet(args.right)
                if comp2 != comp:
                    raise ConfigError(f"{args.left} and {args.right} are ranges of different computations; "
                                      "only ranges of one computation merge")
                ranges = c.merge(comp, left, right)
        for kr in ranges:
            print(f"{comp}/{kr['key_range']}  [{kr['start']:#018x}, {kr['end']:#018x})  "
                  f"primary {kr['primary']} token {kr['token']}")
        return 0
    if cmd == "inject-files" and args.follow:
        from cli.follow import follow_command

        return follow_command(args, need(args.masters, "--masters", "MILLSTREAM_MASTERS"), security(args))
    if cmd == "inject-files":
        if args.poll_s is not None or args.max_delay_s is not None or args.done_dir is not None:
            raise ConfigError("--poll-s, --max-delay-s and --done-dir are for --follow; without it the directory is "
                              "sent once and the stream finished")
        from injectors.files import inject_directory

        n = inject_directory(args.directory, need(args.masters, "--masters", "MILLSTREAM_MASTERS"),
                             args.stream, args.name, security=security(args), allow_code=args.allow_code or "",
                             key_field=args.key_field, time_field=args.timestamp_field, unit=args.timestamp_unit)
        print(f"injected {n} lines into {args.stream!r}")
        return 0
    if cmd == "bench":
        if args.peer and "spark" in args.peer:
            _need_spark("millstream bench --peer spark")
        from bench.cli import run_bench

        return run_bench(args)
    if cmd == "demo":
        _need_spark("millstream demo")
        from cli.demo import run_demo

        data_dir = args.data_dir or tempfile.mkdtemp(prefix="millstream-demo-")
        return run_demo(data_dir, workers=args.workers, etcd_binary=args.etcd_binary)
    raise ConfigError(f"unknown command {cmd!r}")  # pragma: no cover - argparse checks


def _need_spark(what: str) -> None:
    """PySpark (the spark extra) and Java 17+, or one line saying what to install."""
    from cli.java import check_java
    from runtime.extras import require

    require("pyspark", "spark", what)
    require("pyarrow", "spark", what)
    check_java(what, from_env("JAVA_HOME"))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Like `python -m`: user modules in the working directory are importable (submit, workers).
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    root = logging.getLogger()
    root.setLevel(getattr(logging, str(args.log_level).upper(), logging.INFO))
    try:
        root.addHandler(logs.handler(sys.stderr, getattr(args, "log_format", "text")))
        read_secrets(args)
        return _run(args)
    except MillstreamError as e:
        print(f"millstream: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `millstream status | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (Python's flush at exit would raise)
        return 0
    except UnicodeError as e:  # a name, key or path that is not UTF-8 text (the wire's strings are)
        print(f"millstream: error: {e.object[e.start:e.end]!r} is not UTF-8 text; give names and keys as "
              "UTF-8" if isinstance(e, UnicodeEncodeError) else f"millstream: error: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError, OverflowError) as e:  # a path that is not a directory, a number out of range
        log.debug("the command failed", exc_info=True)
        print(f"millstream: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

