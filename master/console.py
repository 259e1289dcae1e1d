"""The console: the master's web page (served by master/web.py).

One HTML page with an inline script and nothing fetched from the network but the master's own
``status.json`` (every second) and ``history.json`` (every two seconds: master/history.py).
From the top: plots of records/s, watermark lag and low watermark per computation over the
last minutes (SVG drawn by the script), a picture of the graph (streams and computations,
each computation with its rate and lag), tablets per worker (a square per tablet copy), then
the tables: jobs, graph, computations, slow keys, injectors, workers, tablets, splits and
merges. Every value from the cluster is inserted as escaped text, never as markup.
"""

from __future__ import annotations

STYLE = """
 body{font:14px system-ui,sans-serif;margin:1.2em 2em;color:#222}
 h1{margin:0 0 .2em} h2{margin:1.2em 0 .3em;font-size:1.15em}
 table{border-collapse:collapse;margin:0.5em 0 1.5em}
 td,th{border-bottom:1px solid #ddd;padding:3px 10px;text-align:left}
 th{background:#f4f4f4} .num{text-align:right} .warn{color:#b00}
 code{background:#f4f4f4;padding:1px 4px}
 .plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:.4em 1.2em}
 .plot h3{margin:.2em 0;font-size:.95em;font-weight:600;color:#444}
 svg.plot,svg.picture{width:100%;background:#fff;border:1px solid #e3e3e3}
 svg text{font:11px system-ui,sans-serif;fill:#555}
 svg .grid{stroke:#ececec;stroke-width:1}
 svg .series{fill:none;stroke-width:2;stroke-linejoin:round}
 svg .node rect{stroke-width:2} svg .node text.name{font-weight:600;fill:#222;font-size:12px}
 svg .edge{fill:none;stroke:#888;stroke-width:1.5}
 #legend span{display:inline-block;margin-right:1.2em}
 #legend i{display:inline-block;width:22px;height:3px;margin:0 .4em 3px 0;vertical-align:middle}
 .muted{color:#777}
"""

BODY = """
<h1>millstream</h1>
<div id="leader" class="muted"></div>
<h2>Over the last minutes <select id="span"><option value="1">1 min</option>
<option value="5" selected>5 min</option><option value="15">15 min</option></select></h2>
<div id="legend"></div>
<div class="plots">
 <div class="plot"><h3>Records per second</h3><svg id="plot-rate" class="plot" viewBox="0 0 600 200"></svg></div>
 <div class="plot"><h3>Watermark lag (wall clock minus low watermark)</h3>
  <svg id="plot-lag" class="plot" viewBox="0 0 600 200"></svg></div>
 <div class="plot"><h3>Low watermark (event time)</h3>
  <svg id="plot-watermark" class="plot" viewBox="0 0 600 200"></svg></div>
 <div class="plot"><h3>Backlog (records queued)</h3><svg id="plot-backlog" class="plot" viewBox="0 0 600 200"></svg></div>
</div>
<h2>Graph</h2><p class="muted">Streams (dashed) feed computations (boxes: records/s and lag now);
a stream no computation writes comes from injectors.</p>
<svg id="graph-picture" class="picture" viewBox="0 0 600 80"></svg>
<table id="graph"></table>
<h2>Jobs</h2><table id="jobs"></table>
<h2>Computations</h2><table id="comps"></table>
<h2>Slow keys</h2><p>The slowest recent calls of user code (one record or timer) per computation;
a running call holds up its key range only.</p><table id="slow"></table>
<h2>Tablets per worker</h2><p class="muted">A square per tablet copy, coloured by computation: filled where
the worker is the primary, outlined where it holds a follower copy (red outline: not in sync).</p>
<svg id="tablet-map" class="picture" viewBox="0 0 600 40"></svg>
<h2>Workers</h2><table id="workers"></table>
<h2>Injectors</h2><table id="injs"></table>
<h2>Tablets</h2><p>Each tablet is one key range: its hash interval [start, end) in units of 2<sup>48</sup>.</p>
<table id="tablets"></table>
<h2>Recent splits and merges</h2><table id="reshards"></table>
"""

