/* Compiled kernels for the per-record steps the profiles still show in Python: a key's
 * stable hash, and routing a column of keys to key ranges (issue 29, item 5).
 *
 * runtime/kernels.py holds the pure-Python reference of every function here, and the one
 * that is used when this module is not built (no compiler, or MILLSTREAM_PURE_PYTHON=1);
 * tests/unit/test_kernels.py checks that both give the same answers on random inputs.
 *
 * The hash is BLAKE2b with an 8-byte digest and no key, salt or personalisation, written
 * from RFC 7693 (its section 3 and appendix C): the same bytes as Python's
 * hashlib.blake2b(key, digest_size=8).digest(). A key's hash is that digest read as a
 * big-endian integer, so key_hash = byte-swap of the first state word.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------ BLAKE2b, RFC 7693 */

static const uint64_t IV[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL,
};

static const uint8_t SIGMA[10][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
};

#define ROTR64(x, n) (((x) >> (n)) | ((x) << (64 - (n))))

#define G(a, b, c, d, x, y)            \
    do {                               \
        a = a + b + (x);               \
        d = ROTR64(d ^ a, 32);         \
        c = c + d;                     \
        b = ROTR64(b ^ c, 24);         \
        a = a + b + (y);               \
        d = ROTR64(d ^ a, 16);         \
        c = c + d;                     \
        b = ROTR64(b ^ c, 63);         \
    } while (0)

static inline uint64_t load64_le(const uint8_t *p)
{
    uint64_t w;
    memcpy(&w, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

/* The compression function F: one 128-byte block into the state h; t is the number of
 * bytes hashed so far, this block included (below 2**64: a key is never that long). */
static void compress(uint64_t h[8], const uint8_t block[128], uint64_t t, int last)
{
    uint64_t m[16], v[16];
    for (int i = 0; i < 16; i++)
        m[i] = load64_le(block + 8 * i);
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = IV[i];
    }
    v[12] ^= t;
    if (last)
        v[14] = ~v[14];
    /* The twelve rounds unrolled, so that every message index is a constant. */
#define ROUND(r)                                                           \
    do {                                                                   \
        G(v[0], v[4], v[8], v[12], m[SIGMA[r][0]], m[SIGMA[r][1]]);        \
        G(v[1], v[5], v[9], v[13], m[SIGMA[r][2]], m[SIGMA[r][3]]);        \
        G(v[2], v[6], v[10], v[14], m[SIGMA[r][4]], m[SIGMA[r][5]]);       \
        G(v[3], v[7], v[11], v[15], m[SIGMA[r][6]], m[SIGMA[r][7]]);       \
        G(v[0], v[5], v[10], v[15], m[SIGMA[r][8]], m[SIGMA[r][9]]);       \
        G(v[1], v[6], v[11], v[12], m[SIGMA[r][10]], m[SIGMA[r][11]]);     \
        G(v[2], v[7], v[8], v[13], m[SIGMA[r][12]], m[SIGMA[r][13]]);      \
        G(v[3], v[4], v[9], v[14], m[SIGMA[r][14]], m[SIGMA[r][15]]);      \
    } while (0)
    ROUND(0); ROUND(1); ROUND(2); ROUND(3); ROUND(4); ROUND(5);
    ROUND(6); ROUND(7); ROUND(8); ROUND(9); ROUND(0); ROUND(1);
#undef ROUND
    for (int i = 0; i < 8; i++)
        h[i] ^= v[i] ^ v[i + 8];
}

/* The first state word after hashing data[0:n] with an 8-byte digest: the digest is its
 * 8 bytes, little-endian. */
static uint64_t blake2b_8(const uint8_t *data, size_t n)
{
    uint64_t h[8];
    uint8_t block[128];
    memcpy(h, IV, sizeof h);
    h[0] ^= 0x01010000ULL ^ 8; /* depth 1, fanout 1, no key, digest length 8 */
    uint64_t t = 0;
    while (n > 128) {
        t += 128;
        compress(h, data, t, 0);
        data += 128;
        n -= 128;
    }
    memset(block, 0, sizeof block);
    memcpy(block, data, n);
    t += n;
    compress(h, block, t, 1);
    return h[0];
}

static inline uint64_t bswap_64(uint64_t x)
{
    return __builtin_bswap64(x);
}

/* The hash of a bytes-like object (bytes without a buffer request, the common case). */
static int hash_of(PyObject *key, uint64_t *out)
{
    if (PyBytes_CheckExact(key)) {
        *out = bswap_64(blake2b_8((const uint8_t *)PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key)));
        return 0;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(key, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError, "a key must be bytes, not %.100s", Py_TYPE(key)->tp_name);
        return -1;
    }
    *out = bswap_64(blake2b_8((const uint8_t *)view.buf, (size_t)view.len));
    PyBuffer_Release(&view);
    return 0;
}

