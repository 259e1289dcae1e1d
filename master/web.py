"""The master's HTTP side: a status page, ``/status.json`` and Prometheus ``/metrics``.

Plain asyncio streams: three read-only GET routes need no web framework.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger(__name__)
StatusFn = Callable[[], Awaitable[dict[str, Any] | None]]

# Bounds on what one client may make us hold (S7, slowloris): a request line or header
# line longer than MAX_LINE_BYTES, more than MAX_HEADER_LINES headers, or a request head
# not complete within HEAD_TIMEOUT_S is refused; at most MAX_CONNECTIONS are served at once.
MAX_LINE_BYTES = 8192
MAX_HEADER_LINES = 100
HEAD_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 64

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>millstream</title>
<style>
 body{font:14px system-ui,sans-serif;margin:2em;color:#222}
 table{border-collapse:collapse;margin:0.5em 0 1.5em}
 td,th{border-bottom:1px solid #ddd;padding:3px 10px;text-align:left}
 th{background:#f4f4f4} .num{text-align:right} .warn{color:#b00}
 code{background:#f4f4f4;padding:1px 4px}
</style></head><body>
<h1>millstream</h1>
<div id="leader"></div>
<h2>Jobs</h2><table id="jobs"></table>
<h2>Graph</h2><table id="graph"></table>
<h2>Computations</h2><table id="comps"></table>
<h2>Slow keys</h2><p>The slowest recent calls of user code (one record or timer) per computation;
a running call holds up its key range only.</p><table id="slow"></table>
<h2>Injectors</h2><table id="injs"></table>
<h2>Workers</h2><table id="workers"></table>
<h2>Tablets</h2><p>Each tablet is one key range: its hash interval [start, end) in units of 2<sup>48</sup>.</p>
<table id="tablets"></table>
<h2>Recent splits and merges</h2><table id="reshards"></table>
<script>
let last = null;
// JSON numbers are doubles: the int64 bounds arrive rounded (2^63 - 1 becomes 2^63).
function t(us){ if(us===null) return "-";
  if(us <= -9.2e18) return "start of time"; if(us >= 9.2e18) return "end of time";
  const d = new Date(Math.floor(us / 1000));
  return isNaN(d) ? String(us) : d.toISOString().replace("T"," ").replace("Z",""); }
function lag(ms){ if(ms===null) return "-"; const a = Math.abs(ms);
  if(a < 10000) return ms+" ms"; if(a < 3600e3) return (ms/1e3).toFixed(1)+" s";
  if(a < 86400e3) return (ms/3600e3).toFixed(1)+" h"; return (ms/86400e3).toFixed(1)+" days"; }
// Every value from the cluster is text: escaped, never markup. Only {html: ...} cells built
// here from constant markup are inserted as HTML.
function esc(v){ return String(v).replace(/[&<>"']/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"})[c]); }
function cell(c){ return (c !== null && typeof c === "object" && "html" in c) ? c.html : esc(c); }
function row(cells, head){ return "<tr>"+cells.map(c=>head?`<th>${cell(c)}</th>`:`<td>${cell(c)}</td>`).join("")+"</tr>"; }
function table(id, head, rows){ document.getElementById(id).innerHTML = row(head,true)+rows.map(r=>row(r)).join(""); }
async function refresh(){
  let s; try { s = await (await fetch("status.json")).json(); } catch(e) { return; }
  if(s.error){ document.getElementById("leader").innerHTML = `<p class="warn">${esc(s.error)}</p>`; return; }
  const now = Date.now();
  document.getElementById("leader").innerHTML = `leader <code>${esc(s.masters.leader)}</code> of ${esc(s.masters.all.join(", "))}`;
  table("jobs", ["job","state","input streams","computations"], (s.jobs||[]).map(j => [j.name,
    {html: `<span class="state ${esc(j.state)}">${esc(j.state)}</span>`}, (j.input_streams||[]).join(", ")||"-",
    j.computations.map(c => c.name).join(", ")||"-"]));
  const edges = [];
  for (const [tn, topo] of Object.entries(s.topologies))
    for (const [c, spec] of Object.entries(topo.computations))
      edges.push([tn, Object.keys(spec.inputs).join(", "), {html: `<b>${esc(c)}</b>`}, spec.outputs.join(", ") || "-", spec.key_ranges]);
  table("graph", ["topology","reads","computation","writes","key ranges"], edges);
  table("comps", ["computation","low watermark","lag","held by","records/s","processed","late","dead-lettered","backlog"],
    Object.entries(s.computations).map(([c, v]) => {
      const prev = last && last.s.computations[c];
      const rate = prev ? ((v.processed - prev.processed) * 1000 / (now - last.at)).toFixed(0) : "-";
      return [c, t(v.low_watermark), lag(v.lag_ms), v.held_by, {html: `<span class=num>${esc(rate)}</span>`},
              v.processed, v.late, v.dead_lettered, v.backlog]; }));
  const slow = [];
  for (const [c, v] of Object.entries(s.computations))
    for (const k of (v.slow_keys || []))
      slow.push([c, k.key, k.key_range, k.running ? {html: `<span class=warn>running for ${esc(k.seconds.toFixed(3))} s</span>`}
                                                 : `${k.seconds.toFixed(3)} s`]);
  table("slow", ["computation","key","key range","user code"], slow);
  table("injs", ["injector","stream","watermark"], s.injectors.map(i => [i.name, i.stream, t(i.watermark)]));
  table("workers", ["id","address","zone","primaries","follower copies","last heartbeat"], s.workers.map(w => [w.id, w.address, w.zone||"-", w.tablets, w.followed, w.last_heartbeat_ms_ago+" ms ago"]));
  const h48 = v => Math.floor(v / 2**48).toString(16).padStart(4, "0");
  table("tablets", ["tablet","hash range","primary","address","followers","in sync","replication","token"], s.tablets.map(x => [`${x.computation}/${x.key_range}`, `[${h48(x.start)}, ${h48(x.end)})`, x.primary||"-", x.address||"-", (x.followers||[]).join(", ")||"-", (x.in_sync||[]).join(", ")||"-", `${(x.in_sync||[]).length}/${x.replication} ${x.health}`, x.token]));
  table("reshards", ["when","what"], (s.reshards||[]).slice().reverse().map(r => [`${r.ago_s} s ago`, r.what]));
  last = {s, at: now};
}
refresh(); setInterval(refresh, 1000);
</script></body></html>
"""


