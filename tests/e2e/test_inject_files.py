"""``millstream inject-files`` (injectors/files.py) end to end: every line of every file is
counted once, and injecting the same directory again adds nothing (each file is a sequenced
producer, its lines its sequence: deliveries in the columns' sequenced form)."""

from __future__ import annotations

import json
import os
from collections import Counter

from cli.demo import oracle, sample_lines
from examples import wordcount
from injectors.files import inject_directory
from runtime import Dataflow, codecs
from runtime.sinks import FileSink, read_file_sink
from runtime.windows import SECOND, Sum, Tumbling
from tests import flowjobs as j
from tests.harness import Cluster, wait_until

T0 = 1_700_000_000_000_000


def test_a_directory_is_counted_once_however_often_it_is_injected(cluster: Cluster) -> None:
    out = os.path.join(cluster.data_dir, "out-files")
    cluster.client.submit(wordcount.topology(out, name="files"))
    cluster.wait_assigned()
    src = os.path.join(cluster.data_dir, "src")
    os.makedirs(src)
    lines = sample_lines(1200, seed=5)
    for n, part in enumerate((lines[:700], lines[700:])):
        with open(os.path.join(src, f"part-{n}.log"), "w") as f:
            f.write("\n".join(part) + "\n")
    expected = oracle(lines)
    total = sum(expected.values())
    assert inject_directory(src, cluster.masters_arg, "lines", security=cluster.security) == len(lines)
    wait_until(lambda: len(list(read_file_sink(out))) >= total, 120, f"{total} count records in the sink")
    assert wordcount.final_counts(list(read_file_sink(out))) == expected
    # Again, then a marker file: once the marker is counted, the re-run has gone through.
    assert inject_directory(src, cluster.masters_arg, "lines", security=cluster.security) == len(lines)
    marker = os.path.join(cluster.data_dir, "marker")
    os.makedirs(marker)
    with open(os.path.join(marker, "m.log"), "w") as f:
        f.write("zzmarker\n")
    inject_directory(marker, cluster.masters_arg, "lines", security=cluster.security)
    wait_until(lambda: any(r["key"] == "zzmarker" for r in read_file_sink(out)), 60, "the marker")
    rows = [r for r in read_file_sink(out) if r["key"] != "zzmarker"]
    assert wordcount.final_counts(rows) == expected and len(rows) == total


def test_json_lines_injected_with_their_own_keys_and_times_fill_event_time_windows(cluster: Cluster) -> None:
    """`inject-files --key-field user --timestamp-field ts`: records keyed and timed by their
    lines, out of order across files; the windows fire once the directory is finished."""
    out = os.path.join(cluster.data_dir, "out-clicks")
    flow = Dataflow("jsonclicks", key_ranges=2)
    flow.input("jsonclicks.in", codec=codecs.JSON, keyed=True).map(j.one).window(Tumbling(SECOND), Sum()) \
        .sink(FileSink, name="jsonclicks_out", codec=codecs.JSON, path=out)
    cluster.client.submit(flow)
    cluster.wait_assigned()
    src = os.path.join(cluster.data_dir, "clicks")
    os.makedirs(src)
    events = [(f"u{i % 4}", T0 + (i * 7_919) % 5_000_000) for i in range(400)]
    for n in range(2):
        with open(os.path.join(src, f"part-{n}.jsonl"), "w") as f:
            f.write("".join(json.dumps({"user": u, "ts": t}) + "\n" for u, t in events[n::2]))
    assert inject_directory(src, cluster.masters_arg, "jsonclicks.in", security=cluster.security,
                            key_field="user", time_field="ts") == len(events)
    expected = Counter((u, (t - T0) // SECOND) for u, t in events)
    rows = lambda: list(read_file_sink(out))  # noqa: E731
    wait_until(lambda: len(rows()) >= len(expected), 120, "every window in the sink")
    got = {(r["key"], (json.loads(r["value"])[0] - T0) // SECOND): json.loads(r["value"])[2] for r in rows()}
    assert got == dict(expected) and len(rows()) == len(expected)