# The script: helpers, the plots, the graph picture, the tablet map, the tables, the refresh loop.
SCRIPT = r"""
let last = null, history = null, status = null;
const PALETTE = ["#1f77b4","#d62728","#2ca02c","#9467bd","#ff7f0e","#17becf","#8c564b","#e377c2","#bcbd22","#7f7f7f"];
const colours = {};
function colour(name){ if(!(name in colours)) colours[name] = PALETTE[Object.keys(colours).length % PALETTE.length];
  return colours[name]; }
// JSON numbers are doubles: the int64 bounds arrive rounded (2^63 - 1 becomes 2^63).
function t(us){ if(us===null || us===undefined) return "-";
  if(us <= -9.2e18) return "start of time"; if(us >= 9.2e18) return "end of time";
  const d = new Date(Math.floor(us / 1000));
  return isNaN(d) ? String(us) : d.toISOString().replace("T"," ").replace("Z",""); }
function lag(ms){ if(ms===null || ms===undefined) return "-"; const a = Math.abs(ms);
  if(a < 10000) return Math.round(ms)+" ms"; if(a < 3600e3) return (ms/1e3).toFixed(1)+" s";
  if(a < 86400e3) return (ms/3600e3).toFixed(1)+" h"; return (ms/86400e3).toFixed(1)+" days"; }
function count(v){ const a = Math.abs(v); if(a >= 1e9) return (v/1e9).toFixed(1)+"G";
  if(a >= 1e6) return (v/1e6).toFixed(1)+"M"; if(a >= 1e4) return (v/1e3).toFixed(0)+"k";
  if(a >= 1e3) return (v/1e3).toFixed(1)+"k"; return String(Math.round(v*10)/10); }
function clock(ms, withDate){ const d = new Date(ms); if(isNaN(d)) return "-";
  const s = d.toISOString(); return withDate ? s.slice(0,10)+" "+s.slice(11,19) : s.slice(11,19); }
// Every value from the cluster is text: escaped, never markup. Only {html: ...} cells built
// here from constant markup are inserted as HTML.
function esc(v){ return String(v).replace(/[&<>"']/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"})[c]); }
function cell(c){ return (c !== null && typeof c === "object" && "html" in c) ? c.html : esc(c); }
function row(cells, head){ return "<tr>"+cells.map(c=>head?`<th>${cell(c)}</th>`:`<td>${cell(c)}</td>`).join("")+"</tr>"; }
function table(id, head, rows){ document.getElementById(id).innerHTML = row(head,true)+rows.map(r=>row(r)).join(""); }

// ---- plots: one line per computation, x = wall clock over the chosen span
// A round step near ``raw``: 1, 2 or 5 times a power of ten.
function nice(raw){ const p = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / p;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p; }
function plot(id, field, fmt, zero){
  const svg = document.getElementById(id), W = 600, H = 200, L = 62, R = 8, T = 8, B = 22;
  // From the chosen span ago (or the first sample, when the history is shorter) to now.
  const span = Number(document.getElementById("span").value) * 60e3, t1 = Date.now();
  const first = Math.min(...Object.values((history && history.computations) || {}).map(h => h.t.length ? h.t[0] : t1));
  const t0 = Math.max(t1 - span, Math.min(first, t1 - 10e3));
  const series = [];
  let lo = Infinity, hi = -Infinity;
  for (const [name, h] of Object.entries((history && history.computations) || {})) {
    const pts = [];
    h.t.forEach((at, i) => { const v = h[field][i];
      if (at >= t0 && v !== null && v !== undefined) { pts.push([at, v]); lo = Math.min(lo, v); hi = Math.max(hi, v); }
      else if (at >= t0) pts.push(null); });
    series.push([name, pts]);
  }
  const out = [];
  if (!isFinite(lo)) { svg.innerHTML = `<text x="${W/2}" y="${H/2}" text-anchor="middle">no samples yet</text>`; return; }
  if (zero) lo = Math.min(lo, 0);
  if (hi - lo < 1e-9) { const pad = Math.max(Math.abs(hi) * 0.1, 1); hi += pad; if (!zero || lo !== 0) lo -= pad; }
  const x = at => L + (at - t0) / (t1 - t0) * (W - L - R), y = v => T + (hi - v) / (hi - lo) * (H - T - B);
  const dy = nice((hi - lo) / 4);
  for (let v = Math.ceil(lo / dy) * dy; v <= hi + dy * 1e-6; v += dy) { const yy = y(v).toFixed(1);
    out.push(`<line class="grid" x1="${L}" x2="${W-R}" y1="${yy}" y2="${yy}"/>`,
             `<text x="${L-4}" y="${(Number(yy)+4).toFixed(1)}" text-anchor="end">${esc(fmt(v, hi - lo))}</text>`); }
  const step = [5e3, 10e3, 15e3, 30e3, 60e3, 120e3, 300e3].find(st => (t1 - t0) / st <= 6) || 300e3;
  for (let at = Math.ceil(t0 / step) * step; at <= t1; at += step) { const xx = x(at).toFixed(1);
    out.push(`<line class="grid" x1="${xx}" x2="${xx}" y1="${T}" y2="${H-B}"/>`,
             `<text x="${xx}" y="${H-6}" text-anchor="middle">${clock(at)}</text>`); }
  for (const [name, pts] of series) {
    let d = "", n = 0, pen = false;
    for (const p of pts) { if (p === null) { pen = false; continue; }
      d += (pen ? "L" : "M") + x(p[0]).toFixed(1) + " " + y(p[1]).toFixed(1) + " "; pen = true; n++; }
    if (n) out.push(`<path class="series" data-computation="${esc(name)}" data-points="${n}" stroke="${colour(name)}" d="${d.trim()}"><title>${esc(name)}</title></path>`);
  }
  svg.innerHTML = out.join("");
}
function plots(){
  plot("plot-rate", "rate", v => count(v) + "/s", true);
  plot("plot-lag", "lag_ms", v => lag(v), true);
  plot("plot-watermark", "watermark", (v, range) => clock(v, range > 86400e3), false);
  plot("plot-backlog", "backlog", v => count(v), true);
  const names = Object.keys((history && history.computations) || {});
  document.getElementById("legend").innerHTML = names.map(n =>
    `<span><i style="background:${colour(n)}"></i>${esc(n)}</span>`).join("");
}

// ---- the graph: layers from the input streams rightwards; a box per computation
function graphPicture(s, rates){
  const specs = [];
  for (const [job, topo] of Object.entries(s.topologies || {}))
    for (const [c, spec] of Object.entries(topo.computations || {})) specs.push([c, spec, job]);
  const writers = {};
  for (const [c, spec] of specs) for (const o of spec.outputs || []) (writers[o] = writers[o] || []).push(c);
  const read = new Set(specs.flatMap(([, spec]) => Object.keys(spec.inputs || {})));
  const sources = [...read].filter(st => !writers[st]).sort();
  const layer = {};
  for (const st of sources) layer["s:" + st] = 0;
  for (let round = 0; round <= specs.length; round++)  // longest path; a cycle across jobs stops here
    for (const [c, spec] of specs) { let l = 1;
      for (const st of Object.keys(spec.inputs || {})) for (const w of writers[st] || []) l = Math.max(l, (layer["c:" + w] || 1) + 1);
      layer["c:" + c] = Math.min(l, specs.length + 1); }
  const ends = [...new Set(specs.flatMap(([, spec]) => spec.outputs || []))].filter(st => !read.has(st)).sort();
  const deepest = Math.max(1, ...Object.values(layer));
  for (const st of ends) layer["e:" + st] = deepest + 1;
  const columns = {};
  for (const id of Object.keys(layer).sort()) (columns[layer[id]] = columns[layer[id]] || []).push(id);
  const NW = 150, NH = 40, GX = 70, GY = 18, pos = {};
  let width = 0, height = 0;
  for (const [l, ids] of Object.entries(columns)) ids.forEach((id, i) => {
    pos[id] = [10 + Number(l) * (NW + GX), 10 + i * (NH + GY)];
    width = Math.max(width, pos[id][0] + NW + 10); height = Math.max(height, pos[id][1] + NH + 10); });
  const out = [`<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto"><path d="M0 0L10 5L0 10z" fill="#888"/></marker></defs>`];
  const edge = (a, b, label) => { const [x1, y1] = pos[a], [x2, y2] = pos[b];
    const ax = x1 + NW, ay = y1 + NH / 2, bx = x2, by = y2 + NH / 2, mx = (ax + bx) / 2;
    out.push(`<path class="edge" marker-end="url(#arrow)" d="M${ax} ${ay}C${mx} ${ay} ${mx} ${by} ${bx} ${by}"><title>${esc(label)}</title></path>`); };
  for (const [c, spec] of specs) {
    for (const st of Object.keys(spec.inputs || {})) {
      if (!writers[st]) edge("s:" + st, "c:" + c, st);
      for (const w of writers[st] || []) edge("c:" + w, "c:" + c, st);
    }
    for (const st of spec.outputs || []) if (!read.has(st)) edge("c:" + c, "e:" + st, st);
  }
  const comps = s.computations || {};
  for (const [id, [x, y]] of Object.entries(pos)) {
    const kind = id.slice(0, 1), name = id.slice(2);
    if (kind === "c") {
      const v = comps[name] || {}, r = rates[name];
      const line = `${r === undefined ? "-" : count(r) + "/s"} · lag ${lag(v.lag_ms)}`;
      out.push(`<g class="node computation" data-name="${esc(name)}"><rect x="${x}" y="${y}" width="${NW}" height="${NH}" rx="4" fill="#fff" stroke="${colour(name)}"/>`
        + `<text class="name" x="${x + 8}" y="${y + 16}">${esc(name.length > 22 ? name.slice(0, 21) + "…" : name)}</text>`
        + `<text x="${x + 8}" y="${y + 32}">${esc(line)}</text><title>${esc(name)}</title></g>`);
    } else {
      out.push(`<g class="node stream" data-name="${esc(name)}"><rect x="${x}" y="${y + 6}" width="${NW}" height="${NH - 12}" rx="14" fill="#f7f7f7" stroke="#999" stroke-dasharray="4 3"/>`
        + `<text x="${x + NW / 2}" y="${y + NH / 2 + 4}" text-anchor="middle">${esc(name.length > 24 ? name.slice(0, 23) + "…" : name)}</text><title>stream ${esc(name)}</title></g>`);
    }
  }
  const svg = document.getElementById("graph-picture");
  svg.setAttribute("viewBox", `0 0 ${Math.max(width, 300)} ${Math.max(height, 60)}`);
  svg.style.maxWidth = Math.max(width, 300) * 1.4 + "px";
  svg.innerHTML = specs.length ? out.join("") : `<text x="10" y="35">no jobs</text>`;
}

// ---- tablets per worker: a square per copy
function tabletMap(s){
  const rows = (s.workers || []).map(w => [w, [], []]), at = {};
  rows.forEach(r => at[r[0].id] = r);
  for (const x of s.tablets || []) {
    if (at[x.primary]) at[x.primary][1].push(x);
    for (const f of x.followers || []) if (at[f]) at[f][2].push([x, (x.in_sync || []).includes(f)]);
  }
  const S = 12, G = 3, LW = 190, PER = 30, out = [];
  let y = 8;
  for (const [w, primaries, copies] of rows) {
    const cells = primaries.map(x => [x, true, true]).concat(copies.map(([x, ok]) => [x, false, ok]));
    const lines = Math.max(1, Math.ceil(cells.length / PER));
    out.push(`<text x="6" y="${y + 10}">${esc(w.id)} <tspan fill="#999">${esc(w.address)}</tspan></text>`,
             `<text x="6" y="${y + 23}" fill="#999">${primaries.length} primaries, ${copies.length} copies</text>`);
    cells.forEach(([x, primary, ok], i) => {
      const cx = LW + (i % PER) * (S + G), cy = y + Math.floor(i / PER) * (S + G), c = colour(x.computation);
      out.push(`<rect class="tablet ${primary ? "primary" : "follower"}" data-tablet="${esc(x.computation + "/" + x.key_range)}" x="${cx}" y="${cy}" width="${S}" height="${S}" rx="2" `
        + (primary ? `fill="${c}" stroke="${c}"` : `fill="#fff" stroke="${ok ? c : "#d00"}" stroke-width="2"`)
        + `><title>${esc(x.computation + "/" + x.key_range + (primary ? " primary" : ok ? " follower (in sync)" : " follower (catching up)"))}</title></rect>`); });
    y += Math.max(30, lines * (S + G)) + 8;
  }
  const svg = document.getElementById("tablet-map");
  svg.setAttribute("viewBox", `0 0 ${LW + PER * (S + G) + 10} ${Math.max(y, 30)}`);
  svg.innerHTML = rows.length ? out.join("") : `<text x="10" y="20">no workers</text>`;
}

function tables(s, rates){
  table("jobs", ["job","state","input streams","computations"], (s.jobs||[]).map(j => [j.name,
    {html: `<span class="state ${esc(j.state)}">${esc(j.state)}</span>`}, (j.input_streams||[]).join(", ")||"-",
    j.computations.map(c => c.name).join(", ")||"-"]));
  const edges = [];
  for (const [tn, topo] of Object.entries(s.topologies))
    for (const [c, spec] of Object.entries(topo.computations))
      edges.push([tn, Object.keys(spec.inputs).join(", "), {html: `<b>${esc(c)}</b>`}, spec.outputs.join(", ") || "-", spec.key_ranges]);
  table("graph", ["topology","reads","computation","writes","key ranges"], edges);
  table("comps", ["computation","low watermark","lag","held by","records/s","processed","late","dead-lettered","backlog"],
    Object.entries(s.computations).map(([c, v]) => [c, t(v.low_watermark), lag(v.lag_ms), v.held_by,
      {html: `<span class=num>${esc(rates[c] === undefined ? "-" : rates[c].toFixed(0))}</span>`},
      v.processed, v.late, v.dead_lettered, v.backlog]));
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
}

// The rate now: from the history's newest sample, else from two polls of status.json.
function ratesNow(s, now){
  const out = {};
  for (const [c, v] of Object.entries(s.computations || {})) {
    const h = history && history.computations && history.computations[c];
    const r = h && h.rate.length ? h.rate[h.rate.length - 1] : null;
    const prev = last && last.s.computations[c];
    if (r !== null && r !== undefined) out[c] = r;
    else if (prev) out[c] = (v.processed - prev.processed) * 1000 / (now - last.at);
  }
  return out;
}

async function refresh(){
  // tokens as text: a restored tablet's passes 2^53, which a JS number would round
  let s; try { s = JSON.parse((await (await fetch("status.json")).text()).replace(/"token": *(\d{16,})/g, '"token": "$1"')); } catch(e) { return; }
  if(s.error){ document.getElementById("leader").innerHTML = `<p class="warn">${esc(s.error)}</p>`; return; }
  const now = Date.now();
  status = s;
  document.getElementById("leader").innerHTML = `leader <code>${esc(s.masters.leader)}</code> of ${esc(s.masters.all.join(", "))} · ${clock(now)} UTC`;
  const rates = ratesNow(s, now);
  tables(s, rates);
  graphPicture(s, rates);
  tabletMap(s);
  last = {s, at: now};
}
async function refreshHistory(){
  try { history = await (await fetch("history.json")).json(); } catch(e) { return; }
  plots();
}
document.getElementById("span").addEventListener("change", plots);
refreshHistory().then(refresh); setInterval(refresh, 1000); setInterval(refreshHistory, 2000);
"""

PAGE = ('<!doctype html>\n<html><head><meta charset="utf-8"><title>millstream</title>\n<style>' + STYLE
        + "</style></head><body>" + BODY + "<script>" + SCRIPT + "</script></body></html>\n")
