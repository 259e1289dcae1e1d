"""``millstream inject-files`` (injectors/files.py) end to end: every line of every file is
counted once, and injecting the same directory again adds nothing (each file is a sequenced
producer, its lines its sequence: deliveries in the columns' sequenced form)."""

from __future__ import annotations

import os

from cli.demo import oracle, sample_lines
from examples import wordcount
from injectors.files import inject_directory
from runtime.sinks import read_file_sink
from tests.harness import Cluster, wait_until


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