async def serve(listen: str, status: StatusFn) -> tuple[asyncio.AbstractServer, str]:
    """Start the HTTP server on ``HOST:PORT``; returns it and the bound address."""

    active = 0

    async def read_head(reader: asyncio.StreamReader) -> bytes | None:
        """The request line, or None if the head breaks a bound."""
        async with asyncio.timeout(HEAD_TIMEOUT_S):
            request = await reader.readline()
            for _ in range(MAX_HEADER_LINES + 1):
                if await reader.readline() in (b"\r\n", b"\n", b""):
                    return request  # headers: not needed
        return None

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal active
        active += 1
        try:
            if active > MAX_CONNECTIONS:
                code, ctype, body = 503, "text/plain", b"too many connections\n"
            else:
                try:
                    request = await read_head(reader)
                except ValueError:  # a line longer than the stream limit (MAX_LINE_BYTES)
                    request = None
                if request is None:
                    code, ctype, body = 431, "text/plain", (
                        f"request head too large: at most {MAX_HEADER_LINES} header lines of "
                        f"{MAX_LINE_BYTES} bytes\n").encode()
                else:
                    code, ctype, body = await route(request)
            reason = {200: "OK", 404: "Not Found", 431: "Request Header Fields Too Large",
                      503: "Service Unavailable"}[code]
            head = (f"HTTP/1.1 {code} {reason}\r\n"
                    f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError) as e:
            log.debug("http client went away: %s", e)
        finally:
            active -= 1
            writer.close()

    async def route(request: bytes) -> tuple[int, str, bytes]:
        parts = request.decode("latin-1").split()
        path = parts[1].split("?")[0] if len(parts) > 1 else "/"
        if path == "/":
            return 200, "text/html; charset=utf-8", PAGE.encode()
        if path == "/status.json":
            doc = await status()
            doc = doc if doc is not None else {"error": "this master is not the leader"}
            return 200, "application/json", json.dumps(doc).encode()
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest()
        return 404, "text/plain", b"not found\n"

    host, _, port = listen.rpartition(":")
    server = await asyncio.start_server(handle, host, int(port), limit=MAX_LINE_BYTES)
    bound = server.sockets[0].getsockname()[1]
    return server, f"{host}:{bound}"
