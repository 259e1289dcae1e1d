"""``millstream bench``: run the workloads on fresh local clusters and write the report.

``--quick`` shrinks every workload (seconds instead of minutes; for smoke tests,
not for citing); ``--only w1,recovery,w2,replication,rescale,memory,profile,nexmark,soak`` picks workloads
(``soak`` sends ``--soak-records`` through two stages at 10,000 rec/s: 3 million by default,
five minutes; 20 million for the figures docs/performance.md quotes);
``--peer spark``, ``--peer flink`` and ``--peer bytewax`` add the Spark Structured Streaming,
Flink and Bytewax runs and the ratios (``w2`` runs W2 twice: the classic computations, and on a
flow as a user writes it, which the issue-30 ratios compare; with Spark or Bytewax, the flow's
run and Bytewax's come right after Spark's, first of all, so the pairs are measured minutes
apart, not an hour); ``--against COMMIT`` adds the A/B of the headline figures against an older
commit, ``--ab-rounds`` rounds of each (bench/ab.py; ``--only ab`` runs nothing else).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import logging
import os
import shutil
import tempfile
import time
from typing import TYPE_CHECKING, Any

from bench import report, workloads

if TYPE_CHECKING:
    from bench.generator import W2Data, W2Oracle

log = logging.getLogger(__name__)
DEFAULT = ("w1", "recovery", "w2", "replication", "rescale", "memory", "profile", "nexmark", "soak")
ALL = (*DEFAULT, "ab")  # "ab": the A/B of --against, which runs whenever --against is given
SOAK_RECORDS = 3_000_000
SOAK_RATE = 10_000
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _selected(only: str | None) -> list[str]:
    if not only:
        return list(DEFAULT)
    names = [n.strip() for n in only.split(",") if n.strip()]
    bad = [n for n in names if n not in ALL]
    if bad:
        from runtime.errors import ConfigError

        raise ConfigError(f"--only {','.join(bad)}: unknown workload; choose from {', '.join(ALL)}")
    return [n for n in names if n != "ab"]


def _ab_plan(args: argparse.Namespace) -> tuple[str, int, list[str]] | None:
    """(commit, rounds, figures) of the A/B that ``--against`` asks for, or None."""
    from bench.ab import ROUNDS
    from bench.ab_figures import DEFAULT_FIGURES, FIGURES
    from runtime.errors import ConfigError

    against = getattr(args, "against", None)
    only = getattr(args, "only", None) or ""
    if not against:
        if "ab" in [n.strip() for n in only.split(",")]:
            raise ConfigError("--only ab: the A/B needs a commit to compare with; add --against COMMIT")
        return None
    figures = [f.strip() for f in (getattr(args, "ab_figures", None) or ",".join(DEFAULT_FIGURES)).split(",") if f.strip()]
    bad = [f for f in figures if f not in FIGURES]
    if bad:
        raise ConfigError(f"--ab-figures {','.join(bad)}: unknown figure; choose from {', '.join(FIGURES)}")
    return against, getattr(args, "ab_rounds", None) or ROUNDS, figures


def _progress(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_bench(args: argparse.Namespace) -> int:
    """Run the selected workloads; write ``<out>/<stamp>-<commit>.json|.md``. Returns 0 if
    every run produced exact results (targets are reported, never enforced)."""
    chosen = ["nexmark"] if getattr(args, "nexmark", False) else _selected(getattr(args, "only", None))
    cfg = workloads.BenchConfig.make(bool(getattr(args, "quick", False)))
    peers = list(getattr(args, "peer", None) or [])
    ab_plan = _ab_plan(args)
    out_dir = getattr(args, "out", None) or os.path.join(ROOT, "bench", "results")
    # Workers import bench.jobs by path: make this checkout importable in every child.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    root = tempfile.mkdtemp(prefix="millstream-bench-")
    t0 = time.monotonic()
    r: dict[str, Any] = {
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git": report.git_commit(ROOT), "environment": report.environment(), "versions": report.versions(),
        "config": {"quick": cfg.quick, "workloads": chosen, "peers": peers, "workers": cfg.workers,
                   "masters": 1, "replication": cfg.replication, "lease_ms": cfg.lease_ms, "key_ranges_per_computation": cfg.key_ranges,
                   "w1_seconds": cfg.w1_seconds, "w1_rates": list(cfg.w1_rates),
                   "w1_variants": [v.__dict__ for v in workloads.W1_VARIANTS],
                   "w1_keys": "Zipf s=1.1 over 10,000 keys, seed 42", "w1_warmup_excluded_s": cfg.warmup_s,
                   "recovery_seconds": cfg.recovery_seconds, "w2_records": cfg.w2_records,
                   "w2_timeout_s": cfg.w2_timeout_s, "memory_keys": cfg.memory_keys, "scratch": root,
                   "against": ab_plan and ab_plan[0]},
        "targets": report.TARGETS | {f"nexmark_{q}_events_per_cpu_s": v for q, v in report.NEXMARK_TARGETS.items()},
    }
    ok = True
    try:
        w2_data = w2_oracle = None
        if "w2" in chosen or "replication" in chosen or peers:
            from bench import generator

            w2_data = generator.w2_data(cfg.w2_records)
            w2_oracle = generator.w2_oracle(w2_data)
        if "spark" in peers:
            # Spark first, before this process has used gRPC: PySpark starts its JVM with a
            # fork whose pre-exec hook runs Python, and gRPC's threads do not survive a fork
            # (a later start failed with "Java gateway process exited" in 20261128T095145Z).
            from bench import spark_peer

            _progress("peer: Spark Structured Streaming (local[2])")
            load = _load()
            r["spark"] = spark_peer.run(root, cfg, {}, w2_data, w2_oracle)
            r["spark"]["loadavg_start"] = load
        if "w2" in chosen and ("spark" in peers or "bytewax" in peers):
            # The pairs the issue-30 ratios compare, measured back to back: the machine's
            # speed drifts over a run of an hour, and Spark's figure is taken first.
            ok &= _w2_flow(r, root, cfg, w2_data, w2_oracle)
            if "bytewax" in peers:
                ok &= _bytewax(r, root, cfg, w2_data, w2_oracle)
        if "w1" in chosen:
            r["w1"] = []
            for v in workloads.W1_VARIANTS:
                for rate in cfg.w1_rates:
                    _progress(f"W1 {v.name} at {rate:,} rec/s for {cfg.w1_seconds:g} s")
                    res = workloads.run_w1(root, cfg, v, rate)
                    r["w1"].append(res)
                    ok &= bool(res["exactness"]["exact"])
                    _progress(f"  latency {res['latency_ms']}, exact: {res['exactness']['exact']}")
            # Issue 4 asks for the lag at the end of a 3-stage pipeline at steady load.
            for name in ("eo-3-stages", "eo-strong-fsync"):
                main = report.w1_find(r, name, max(cfg.w1_rates))
                if main is not None:
                    r["watermark_lag"] = main["watermark_lag_ms"] | {
                        "from": f"W1 {name} at {max(cfg.w1_rates):,} rec/s"}
                    break
        if "recovery" in chosen:
            _progress(f"recovery: W1 at 10,000 rec/s for {cfg.recovery_seconds:g} s, SIGKILL a worker")
            res = workloads.run_w1(root, cfg, workloads.W1_VARIANTS[0], 10_000,
                                   kill_at_s=cfg.recovery_seconds / 3, seconds=cfg.recovery_seconds)
            r["recovery"] = res
            ok &= bool(res["exactness"]["exact"])
            _progress(f"  {res.get('recovery', {}).get('serving_again_after_s')} s to serve again, "
                      f"exact: {res['exactness']['exact']}")
        if "w2" in chosen:
            _progress(f"W2: {cfg.w2_records:,} records, 1 s event-time windows + spikes")
            res = workloads.run_w2(root, cfg, w2_data, w2_oracle)
            r["w2"] = res
            if res.get("available"):
                ok &= bool(res.get("oracle_equal"))
            _progress(f"  {res.get('throughput_rps') or res.get('why')}")
            if "w2_flow" not in r:
                ok &= _w2_flow(r, root, cfg, w2_data, w2_oracle)
        if "replication" in chosen:
            r["replication"] = []
            for copies in (1, 2):
                rcfg = dataclasses.replace(cfg, replication=copies)
                runs: dict[str, Any] = {"replication": copies, "w1": []}
                for rate in cfg.w1_rates:
                    _progress(f"replication {copies}: W1 {workloads.W1_VARIANTS[0].name} at {rate:,} rec/s")
                    res = workloads.run_w1(root, rcfg, workloads.W1_VARIANTS[0], rate)
                    runs["w1"].append(res)
                    ok &= bool(res["exactness"]["exact"])
                    _progress(f"  latency {res['latency_ms']}")
                _progress(f"replication {copies}: W2 {cfg.w2_records:,} records")
                runs["w2"] = workloads.run_w2(root, rcfg, w2_data, w2_oracle)
                if runs["w2"].get("available"):
                    ok &= bool(runs["w2"].get("oracle_equal"))
                _progress(f"  {runs['w2'].get('throughput_rps')} rec/s")
                r["replication"].append(runs)
        if "rescale" in chosen:
            from bench.rescale import run_rescale

            _progress("rescale: W1 on 1 range per computation, 2 workers added, the policy splits")
            r["rescale"] = res = run_rescale(root, cfg)
            ok &= bool(res["exactness"]["exact"])
            _progress(f"  {res['phases']}")
        if "memory" in chosen:
            _progress(f"memory: RocksDB bytes for {cfg.memory_keys:,} keys")
            r["memory"] = {"rocksdb": workloads.rocksdb_bytes_per_million_keys(root, cfg.memory_keys)}
        if "profile" in chosen:
            from bench.profile import profile_record_path

            _progress("profile: the in-process record path under cProfile")
            r["profile"] = profile_record_path(root, 20_000 if not cfg.quick else 4_000)
        if "nexmark" in chosen:
            from bench.nexmark import run as nexmark

            classic = bool(getattr(args, "nexmark_classic", False))
            _progress(f"Nexmark ({'classic computations' if classic else 'Dataflows'}): "
                      f"{', '.join(nexmark.queries_of(classic))}, each on a fresh cluster")
            r["nexmark"] = nx = nexmark.run(root, cfg, classic=classic)
            for q in nx["queries"]:
                exact = all(q.get(k, {}).get("exactness", {}).get("exact") for k in ("throughput", "latency"))
                ok &= exact
                _progress(f"  {q['query']}: {q.get('throughput', {}).get('events_per_cpu_s')} events per CPU-s, "
                          f"latency {q.get('latency', {}).get('ms')}, exact: {exact}{' ' + q['error'] if 'error' in q else ''}")
        if "soak" in chosen:
            from bench.soak import run_soak

            n = getattr(args, "soak_records", None) or (200_000 if cfg.quick else SOAK_RECORDS)
            _progress(f"soak: {n:,} records through two exactly-once stages at {SOAK_RATE:,} rec/s")
            r["soak"] = run_soak(root, cfg, n, SOAK_RATE, sample_s=2.0 if cfg.quick else 30.0)
            _progress(f"  dedup bytes per million records: {r['soak']['dedup_bytes_per_1m_records']}, "
                      f"table-file slope {r['soak']['slope_sst_bytes_per_1m']} B per million")
        r.setdefault("memory", {})["peak_rss_by_role"] = _rss_by_role(r)
        if ab_plan is not None:
            from bench import ab

            against, rounds, figures = ab_plan
            _progress(f"A/B against {against}: {', '.join(figures)}, {rounds} rounds, alternating")
            r["ab"] = ab.run(ROOT, against, rounds=rounds, quick=cfg.quick, figures=figures, progress=_progress)
            ok &= ab.current_exact(r["ab"])
        if "spark" in peers:  # its figures were measured first (above); compared now
            r["spark"]["comparison"] = spark_peer.compare(r, r["spark"])
        if "flink" in peers:
            from bench import flink_peer

            _progress("peer: Flink (PyFlink SQL, local MiniCluster, parallelism 2)")
            load = _load()
            r["flink"] = flink_peer.run(root, cfg, r, w2_data, w2_oracle)
            r["flink"]["loadavg_start"] = load
        if "bytewax" in peers and "bytewax" not in r:
            ok &= _bytewax(r, root, cfg, w2_data, w2_oracle)
    finally:
        r["elapsed_s"] = round(time.monotonic() - t0)
        js, md = report.write(r, out_dir)
        shutil.rmtree(root, ignore_errors=True)
    print(open(md).read())
    _progress(f"report: {js} and {md}")
    return 0 if ok else 1


def _w2_flow(r: dict[str, Any], root: str, cfg: workloads.BenchConfig, data: W2Data | None, oracle: W2Oracle | None) -> bool:
    """W2 on a flow as a user writes it (the figure issue 30 compares with the peers) into
    ``r["w2_flow"]``; whether it was exact."""
    _progress(f"W2 on a flow (bench.jobs.w2_flow): {cfg.w2_records:,} records from one injector's send() loop")
    r["w2_flow"] = res = workloads.run_w2(root, cfg, data, oracle, flow=True)
    stall = (res.get("window_fire") or {}).get("steps", {})
    _progress(f"  {res.get('throughput_rps') or res.get('error')} rec/s, exact: {res.get('oracle_equal')}, "
              f"window firing stall (max bucket, ms): {({s: x.get('max_le_ms') for s, x in stall.items()})}")
    return bool(res.get("oracle_equal"))


def _bytewax(r: dict[str, Any], root: str, cfg: workloads.BenchConfig, data: W2Data | None, oracle: W2Oracle | None) -> bool:
    """Bytewax's W2 runs into ``r["bytewax"]``; whether every run that finished was exact."""
    from bench import bytewax_peer

    _progress("peer: Bytewax (W2: recovery off on one worker and one per core, recovery on)")
    r["bytewax"] = bytewax_peer.run(root, cfg, data, oracle)
    ok = True
    for run in r["bytewax"].get("runs", []):
        ok &= "error" in run or bool(run.get("oracle_equal"))
        _progress(f"  recovery {run.get('recovery')}: {run.get('throughput_rps') or run.get('error')} rec/s, "
                  f"exact: {run.get('oracle_equal')}")
    if r["bytewax"].get("error"):
        _progress(f"  {r['bytewax']['error']}")
    return ok


def _load() -> list[float]:
    """The 1-, 5- and 15-minute load averages now (recorded with every peer's figures)."""
    return [round(x, 2) for x in os.getloadavg()]


def _rss_by_role(r: dict[str, Any]) -> dict[str, int]:
    """Max peak RSS per role (etcd, master, worker) over every cluster run."""
    runs = [*(r.get("w1") or []), *([r["recovery"]] if r.get("recovery") else []),
            *([r["w2"]] if r.get("w2") else []), *([r["w2_flow"]] if r.get("w2_flow") else [])]
    out: dict[str, int] = {}
    for run in runs:
        for name, b in (run.get("peak_rss_bytes") or {}).items():
            role = name.split("-")[0]
            out[role] = max(out.get(role, 0), b)
    return out
