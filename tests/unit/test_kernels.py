"""runtime/_kernels.c against runtime/kernels.py's pure-Python reference (and the hash against
hashlib): the same answers on random inputs, the same refusals."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime import kernels

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _can_build() -> bool:
    include = sysconfig.get_paths()["include"]
    return shutil.which("cc") is not None and os.path.exists(os.path.join(include, "Python.h"))


try:
    from runtime import _kernels as compiled  # type: ignore[attr-defined]
except ImportError:
    compiled = None

needs_compiled = pytest.mark.skipif(compiled is None, reason="runtime/_kernels.c is not built (no compiler)")


def test_the_kernels_are_built_where_they_can_be() -> None:
    """`pip install -e .` (`make test`'s virtualenv) builds them on a machine with a compiler
    and Python's headers; a build that failed there would silently leave every process on the
    slower reference."""
    if not _can_build():
        pytest.skip("no C compiler or no Python.h here: the reference runs, as it should")
    assert compiled is not None, ("runtime/_kernels.c is not built: run `pip install -e .` in the virtualenv "
                                  "(or `make test`, which does) and read its build warning")
    assert kernels.COMPILED or os.environ.get("MILLSTREAM_PURE_PYTHON") not in (None, "", "0")


def test_pure_python_is_chosen_by_the_environment() -> None:
    code = "from runtime import kernels; print(kernels.COMPILED, kernels.key_hash is kernels.key_hash_py)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "MILLSTREAM_PURE_PYTHON": "1"}).stdout.split()
    assert out == ["False", "True"]


def test_the_hash_is_blake2b_of_8_bytes_read_big_endian() -> None:
    # Lengths around the 128-byte block: the last block's padding and counter.
    for n in (0, 1, 8, 127, 128, 129, 255, 256, 257, 1000):
        key = os.urandom(n)
        digest = hashlib.blake2b(key, digest_size=8).digest()
        assert kernels.hash_prefix(key) == digest
        assert kernels.key_hash(key) == int.from_bytes(digest, "big")


@needs_compiled
@given(st.lists(st.binary(max_size=300), max_size=40))
def test_compiled_hashes_equal_the_reference(keys: list[bytes]) -> None:
    assert compiled.key_hashes(keys) == kernels.key_hashes_py(keys)
    for k in keys:
        assert compiled.key_hash(k) == kernels.key_hash_py(k)
        assert compiled.hash_prefix(k) == kernels.hash_prefix_py(k)


@needs_compiled
def test_compiled_hash_takes_any_buffer_and_refuses_the_rest() -> None:
    key = b"user-42"
    assert compiled.key_hash(bytearray(key)) == compiled.key_hash(memoryview(key)) == kernels.key_hash_py(key)
    for bad in ("user-42", 42, None):
        with pytest.raises(TypeError, match="must be bytes"):
            compiled.key_hash(bad)
        with pytest.raises(TypeError):
            compiled.key_hashes([b"a", bad])
    with pytest.raises(TypeError, match="sequence"):
        compiled.key_hashes(42)


_starts = st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=12, unique=True).map(sorted)


@needs_compiled
@given(_starts, st.lists(st.integers(0, 2**64 - 1), max_size=60), st.data())
def test_compiled_ranges_equal_the_reference(starts: list[int], hashes: list[int], data: st.DataObject) -> None:
    ids = data.draw(st.lists(st.integers(0, 1000), min_size=len(starts), max_size=len(starts)))
    want: list[int] | type[LookupError]
    try:
        want = kernels.ranges_of_py(hashes, starts, ids)
    except LookupError:
        want = LookupError
    if want is LookupError:
        with pytest.raises(LookupError, match="no range at the start"):
            compiled.ranges_of(hashes, starts, ids)
    else:
        assert compiled.ranges_of(hashes, starts, ids) == want


@needs_compiled
def test_compiled_ranges_refuse_what_does_not_line_up() -> None:
    assert compiled.ranges_of([], [], []) == []
    with pytest.raises(LookupError):
        compiled.ranges_of([5], [], [])
    with pytest.raises(ValueError, match="one entry per range"):
        compiled.ranges_of([5], [0, 10], [1])
    with pytest.raises(TypeError):
        compiled.ranges_of([5], [0])


@needs_compiled
@given(st.lists(st.integers(0, 6) | st.sampled_from(["a", "b"]), max_size=80))
def test_compiled_group_equals_the_reference(values: list[object]) -> None:
    got, want = compiled.group(values), kernels.group_py(values)
    assert got == want
    assert list(got) == list(want)  # the values in the order they first occur


@needs_compiled
@given(st.lists(st.binary(max_size=4), max_size=30), st.data())
def test_compiled_take_equals_the_reference(column: list[bytes], data: st.DataObject) -> None:
    n = len(column)
    indexes = data.draw(st.lists(st.integers(-n, n - 1), max_size=40)) if n else []
    assert compiled.take(column, indexes) == kernels.take_py(column, indexes)
    assert compiled.take(tuple(column), range(n)) == column
    with pytest.raises(IndexError):
        compiled.take(column, [n])


def test_the_kernels_benchmark_times_both_versions() -> None:
    from bench.overhead import kernel_costs

    out = kernel_costs(n=200, calls=2, repeats=1)
    assert out["compiled"] == kernels.COMPILED
    for name in ("key_hashes", "ranges_of", "group", "take"):
        assert out[name]["reference_ns"] > 0
        assert (out[name]["compiled_ns"] is not None) == kernels.COMPILED


@needs_compiled
@given(st.binary(max_size=3), st.lists(st.binary(max_size=300), max_size=40))
def test_prefixed_keys_are_the_prefix_the_hash_and_the_key(prefix: bytes, keys: list[bytes]) -> None:
    """A storage key in hash order (worker/storage.py's state keys), for lengths around the
    hash's 128-byte block too."""
    expected = [prefix + hashlib.blake2b(k, digest_size=8).digest() + k for k in keys]
    assert compiled.prefixed_keys(prefix, keys) == kernels.prefixed_keys_py(prefix, keys) == expected


@needs_compiled
def test_prefixed_keys_refuse_what_is_not_bytes() -> None:
    with pytest.raises(TypeError, match="must be bytes, not str"):
        compiled.prefixed_keys(b"S", [b"a", "b"])


_SECONDS = st.lists(st.one_of(st.floats(min_value=0, max_value=100, allow_nan=False),
                              st.sampled_from([1e-05, 5e-05, 0.005, 30.0, 0.0])), max_size=60)


@needs_compiled
@given(_SECONDS)
def test_count_into_adds_each_value_to_its_bucket_as_bisect_left_does(values: list[float]) -> None:
    """The user-code histogram's update by a batch (runtime/metrics.py): a value equal to a
    bound goes in that bound's bucket (Prometheus' ``le``), the sum is returned."""
    from runtime.metrics import USER_BUCKETS

    start = list(range(len(USER_BUCKETS) + 1))
    mine, ref = list(start), list(start)
    total = compiled.count_into(mine, USER_BUCKETS, values)
    assert total == kernels.count_into_py(ref, USER_BUCKETS, values)
    assert mine == ref and sum(mine) == sum(start) + len(values)


@needs_compiled
@given(st.integers(1, 6), st.lists(st.lists(st.binary(max_size=4), min_size=6, max_size=6), max_size=30))
def test_columns_of_transposes_rows_as_zip_does(width: int, cells: list[list[bytes]]) -> None:
    rows = [tuple(c[:width]) for c in cells]
    expected = tuple(list(col) for col in zip(*rows, strict=True)) if rows else tuple([] for _ in range(width))
    assert compiled.columns_of(rows, width) == kernels.columns_of_py(rows, width) == expected


@needs_compiled
@pytest.mark.parametrize("rows", [[(1, 2), (3,)], [(1, 2), [3, 4]], [(1, 2, 3)]])
def test_columns_of_refuses_rows_of_another_width(rows: list) -> None:  # type: ignore[type-arg]
    for fn in (compiled.columns_of, kernels.columns_of_py):
        with pytest.raises(ValueError, match="is not a tuple of 2 items"):
            fn(rows, 2)


@needs_compiled
@given(st.lists(st.binary(max_size=50), max_size=30), st.integers(0, 40))
def test_total_len_is_the_sum_of_the_lengths_from_start(items: list[bytes], start: int) -> None:
    assert compiled.total_len(items, start) == kernels.total_len_py(items, start) == sum(map(len, items[start:]))