static PyObject *k_key_hash(PyObject *self, PyObject *key)
{
    uint64_t h;
    if (hash_of(key, &h) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(h);
}

static PyObject *k_hash_prefix(PyObject *self, PyObject *key)
{
    uint64_t h;
    if (hash_of(key, &h) < 0)
        return NULL;
    uint8_t be[8];
    for (int i = 0; i < 8; i++)
        be[i] = (uint8_t)(h >> (56 - 8 * i));
    return PyBytes_FromStringAndSize((const char *)be, 8);
}

static PyObject *k_key_hashes(PyObject *self, PyObject *keys)
{
    PyObject *seq = PySequence_Fast(keys, "key_hashes takes a sequence of keys");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t h;
        if (hash_of(items[i], &h) < 0)
            goto fail;
        PyObject *v = PyLong_FromUnsignedLongLong(h);
        if (v == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, v);
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* prefixed_keys(prefix, keys): prefix + hash_prefix(key) + key for each key, in order. */
static PyObject *k_prefixed_keys(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "prefixed_keys(prefix: bytes, keys) takes two arguments");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[1], "prefixed_keys takes a sequence of keys");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), plen = PyBytes_GET_SIZE(args[0]);
    const char *prefix = PyBytes_AS_STRING(args[0]);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_buffer view;  /* bytes, or any bytes-like key (as hash_prefix takes) */
        if (PyObject_GetBuffer(items[i], &view, PyBUF_SIMPLE) < 0) {
            PyErr_Format(PyExc_TypeError, "a key must be bytes, not %.100s", Py_TYPE(items[i])->tp_name);
            goto fail;
        }
        uint64_t h = blake2b_8((const uint8_t *)view.buf, (size_t)view.len);
        PyObject *v = PyBytes_FromStringAndSize(NULL, plen + 8 + view.len);
        if (v != NULL) {
            char *p = PyBytes_AS_STRING(v);
            memcpy(p, prefix, plen);
            for (int b = 0; b < 8; b++)  /* the digest's bytes (the state word, little-endian): hash_prefix */
                p[plen + b] = (char)((h >> (8 * b)) & 0xff);
            memcpy(p + plen + 8, view.buf, view.len);
        }
        PyBuffer_Release(&view);
        if (v == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, v);
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* count_into(counts, bounds, values): for each value, counts[bisect_left(bounds, value)] += 1
 * (bounds rise; counts has one more item than bounds); returns the sum of the values. */
static PyObject *k_count_into(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyTuple_CheckExact(args[1]) || !PyList_CheckExact(args[2])
        || PyList_GET_SIZE(args[0]) != PyTuple_GET_SIZE(args[1]) + 1 || PyTuple_GET_SIZE(args[1]) > 64) {
        PyErr_SetString(PyExc_TypeError, "count_into(counts: list, bounds: tuple (at most 64), values: list), "
                        "len(counts) == len(bounds) + 1");
        return NULL;
    }
    PyObject *counts = args[0], *values = args[2];
    Py_ssize_t nb = PyTuple_GET_SIZE(args[1]);
    double bounds[64], sum = 0.0;
    Py_ssize_t added[65] = {0};
    for (Py_ssize_t j = 0; j < nb; j++) {
        bounds[j] = PyFloat_AsDouble(PyTuple_GET_ITEM(args[1], j));
        if (bounds[j] == -1.0 && PyErr_Occurred())
            return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(values); i++) {
        double v = PyFloat_AsDouble(PyList_GET_ITEM(values, i));
        if (v == -1.0 && PyErr_Occurred())
            return NULL;
        Py_ssize_t lo = 0, hi = nb;  /* bisect_left */
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (bounds[mid] < v)
                lo = mid + 1;
            else
                hi = mid;
        }
        added[lo]++;
        sum += v;
    }
    for (Py_ssize_t j = 0; j <= nb; j++) {
        if (!added[j])
            continue;
        PyObject *n = PyLong_FromSsize_t(added[j]);
        PyObject *total = n ? PyNumber_Add(PyList_GET_ITEM(counts, j), n) : NULL;
        Py_XDECREF(n);
        if (total == NULL)
            return NULL;
        PyList_SetItem(counts, j, total);  /* steals total */
    }
    return PyFloat_FromDouble(sum);
}

