"""Draws the figures of the docs as SVG: the processes (architecture.md), the record path
(architecture.md), and how low watermarks are computed and what they do (time.md).

    python docs/figures/make.py            # rewrite docs/figures/*.svg
    python docs/figures/make.py --check    # exit 1 if a committed figure differs

Plain SVG written by hand from the shapes below (no plotting library, nothing random), so the
output is the same on every machine; tests/unit/test_docs_figures.py checks that the committed
files are what this script writes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from xml.sax.saxutils import escape

HERE = os.path.dirname(os.path.abspath(__file__))
FONT = "font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif"
INK, MUTED, LINE = "#222", "#666", "#555"
BLUE, GREEN, RED, ORANGE, PURPLE, GREY = "#1f77b4", "#2ca02c", "#d62728", "#ff7f0e", "#9467bd", "#999"
FILL = {BLUE: "#e8f1fa", GREEN: "#e9f5e9", RED: "#fbeaea", ORANGE: "#fff2e5", PURPLE: "#f1ecf7", GREY: "#f4f4f4"}


class Svg:
    """A figure: shapes in order, rendered as one SVG document."""

    def __init__(self, width: int, height: int, title: str) -> None:
        self.width, self.height, self.title = width, height, title
        self.items: list[str] = []

    def rect(self, x: float, y: float, w: float, h: float, colour: str = GREY, *, rx: float = 6,
             dashed: bool = False, fill: str | None = None, width: float = 1.5) -> None:
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        self.items.append(f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="{rx:g}" '
                          f'fill="{fill or FILL.get(colour, "#fff")}" stroke="{colour}" stroke-width="{width:g}"{dash}/>')

    def text(self, x: float, y: float, s: str, *, size: float = 12, anchor: str = "start", weight: str = "normal",
             colour: str = INK, italic: bool = False) -> None:
        style = ' font-style="italic"' if italic else ""
        self.items.append(f'<text x="{x:g}" y="{y:g}" font-size="{size:g}" text-anchor="{anchor}" '
                          f'font-weight="{weight}" fill="{colour}"{style}>{escape(s)}</text>')

    def box(self, x: float, y: float, w: float, h: float, lines: Sequence[str], colour: str = GREY, *,
            dashed: bool = False, size: float = 12, center: bool = True) -> None:
        """A rounded box with a bold first line and plain lines under it."""
        self.rect(x, y, w, h, colour, dashed=dashed)
        step = size + 4
        top = y + h / 2 - (len(lines) - 1) * step / 2 + size * 0.35
        for i, line in enumerate(lines):
            self.text(x + w / 2 if center else x + 10, top + i * step, line, size=size if i == 0 else size - 1,
                      anchor="middle" if center else "start", weight="bold" if i == 0 else "normal",
                      colour=INK if i == 0 else MUTED)

    def arrow(self, points: Sequence[tuple[float, float]], colour: str = LINE, *, dashed: bool = False,
              both: bool = False, width: float = 1.5) -> None:
        d = "M" + " L".join(f"{x:g} {y:g}" for x, y in points)
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        start = f' marker-start="url(#head-{colour[1:]})"' if both else ""
        self.items.append(f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="{width:g}"{dash}'
                          f' marker-end="url(#head-{colour[1:]})"{start}/>')

    def line(self, points: Sequence[tuple[float, float]], colour: str = LINE, *, width: float = 1.5,
             dashed: bool = False) -> None:
        d = "M" + " L".join(f"{x:g} {y:g}" for x, y in points)
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        self.items.append(f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="{width:g}"{dash}/>')

    def dot(self, x: float, y: float, colour: str, r: float = 4, *, hollow: bool = False) -> None:
        fill = "#fff" if hollow else colour
        self.items.append(f'<circle cx="{x:g}" cy="{y:g}" r="{r:g}" fill="{fill}" stroke="{colour}" stroke-width="1.5"/>')

    def render(self) -> str:
        colours = sorted({LINE, BLUE, GREEN, RED, ORANGE, PURPLE, GREY})
        heads = "".join(f'<marker id="head-{c[1:]}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
                        f'markerHeight="7" orient="auto-start-reverse"><path d="M0 0L10 5L0 10z" fill="{c}"/></marker>'
                        for c in colours)
        body = "\n".join(f"  {i}" for i in self.items)
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" '
                f'viewBox="0 0 {self.width} {self.height}" style="{FONT}">\n'
                f"  <title>{escape(self.title)}</title>\n  <defs>{heads}</defs>\n"
                f'  <rect width="{self.width}" height="{self.height}" fill="#fff"/>\n{body}\n</svg>\n')


def processes() -> Svg:
    """The processes and what flows between them."""
    s = Svg(900, 470, "millstream's processes: etcd, masters, workers, injectors and clients")
    # etcd, masters, clients on top
    s.box(330, 16, 240, 58, ["etcd (1, or 3 for HA)", "topologies, tablets, tokens, watermarks"], PURPLE)
    s.box(120, 120, 200, 58, ["master (leader)", "placement, tokens, watermarks"], BLUE)
    s.box(660, 16, 210, 58, ["master (follower)", "campaigns, stands by"], BLUE, dashed=True, size=11)
    s.arrow([(220, 120), (220, 95), (330, 60)], PURPLE, both=True)
    s.text(236, 92, "lease, reads and writes", size=10, colour=MUTED)
    s.arrow([(660, 45), (570, 45)], PURPLE, dashed=True)
    s.box(660, 120, 210, 58, ["clients", "millstream CLI, connect()"], GREY)
    s.arrow([(660, 140), (320, 140)], LINE)
    s.text(490, 133, "submit, status, update, move …", size=10, anchor="middle", colour=MUTED)
    s.box(660, 196, 210, 40, ["browser, Prometheus", "console, /metrics (HTTP)"], GREY, size=11)
    s.arrow([(660, 216), (560, 216), (560, 162), (320, 162)], GREY, dashed=True)
    # workers with tablet copies
    s.text(450, 282, "workers: a RocksDB per tablet copy, on the worker's own disk", size=11, anchor="middle",
           colour=MUTED)
    workers = [(150, "worker 1", [("counter/0", True), ("counter/1", False), ("sink/0", True)]),
               (400, "worker 2", [("counter/1", True), ("counter/0", False), ("sink/1", False)]),
               (650, "worker 3", [("sink/1", True), ("sink/0", False)])]
    for x, name, tablets in workers:
        s.rect(x, 292, 200, 120, GREEN)
        s.text(x + 100, 312, name, size=12, anchor="middle", weight="bold")
        for i, (t, primary) in enumerate(tablets):
            ty = 324 + i * 27
            s.rect(x + 14, ty, 172, 21, GREEN if primary else GREY, rx=3,
                   fill=GREEN if primary else "#fff", width=1.2)
            s.text(x + 100, ty + 15, f"{t} {'primary' if primary else 'follower copy'}", size=10.5,
                   anchor="middle", colour="#fff" if primary else INK)
    s.arrow([(220, 178), (220, 292)], BLUE, both=True)
    s.text(228, 250, "heartbeats (oldest work)", size=10, colour=MUTED)
    s.text(228, 263, "assignments, watermarks", size=10, colour=MUTED)
    s.arrow([(290, 178), (470, 292)], BLUE, both=True)
    s.arrow([(320, 172), (720, 292)], BLUE, both=True)
    s.arrow([(350, 350), (400, 350)], GREEN)
    s.arrow([(600, 380), (650, 380)], GREEN)
    s.text(375, 428, "Deliver: productions to the next computation's primary;", size=10, anchor="middle",
           colour=MUTED)
    s.text(375, 442, "Replicate: each commit to the tablet's followers", size=10, anchor="middle", colour=MUTED)
    # injectors
    s.box(8, 20, 150, 70, ["injectors", "Injector, inject-files,", "the Spark bridge"], ORANGE, size=11)
    s.arrow([(60, 90), (60, 440), (150, 440), (150, 395)], ORANGE)
    s.text(66, 300, "Deliver", size=10, colour=MUTED)
    s.text(66, 313, "(records)", size=10, colour=MUTED)
    s.arrow([(110, 90), (150, 120)], ORANGE, dashed=True)
    s.text(124, 104, "watermark", size=10, colour=MUTED)
    s.text(890, 462, "every arrow is gRPC, except etcd's own protocol and the console's HTTP", size=10,
           anchor="end", colour=MUTED, italic=True)
    return s


def record_path() -> Svg:
    """One batch through a tablet: fence, dedup, user code, one commit, replicate, acknowledge, send."""
    s = Svg(900, 330, "The record path: one batch through a tablet")
    s.box(10, 40, 120, 62, ["sender", "an injector, or", "an upstream tablet"], ORANGE, size=11)
    steps = [
        ("1 fence", "token current?", "else NOT_OWNER", BLUE),
        ("2 dedup", "producer's mark,", "Bloom + RocksDB", BLUE),
        ("3 user code", "per key, in order", "on the tablet thread", GREEN),
        ("4 one commit", "a RocksDB WriteBatch", "(see below)", PURPLE),
    ]
    x = 160
    for title, a, b, colour in steps:
        s.box(x, 40, 160, 62, [title, a, b], colour, size=11)
        x += 180
    for i in range(4):
        s.arrow([(130 + i * 180 + (10 if i else 0), 71), (160 + i * 180, 71)])
    # what the commit holds
    s.rect(700, 120, 180, 110, PURPLE, dashed=True)
    for i, item in enumerate(["state changes", "the new record ids", "timer changes", "productions (checkpointed)"]):
        s.text(712, 142 + i * 24, "• " + item, size=11)
    s.arrow([(780, 102), (780, 120)], PURPLE)
    # replicate, acknowledge, send
    s.box(460, 150, 200, 62, ["5 replicate", "to every in-sync follower", "durable there too"], GREEN, size=11)
    s.arrow([(700, 181), (660, 181)], GREEN)
    s.box(160, 150, 250, 62, ["6 acknowledge the sender", "only now; the sender drops its copy"], ORANGE,
          size=11)
    s.arrow([(460, 181), (410, 181)], ORANGE)
    s.arrow([(160, 181), (70, 181), (70, 102)], ORANGE)
    s.box(160, 250, 500, 62, ["7 send the productions downstream",
                              "each to its reader's tablet, as step 1 there; the checkpoint goes",
                              "in the commit after their acknowledgement; re-sent after a failover"], BLUE, size=11)
    s.arrow([(560, 212), (560, 250)], BLUE)
    s.arrow([(660, 281), (760, 281), (760, 240)], BLUE, dashed=True)
    s.text(768, 262, "acknowledged", size=10, colour=MUTED)
    s.text(10, 22, "Duplicates are acknowledged and dropped at 2; a batch that fails is retried, then its "
                   "poisoned record goes to <computation>.dead_letter.", size=10.5, colour=MUTED, italic=True)
    return s


def watermark_graph() -> Svg:
    """How the leader computes each computation's low watermark from its inputs."""
    s = Svg(900, 250, "Low watermarks: each computation's is the minimum of its own oldest work and its inputs'")
    s.box(10, 30, 170, 56, ["injector A", "watermark 12:00:05"], ORANGE, size=11)
    s.box(10, 110, 170, 56, ["injector B", "watermark 12:00:03"], ORANGE, size=11)
    s.box(250, 64, 230, 78, ["splitter", "oldest work: 12:00:04", "low watermark 12:00:03", "(held by injector B)"],
          BLUE, size=11)
    s.box(560, 64, 230, 78, ["counter", "pending timer: 12:00:02", "low watermark 12:00:02",
                             "(held by its own timer)"], GREEN, size=11)
    s.arrow([(180, 58), (215, 58), (215, 92), (250, 92)], ORANGE)
    s.arrow([(180, 138), (215, 138), (215, 112), (250, 112)], ORANGE)
    s.arrow([(480, 103), (560, 103)], BLUE)
    s.text(520, 96, "words", size=10, anchor="middle", colour=MUTED)
    s.text(215, 24, "lines", size=10, anchor="middle", colour=MUTED)
    s.text(10, 200, "lwm(C) = min(oldest work of C's tablets, lwm of every computation or injector feeding C)",
           size=12, weight="bold")
    s.text(10, 220, "Oldest work: records received and not yet committed, productions not yet acknowledged, "
                    "pending event-time timers.", size=11, colour=MUTED)
    s.text(10, 238, "Published watermarks never decrease; an injector that finishes goes to the end of time.",
           size=11, colour=MUTED)
    return s


