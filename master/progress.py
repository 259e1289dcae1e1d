"""The leader's watermark tick: from the reports on the image to published watermarks.

Every tick (50 ms) the leader takes the tablets' latest reports and the injectors' promises
from its image, computes every computation's low watermark with the pure math of
master/watermarks.py, and commits the ones that advanced, with the injector promises that
changed and the finished names it deletes, as one change (written to etcd, then applied).
Each computation's input watermark (what its timers fire on) follows, and the next heartbeat
answers carry it to the workers. One direction: report -> entry -> tick -> math -> image ->
heartbeat.
"""

from __future__ import annotations

import time

from master import injectors
from master.change import Change
from master.leader import Leader
from master.watermarks import TabletReport, compute, inputs, publish, with_idleness
from runtime import metrics
from runtime.record import END_OF_TIME, MIN_TIME


async def advance(core: Leader) -> None:
    """Recompute every low watermark; persist and publish those that advanced.

    Under the leader's lock: the watermarks are computed for the jobs as they are, then
    written to etcd, then applied; a cancel, update or pause during the write would
    otherwise see its computations' watermarks put back (or advanced while paused)."""
    async with core.lock:
        image, config, now = core.image, core.config, core.now_ms()
        injectors.expire(image, now, config.injector_expiry_s * 1000)
        specs = image.specs(live=True)
        reports = {}
        for key, t in image.tablets.items():
            if t.report is None or now - t.report_time > config.report_timeout_ms:
                continue  # treated as not reported: held at the published value
            settled = image.settler.value(key, now)  # (None: no history; the report is all there is)
            reports[key] = TabletReport(t.report.token, t.report.oldest if settled is None
                                        else None if settled == END_OF_TIME else settled)
        holds = {}
        for name, inj in image.injectors.items():
            settled = image.settler.value(("injector", name), now)
            holds[name] = (inj.stream, inj.watermark if settled is None else min(inj.watermark, settled))
        holds = with_idleness(holds, image.idle_injectors())
        computed = compute(specs, image.owners(), reports, holds, image.published, image.finished_streams)
        new = publish(computed, image.published)
        frozen = image.paused_computations()
        changed = {c: v for c, v in new.items() if v != image.published.get(c, MIN_TIME) and c not in frozen}
        for c, v in changed.items():
            assert v >= image.published.get(c, MIN_TIME), "published watermarks never decrease"
        # A finished name holds nothing any more: it is deleted, and its stream marked finished
        # (it still counts as fed: a stream nobody ever fed holds its readers back).
        done = [n for n, inj in image.injectors.items() if inj.finished]
        change = Change(watermarks=changed, injectors_gone=done,
                        injectors={n: inj.promise() for n, inj in image.injectors.items()
                                   if inj.dirty and not inj.finished},
                        finished_streams={image.injectors[n].stream: True for n in done
                                          if image.injectors[n].stream not in image.finished_streams})
        if change:
            # Taken now: a report arriving during the write (an in-process TestRun's: served
            # ones wait for the lock) keeps its name dirty, and is written by the next tick (review W2).
            await core.commit(change)
        image.advanced(computed, inputs(specs, image.published, holds, image.finished_streams), frozen)
    wall = time.time()
    for c, v in new.items():
        metrics.WATERMARK.labels(c).set(v)
        if MIN_TIME < v < END_OF_TIME:
            metrics.WATERMARK_LAG.labels(c).set(wall - v / 1e6)
    metrics.WORKERS.set(len(image.workers))