/* columns_of(rows, width): rows (tuples of ``width`` items) as ``width`` lists, in order. */
static PyObject *k_columns_of(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t width = nargs == 2 ? PyLong_AsSsize_t(args[1]) : -1;
    if (nargs != 2 || !PyList_CheckExact(args[0]) || width < 1 || width > 16) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "columns_of(rows: list, width: 1..16)");
        return NULL;
    }
    PyObject *rows = args[0];
    Py_ssize_t n = PyList_GET_SIZE(rows);
    PyObject *out = PyTuple_New(width);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t c = 0; c < width; c++) {
        PyObject *col = PyList_New(n);
        if (col == NULL)
            goto fail;
        PyTuple_SET_ITEM(out, c, col);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != width) {
            PyErr_Format(PyExc_ValueError, "columns_of: row %zd is not a tuple of %zd items", i, width);
            goto fail;
        }
        for (Py_ssize_t c = 0; c < width; c++)
            PyList_SET_ITEM(PyTuple_GET_ITEM(out, c), i, Py_NewRef(PyTuple_GET_ITEM(row, c)));
    }
    return out;
fail:
    /* Lists half filled hold NULLs, which list_dealloc skips. */
    Py_DECREF(out);
    return NULL;
}

/* total_len(items, start): the sum of len(x) for x in items[start:]. */
static PyObject *k_total_len(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t start = nargs == 2 ? PyLong_AsSsize_t(args[1]) : -1;
    if (nargs != 2 || start < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "total_len(items, start >= 0)");
        return NULL;
    }
    PyObject *items = PySequence_Fast(args[0], "total_len takes a sequence");
    if (items == NULL)
        return NULL;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = start; i < PySequence_Fast_GET_SIZE(items); i++) {
        PyObject *x = PySequence_Fast_GET_ITEM(items, i);
        Py_ssize_t len = PyBytes_CheckExact(x) ? PyBytes_GET_SIZE(x) : PyObject_Size(x);
        if (len < 0) {
            Py_DECREF(items);
            return NULL;
        }
        total += len;
    }
    Py_DECREF(items);
    return PyLong_FromSsize_t(total);
}

/* ------------------------------------------------------------------ routing */

/* ranges_of(hashes, starts, ids): ids[bisect_right(starts, h) - 1] for each hash h, where
 * starts rise (the first range's start is the lowest; a hash below it has no range). */
static PyObject *k_ranges_of(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "ranges_of(hashes, starts, ids) takes three arguments");
        return NULL;
    }
    PyObject *hseq = NULL, *sseq = NULL, *iseq = NULL, *out = NULL;
    uint64_t *starts = NULL;
    hseq = PySequence_Fast(args[0], "ranges_of: hashes must be a sequence");
    if (hseq == NULL)
        goto done;
    sseq = PySequence_Fast(args[1], "ranges_of: starts must be a sequence");
    if (sseq == NULL)
        goto done;
    iseq = PySequence_Fast(args[2], "ranges_of: ids must be a sequence");
    if (iseq == NULL)
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(hseq), k = PySequence_Fast_GET_SIZE(sseq);
    if (PySequence_Fast_GET_SIZE(iseq) != k) {
        PyErr_SetString(PyExc_ValueError, "ranges_of: starts and ids must have one entry per range");
        goto done;
    }
    if (n > 0 && k == 0) {
        PyErr_SetString(PyExc_LookupError, "the routing has no range at the start of the hash space");
        goto done;
    }
    starts = PyMem_New(uint64_t, k > 0 ? k : 1);
    if (starts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < k; j++) {
        starts[j] = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(sseq, j));
        if (starts[j] == (uint64_t)-1 && PyErr_Occurred())
            goto done;
    }
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    PyObject **hs = PySequence_Fast_ITEMS(hseq);
    PyObject **ids = PySequence_Fast_ITEMS(iseq);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t h = PyLong_AsUnsignedLongLong(hs[i]);
        if (h == (uint64_t)-1 && PyErr_Occurred())
            goto fail;
        if (h < starts[0]) {
            PyErr_SetString(PyExc_LookupError, "the routing has no range at the start of the hash space");
            goto fail;
        }
        Py_ssize_t lo = 0, hi = k; /* the first start above h, as bisect_right */
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (h < starts[mid])
                hi = mid;
            else
                lo = mid + 1;
        }
        PyObject *id = ids[lo - 1];
        Py_INCREF(id);
        PyList_SET_ITEM(out, i, id);
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    PyMem_Free(starts);
    Py_XDECREF(hseq);
    Py_XDECREF(sseq);
    Py_XDECREF(iseq);
    return out;
}