def watermark_timeline() -> Svg:
    """Records, the watermark, a window's timer and a late record, over wall-clock time."""
    s = Svg(900, 330, "Event time against wall-clock time: the watermark, a window firing, a late record")
    left, top, right, bottom = 70, 20, 660, 280
    s.line([(left, top), (left, bottom), (right, bottom)], INK, width=1.2)
    s.text(left - 8, top + 4, "event time", size=11, anchor="end", colour=MUTED)
    s.text(right, bottom + 22, "wall-clock time", size=11, anchor="end", colour=MUTED)

    def at(wall: float, event: float) -> tuple[float, float]:  # both in seconds, 0..10
        return left + wall * (right - left) / 10, bottom - event * (bottom - top) / 10

    # the window [2 s, 4 s) and its end
    x0, y4 = at(0, 4)
    x1, y2 = at(10, 2)
    s.rect(x0, y4, x1 - x0, y2 - y4, GREY, rx=0, fill="#f2f6fb", width=0)
    s.line([at(0, 4), at(10, 4)], BLUE, width=1, dashed=True)
    s.text(at(0.1, 4)[0], at(0, 4)[1] - 5, "window [2 s, 4 s): its timer is at 4 s", size=10.5, colour=BLUE)
    # records: (wall, event), arriving out of order; one late
    records = [(0.4, 0.9), (0.8, 0.6), (1.2, 1.7), (1.9, 2.4), (2.3, 1.9), (2.7, 3.1), (3.4, 2.8), (3.9, 3.9),
               (4.6, 4.4), (5.0, 3.6), (5.7, 5.2), (6.3, 5.9), (7.0, 6.6), (7.6, 6.1), (8.3, 7.4), (9.1, 8.2)]
    for w, e in records:
        x, y = at(w, e)
        s.dot(x, y, INK, 3.2)
    # the watermark: a step below the records
    wm = [(0, 0), (1.0, 0.5), (2.0, 1.4), (3.0, 1.8), (4.0, 2.6), (5.0, 3.3), (6.0, 4.3), (7.0, 5.6),
          (8.0, 5.9), (9.0, 7.0), (10, 7.9)]
    path = [at(*wm[0])]
    for (w0, e0), (w1, e1) in zip(wm, wm[1:], strict=False):
        path += [at(w1, e0), at(w1, e1)]
    s.line(path, GREEN, width=2.2)
    s.text(*at(7.1, 4.95), "low watermark", size=11, colour=GREEN, weight="bold")
    # the window fires where the watermark passes 4 s
    fx, fy = at(6.0, 4.0)
    s.dot(fx, fy, BLUE, 6)
    tx, ty = at(5.2, 1.0)
    s.arrow([(tx + 40, ty - 12), (fx - 2, fy + 8)], BLUE)
    s.text(tx, ty, "the watermark passes 4 s: the timer fires,", size=10.5, colour=BLUE)
    s.text(tx, ty + 14, "the window is emitted, once", size=10.5, colour=BLUE)
    # a late record: below the watermark when it arrives
    lx, ly = at(8.7, 3.0)
    s.dot(lx, ly, RED, 5, hollow=True)
    s.text(lx + 10, ly - 2, "late: below the watermark", size=10.5, colour=RED)
    s.text(lx + 10, ly + 12, "when it arrives", size=10.5, colour=RED)
    # legend on the right
    s.text(680, 40, "• a record, at its event time", size=11)
    s.text(680, 62, "— the computation's low watermark:", size=11, colour=GREEN)
    s.text(692, 78, "no record older than it is expected", size=10.5, colour=MUTED)
    s.text(680, 104, "A window's timer holds the watermark", size=11)
    s.text(680, 120, "at its end until it fires; a record of a", size=11)
    s.text(680, 136, "window already emitted goes to", size=11)
    s.text(680, 152, "<computation>.late (windows), or is", size=11)
    s.text(680, 168, "processed or dropped by late_records.", size=11)
    return s


FIGURES: dict[str, Callable[[], Svg]] = {
    "processes.svg": processes,
    "record-path.svg": record_path,
    "watermark-graph.svg": watermark_graph,
    "watermark-timeline.svg": watermark_timeline,
}


def main(argv: list[str]) -> int:
    stale = []
    for name, draw in FIGURES.items():
        path = os.path.join(HERE, name)
        text = draw().render()
        if "--check" in argv:
            current = open(path).read() if os.path.exists(path) else ""
            if current != text:
                stale.append(name)
        else:
            with open(path, "w") as f:
                f.write(text)
            print(f"wrote {path}")
    if stale:
        print(f"differ from what docs/figures/make.py draws: {', '.join(stale)} (run it)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