/* group(ranges): {r: [the indexes i with ranges[i] == r, rising]}, in first-seen order. */
static PyObject *k_group(PyObject *self, PyObject *ranges)
{
    PyObject *seq = PySequence_Fast(ranges, "group takes a sequence");
    if (seq == NULL)
        return NULL;
    PyObject *out = PyDict_New();
    if (out == NULL)
        goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *last_key = NULL, *last_list = NULL; /* runs of one range skip the lookup */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = items[i], *ix;
        if (r != last_key) {
            ix = PyDict_GetItemWithError(out, r);
            if (ix == NULL) {
                if (PyErr_Occurred())
                    goto fail;
                ix = PyList_New(0);
                if (ix == NULL)
                    goto fail;
                int err = PyDict_SetItem(out, r, ix);
                Py_DECREF(ix); /* the dict holds it */
                if (err < 0)
                    goto fail;
            }
            last_key = r;
            last_list = ix;
        }
        PyObject *v = PyLong_FromSsize_t(i);
        if (v == NULL)
            goto fail;
        int err = PyList_Append(last_list, v);
        Py_DECREF(v);
        if (err < 0)
            goto fail;
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* take(column, indexes): [column[i] for i in indexes] (an index out of range raises
 * IndexError; a negative one counts from the end, as in Python). */
static PyObject *k_take(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "take(column, indexes) takes two arguments");
        return NULL;
    }
    PyObject *col = PySequence_Fast(args[0], "take: the column must be a sequence");
    if (col == NULL)
        return NULL;
    PyObject *ix = PySequence_Fast(args[1], "take: the indexes must be a sequence");
    if (ix == NULL) {
        Py_DECREF(col);
        return NULL;
    }
    Py_ssize_t size = PySequence_Fast_GET_SIZE(col), n = PySequence_Fast_GET_SIZE(ix);
    PyObject **items = PySequence_Fast_ITEMS(col);
    PyObject **where = PySequence_Fast_ITEMS(ix);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        goto fail;
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_ssize_t i = PyNumber_AsSsize_t(where[j], PyExc_IndexError);
        if (i == -1 && PyErr_Occurred())
            goto fail;
        if (i < 0)
            i += size;
        if (i < 0 || i >= size) {
            PyErr_SetString(PyExc_IndexError, "take: index out of range");
            goto fail;
        }
        Py_INCREF(items[i]);
        PyList_SET_ITEM(out, j, items[i]);
    }
    Py_DECREF(col);
    Py_DECREF(ix);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(col);
    Py_DECREF(ix);
    return NULL;
}

static PyMethodDef methods[] = {
    {"key_hash", k_key_hash, METH_O, "The stable 64-bit hash of a key (runtime.kernels.key_hash)."},
    {"hash_prefix", k_hash_prefix, METH_O, "key_hash as 8 big-endian bytes (runtime.kernels.hash_prefix)."},
    {"prefixed_keys", (PyCFunction)(void (*)(void))k_prefixed_keys, METH_FASTCALL,
     "prefix + hash_prefix(key) + key of every key (runtime.kernels.prefixed_keys)."},
    {"count_into", (PyCFunction)(void (*)(void))k_count_into, METH_FASTCALL,
     "Histogram counts of values, added in place; their sum (runtime.kernels.count_into)."},
    {"columns_of", (PyCFunction)(void (*)(void))k_columns_of, METH_FASTCALL,
     "Rows of width items as that many lists (runtime.kernels.columns_of)."},
    {"total_len", (PyCFunction)(void (*)(void))k_total_len, METH_FASTCALL,
     "The sum of len(x) for x in items[start:] (runtime.kernels.total_len)."},
    {"key_hashes", k_key_hashes, METH_O, "key_hash of every key, in order (runtime.kernels.key_hashes)."},
    {"ranges_of", (PyCFunction)(void (*)(void))k_ranges_of, METH_FASTCALL,
     "The range id of each hash (runtime.kernels.ranges_of)."},
    {"group", k_group, METH_O, "The indexes of each value, in first-seen order (runtime.kernels.group)."},
    {"take", (PyCFunction)(void (*)(void))k_take, METH_FASTCALL,
     "The items of a column at the indexes, in order (runtime.kernels.take)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "runtime._kernels",
    "Compiled versions of runtime.kernels' functions (same answers; see that module).", -1, methods,
};

PyMODINIT_FUNC PyInit__kernels(void)
{
    return PyModule_Create(&module);
}
