/* The record loop of a batch, compiled: worker/recordloop.py's run_records_py in C (issue 29,
 * item 5). Same arguments, same effects on the batch processor, the batch, the context and
 * the call watch, same callbacks into Python for what is rare (a late record's counter, a
 * call that raised, a slow call, a call with timers, typed state or weak productions).
 *
 * What it saves is the interpreter's own work per record: the loop's bytecode, and a Record
 * made by writing its five slots (the dataclass's __init__ is a Python frame of its own).
 * runtime/record.py's Record is checked once, at init(): its fields must be plain object
 * slots, or init() refuses and worker/recordloop.py keeps the Python loop.
 *
 * Counters (the processor's _work, _taken and late, the batch's new) live in C variables
 * while the loop runs; they are written back before every call into Python and read again
 * after it, so Python code never sees them stale.
 *
 * A call whose arguments are not of the shapes the loop reads directly (lists for the
 * columns, bytes for the producer prefix, a list for the context's productions) returns
 * NotImplemented, and the caller runs the Python loop instead.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

static PyTypeObject *record_type = NULL;
static Py_ssize_t slot_offset[5];
static PyObject *unsaved = NULL;
static PyObject *time_module = NULL;
static PyObject *empty_str = NULL;
static PyObject *drop_str = NULL;

#define NAMES(X) \
    X(ctx) X(out) X(_one) X(calls) X(clock) X(record_above) X(_durations) X(weak) X(_wm) \
    X(late_records) X(_started) X(_budget) X(_work) X(_limit) X(_taken) X(late) X(metrics) \
    X(inc) X(new) X(commit) X(_key) X(_timestamp) X(eff) X(_saved) X(running_call) X(slow) \
    X(undo) X(ended) X(_run_user) X(_record_fn) X(_after_call) X(_stop) X(keys) X(values) \
    X(timestamps) X(seqs) X(ids) X(producer) X(streams) X(failed) X(perf_counter) X(append)

#define DECLARE(n) static PyObject *s_##n = NULL;
NAMES(DECLARE)

static int intern_names(void)
{
#define INTERN(n) if (!(s_##n = PyUnicode_InternFromString(#n))) return -1;
    NAMES(INTERN)
    return 0;
}

/* A Record with its five slots written directly: what Record(key, value, ts, id, stream)
 * makes, without the Python frame of its __init__. */
static PyObject *make_record(PyObject *key, PyObject *value, PyObject *ts, PyObject *rid, PyObject *stream)
{
    PyObject *r = record_type->tp_alloc(record_type, 0);
    if (r == NULL)
        return NULL;
    PyObject *fields[5] = {key, value, ts, rid, stream};
    for (int k = 0; k < 5; k++) {
        Py_INCREF(fields[k]);
        *(PyObject **)((char *)r + slot_offset[k]) = fields[k];
    }
    return r;
}

static PyObject *l_init(PyObject *mod, PyObject *args)
{
    PyObject *cls, *sentinel;
    if (!PyArg_ParseTuple(args, "O!O", &PyType_Type, &cls, &sentinel))
        return NULL;
    static const char *fields[5] = {"key", "value", "timestamp", "id", "stream"};
    PyObject *dict = ((PyTypeObject *)cls)->tp_dict;
    for (int k = 0; k < 5; k++) {
        PyObject *descr = PyDict_GetItemString(dict, fields[k]);  /* borrowed */
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", ((PyTypeObject *)cls)->tp_name, fields[k]);
            return NULL;
        }
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY)) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a plain object slot", ((PyTypeObject *)cls)->tp_name,
                         fields[k]);
            return NULL;
        }
        slot_offset[k] = m->offset;
    }
    Py_INCREF(cls);
    Py_XSETREF(record_type, (PyTypeObject *)cls);
    Py_INCREF(sentinel);
    Py_XSETREF(unsaved, sentinel);
    Py_RETURN_NONE;
}

static PyObject *l_record(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "record(key, value, timestamp, id, stream)");
        return NULL;
    }
    if (record_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "worker._loop.init() was not called");
        return NULL;
    }
    return make_record(args[0], args[1], args[2], args[3], args[4]);
}

/* An attribute as a C integer (long long); -1 with an error set when it is not one. */
static int get_ll(PyObject *obj, PyObject *name, long long *out)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int set_ll(PyObject *obj, PyObject *name, long long value)
{
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL)
        return -1;
    int rc = PyObject_SetAttr(obj, name, v);
    Py_DECREF(v);
    return rc;
}

static double get_double(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1.0;
    double d = PyFloat_AsDouble(v);
    Py_DECREF(v);
    return d;
}

typedef struct {
    PyObject *proc, *batch;
    long long work, taken, late, new_;
} Counters;

static int sync_out(Counters *c)
{
    if (set_ll(c->proc, s__work, c->work) < 0 || set_ll(c->proc, s__taken, c->taken) < 0
        || set_ll(c->proc, s_late, c->late) < 0 || set_ll(c->batch, s_new, c->new_) < 0)
        return -1;
    return 0;
}

static int sync_in(Counters *c)
{
    if (get_ll(c->proc, s__work, &c->work) < 0 || get_ll(c->proc, s__taken, &c->taken) < 0
        || get_ll(c->proc, s_late, &c->late) < 0 || get_ll(c->batch, s_new, &c->new_) < 0)
        return -1;
    return 0;
}

/* A list attribute of the columns, or None; NULL with no error set: neither (not_mine). */
static PyObject *list_or_none(PyObject *cols, PyObject *name, int *not_mine)
{
    PyObject *v = PyObject_GetAttr(cols, name);
    if (v != NULL && v != Py_None && !PyList_CheckExact(v))
        *not_mine = 1;
    return v;
}

static PyObject *l_run_records(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "run_records(proc, batch, cols, i, producer, stop, source)");
        return NULL;
    }
    if (record_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "worker._loop.init() was not called");
        return NULL;
    }
    PyObject *proc = args[0], *batch = args[1], *cols = args[2], *producer = args[4], *stop = args[5];
    Py_ssize_t i = PyLong_AsSsize_t(args[3]);
    if (i == -1 && PyErr_Occurred())
        return NULL;

    PyObject *result = NULL;
    PyObject *keys = NULL, *values = NULL, *tss = NULL, *seqs = NULL, *ids = NULL, *prefix = NULL;
    PyObject *streams = NULL, *commit = NULL, *ctx = NULL, *out = NULL, *fn = NULL, *calls = NULL;
    PyObject *clock = NULL, *durations = NULL, *wm = NULL, *perf = NULL, *late_records = NULL;
    PyObject *source = args[6];
    Py_INCREF(source);
    Counters c = {proc, batch, 0, 0, 0, 0};
    int counting = 0;  /* the counters were read: write them back on the way out */
    int not_mine = 0;

    keys = list_or_none(cols, s_keys, &not_mine);
    values = keys ? list_or_none(cols, s_values, &not_mine) : NULL;
    tss = values ? list_or_none(cols, s_timestamps, &not_mine) : NULL;
    seqs = tss ? list_or_none(cols, s_seqs, &not_mine) : NULL;
    ids = seqs ? list_or_none(cols, s_ids, &not_mine) : NULL;
    prefix = ids ? PyObject_GetAttr(cols, s_producer) : NULL;
    streams = prefix ? PyObject_GetAttr(cols, s_streams) : NULL;
    if (streams == NULL)
        goto done;
    if (not_mine || keys == Py_None || values == Py_None || tss == Py_None
        || (seqs != Py_None && !PyBytes_CheckExact(prefix)) || (seqs == Py_None && ids == Py_None))
        goto not_mine;
    Py_ssize_t n;
    if (stop == Py_None) {
        n = PyList_GET_SIZE(keys);
    } else {
        n = PyLong_AsSsize_t(stop);
        if (n == -1 && PyErr_Occurred())
            goto done;
    }
    /* Python would raise IndexError part-way; the caller's Python loop does exactly that. */
    if (n > PyList_GET_SIZE(keys) || n > PyList_GET_SIZE(values) || n > PyList_GET_SIZE(tss)
        || (seqs != Py_None && n > PyList_GET_SIZE(seqs)) || (seqs == Py_None && n > PyList_GET_SIZE(ids))
        || i < 0)
        goto not_mine;
    PyObject *stream = PyUnicode_CheckExact(streams) ? streams : empty_str;  /* borrowed */
    PyObject *per_record = PyList_CheckExact(streams) ? streams : NULL;
    if (per_record != NULL && n > PyList_GET_SIZE(per_record))
        goto not_mine;

    if (!(commit = PyObject_GetAttr(batch, s_commit)) || !(ctx = PyObject_GetAttr(proc, s_ctx))
        || !(out = PyObject_GetAttr(ctx, s_out)))
        goto done;
    if (!PyList_CheckExact(out))
        goto not_mine;
    if (!(fn = PyObject_GetAttr(proc, s__one)) || !(calls = PyObject_GetAttr(proc, s_calls))
        || !(clock = PyObject_GetAttr(calls, s_clock)) || !(durations = PyObject_GetAttr(proc, s__durations))
        || !(wm = PyObject_GetAttr(proc, s__wm)) || !(late_records = PyObject_GetAttr(proc, s_late_records))
        || !(perf = PyObject_GetAttr(time_module, s_perf_counter)))
        goto done;
    double slow_above = get_double(calls, s_record_above);
    if (slow_above == -1.0 && PyErr_Occurred())
        goto done;
    PyObject *weak_obj = PyObject_GetAttr(proc, s_weak);
    if (weak_obj == NULL)
        goto done;
    int weak = PyObject_IsTrue(weak_obj);
    Py_DECREF(weak_obj);
    int drop_late = PyObject_RichCompareBool(late_records, drop_str, Py_EQ);
    if (weak < 0 || drop_late < 0)
        goto done;
    double started = get_double(proc, s__started);
    if (started == -1.0 && PyErr_Occurred())
        goto done;
    double budget = get_double(proc, s__budget);
    if (budget == -1.0 && PyErr_Occurred())
        goto done;
    double deadline = started + budget;
    long long limit;
    if (get_ll(proc, s__limit, &limit) < 0 || sync_in(&c) < 0)
        goto done;
    counting = 1;

    while (i < n) {
        if (stop == Py_None) {
            if (c.work >= limit) {
                if (PyObject_SetAttr(proc, s__stop, Py_True) < 0)
                    goto done;
                break;
            }
            if (c.taken && !(c.taken & 7)) {
                PyObject *now = PyObject_CallNoArgs(perf);
                if (now == NULL)
                    goto done;
                double t = PyFloat_AsDouble(now);
                Py_DECREF(now);
                if (t == -1.0 && PyErr_Occurred())
                    goto done;
                if (t >= deadline) {
                    if (PyObject_SetAttr(proc, s__stop, Py_True) < 0)
                        goto done;
                    break;
                }
            }
        }
        PyObject *key = PyList_GET_ITEM(keys, i), *value = PyList_GET_ITEM(values, i);
        PyObject *ts = PyList_GET_ITEM(tss, i);
        if (per_record != NULL)
            stream = PyList_GET_ITEM(per_record, i);
        PyObject *rid;
        if (seqs != Py_None) {
            PyObject *seq = PyList_GET_ITEM(seqs, i);
            unsigned long long s = PyLong_AsUnsignedLongLong(seq);
            if (s == (unsigned long long)-1 && PyErr_Occurred())
                goto done;
            Py_ssize_t plen = PyBytes_GET_SIZE(prefix);
            rid = PyBytes_FromStringAndSize(NULL, plen + 8);
            if (rid == NULL)
                goto done;
            char *p = PyBytes_AS_STRING(rid);
            memcpy(p, PyBytes_AS_STRING(prefix), plen);
            for (int b = 7; b >= 0; b--) {
                p[plen + b] = (char)(s & 0xff);
                s >>= 8;
            }
            if (weak && producer != Py_None) {
                PyObject *src = PyTuple_Pack(2, producer, seq);
                if (src == NULL) {
                    Py_DECREF(rid);
                    goto done;
                }
                Py_SETREF(source, src);
            }
        } else {
            rid = PyList_GET_ITEM(ids, i);
            Py_INCREF(rid);
        }
        i++;
        c.taken++;
        int late = PyObject_RichCompareBool(ts, wm, Py_LT);
        if (late < 0) {
            Py_DECREF(rid);
            goto done;
        }
        if (late) {
            c.late++;
            PyObject *metrics = NULL, *counter = NULL, *r = NULL;
            if (sync_out(&c) == 0 && (metrics = PyObject_GetAttr(proc, s_metrics))
                && (counter = PyObject_GetAttr(metrics, s_late)))
                r = PyObject_CallMethodNoArgs(counter, s_inc);
            Py_XDECREF(metrics);
            Py_XDECREF(counter);
            if (r == NULL || sync_in(&c) < 0) {
                Py_XDECREF(r);
                Py_DECREF(rid);
                goto done;
            }
            Py_DECREF(r);
            if (drop_late) {
                Py_DECREF(rid);
                continue;
            }
        }
        c.new_++;
        c.work++;
        Py_ssize_t mark = PyList_GET_SIZE(out);
        if (PyObject_SetAttr(ctx, s__key, key) < 0 || PyObject_SetAttr(ctx, s__timestamp, ts) < 0
            || PyObject_SetAttr(ctx, s_eff, Py_None) < 0 || PyObject_SetAttr(ctx, s__saved, unsaved) < 0) {
            Py_DECREF(rid);
            goto done;
        }
        PyObject *t0o = PyObject_CallNoArgs(clock);
        if (t0o == NULL) {
            Py_DECREF(rid);
            goto done;
        }
        double t0 = PyFloat_AsDouble(t0o);
        PyObject *running = (t0 == -1.0 && PyErr_Occurred()) ? NULL : PyTuple_Pack(2, key, t0o);
        Py_DECREF(t0o);
        if (running == NULL) {
            Py_DECREF(rid);
            goto done;
        }
        int rc = PyObject_SetAttr(calls, s_running_call, running);
        Py_DECREF(running);
        PyObject *record = rc < 0 ? NULL : make_record(key, value, ts, rid, stream);
        if (record == NULL) {
            Py_DECREF(rid);
            goto done;
        }
        PyObject *call_args[2] = {ctx, record};
        PyObject *res = PyObject_Vectorcall(fn, call_args, 2, NULL);
        Py_DECREF(record);
        if (res == NULL) {
            /* The call raised (anything: SystemExit too): undone, then retried and perhaps
             * dead-lettered by the processor's _run_user, in Python. */
            PyObject *type, *error, *tb;
            PyErr_Fetch(&type, &error, &tb);
            PyErr_NormalizeException(&type, &error, &tb);
            if (tb != NULL)
                PyException_SetTraceback(error, tb);
            Py_XDECREF(type);
            Py_XDECREF(tb);
            PyObject *mark_obj = PyLong_FromSsize_t(mark), *r = NULL, *t = NULL;
            if (mark_obj != NULL && sync_out(&c) == 0
                && (r = PyObject_CallMethodOneArg(ctx, s_undo, mark_obj)) != NULL) {
                Py_DECREF(r);
                r = NULL;
                if ((t = PyObject_CallNoArgs(clock)) != NULL
                    && (r = PyObject_CallMethodOneArg(calls, s_ended, t)) != NULL) {
                    Py_DECREF(r);
                    r = NULL;
                    PyObject *again = make_record(key, value, ts, rid, stream);
                    PyObject *record_fn = again ? PyObject_GetAttr(proc, s__record_fn) : NULL;
                    PyObject *run_user = record_fn ? PyObject_GetAttr(proc, s__run_user) : NULL;
                    if (run_user != NULL) {
                        PyObject *ra[9] = {commit, key, ts, value, rid, record_fn, again, source, error};
                        PyObject *kw = PyTuple_Pack(1, s_failed);
                        if (kw != NULL)
                            r = PyObject_Vectorcall(run_user, ra, 8, kw);
                        Py_XDECREF(kw);
                    }
                    Py_XDECREF(again);
                    Py_XDECREF(record_fn);
                    Py_XDECREF(run_user);
                }
            }
            Py_XDECREF(mark_obj);
            Py_XDECREF(t);
            Py_XDECREF(error);
            Py_DECREF(rid);
            if (r == NULL || sync_in(&c) < 0) {
                Py_XDECREF(r);
                goto done;
            }
            Py_DECREF(r);
            continue;
        }
        Py_DECREF(res);
        PyObject *t1o = PyObject_CallNoArgs(clock);
        if (t1o == NULL) {
            Py_DECREF(rid);
            goto done;
        }
        double t1 = PyFloat_AsDouble(t1o);
        if ((t1 == -1.0 && PyErr_Occurred()) || PyObject_SetAttr(calls, s_running_call, Py_None) < 0) {
            Py_DECREF(t1o);
            Py_DECREF(rid);
            goto done;
        }
        PyObject *took = PyFloat_FromDouble(t1 - t0);
        if (took == NULL || PyList_Append(durations, took) < 0) {
            Py_XDECREF(took);
            Py_DECREF(t1o);
            Py_DECREF(rid);
            goto done;
        }
        if (t1 - t0 >= slow_above) {
            PyObject *r = NULL;
            if (sync_out(&c) == 0) {
                PyObject *sa[3] = {key, took, t1o};
                PyObject *slow = PyObject_GetAttr(calls, s_slow);
                if (slow != NULL)
                    r = PyObject_Vectorcall(slow, sa, 3, NULL);
                Py_XDECREF(slow);
            }
            if (r == NULL || sync_in(&c) < 0) {
                Py_XDECREF(r);
                Py_DECREF(took);
                Py_DECREF(t1o);
                Py_DECREF(rid);
                goto done;
            }
            Py_DECREF(r);
        }
        Py_DECREF(took);
        Py_DECREF(t1o);
        /* A production earlier than the call holds the watermark (KeyContext.produce makes
         * the call's Effects for one); strong ones are routed when the batch is done. */
        PyObject *eff = PyObject_GetAttr(ctx, s_eff);
        if (eff == NULL) {
            Py_DECREF(rid);
            goto done;
        }
        if (eff != Py_None || (weak && PyList_GET_SIZE(out) > mark)) {
            PyObject *r = NULL, *mark_obj = PyLong_FromSsize_t(mark);
            PyObject *len_obj = PyLong_FromSsize_t(PyList_GET_SIZE(out));
            if (mark_obj != NULL && len_obj != NULL && sync_out(&c) == 0) {
                PyObject *after = PyObject_GetAttr(proc, s__after_call);
                if (after != NULL) {
                    PyObject *aa[7] = {commit, eff, mark_obj, ts, rid, source, len_obj};
                    r = PyObject_Vectorcall(after, aa, 7, NULL);
                    Py_DECREF(after);
                }
            }
            Py_XDECREF(mark_obj);
            Py_XDECREF(len_obj);
            if (r == NULL || sync_in(&c) < 0) {
                Py_XDECREF(r);
                Py_DECREF(eff);
                Py_DECREF(rid);
                goto done;
            }
            Py_DECREF(r);
        }
        Py_DECREF(eff);
        Py_DECREF(rid);
    }
    result = PyLong_FromSsize_t(i);
    goto done;

not_mine:
    result = Py_NewRef(Py_NotImplemented);

done:
    if (counting) {
        /* Written back whatever happened (an error keeps its own exception). */
        PyObject *type, *error, *tb;
        PyErr_Fetch(&type, &error, &tb);
        if (sync_out(&c) < 0 && type == NULL) {
            Py_CLEAR(result);
        } else {
            if (type != NULL && PyErr_Occurred())
                PyErr_Clear();
            PyErr_Restore(type, error, tb);
        }
    }
    Py_XDECREF(keys);
    Py_XDECREF(values);
    Py_XDECREF(tss);
    Py_XDECREF(seqs);
    Py_XDECREF(ids);
    Py_XDECREF(prefix);
    Py_XDECREF(streams);
    Py_XDECREF(commit);
    Py_XDECREF(ctx);
    Py_XDECREF(out);
    Py_XDECREF(fn);
    Py_XDECREF(calls);
    Py_XDECREF(clock);
    Py_XDECREF(durations);
    Py_XDECREF(wm);
    Py_XDECREF(perf);
    Py_XDECREF(late_records);
    Py_DECREF(source);
    return result;
}

static PyMethodDef methods[] = {
    {"init", l_init, METH_VARARGS, "init(Record, unsaved): the record type and the context's 'not saved' mark."},
    {"record", (PyCFunction)(void (*)(void))l_record, METH_FASTCALL,
     "A Record made as the loop makes it (tests)."},
    {"run_records", (PyCFunction)(void (*)(void))l_run_records, METH_FASTCALL,
     "worker.recordloop.run_records_py, compiled (NotImplemented: arguments of another shape)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "worker._loop",
    "A batch's record loop, compiled (worker/recordloop.py has its reference).", -1, methods,
};

PyMODINIT_FUNC PyInit__loop(void)
{
    if (intern_names() < 0)
        return NULL;
    if (!(time_module = PyImport_ImportModule("time")) || !(empty_str = PyUnicode_InternFromString(""))
        || !(drop_str = PyUnicode_InternFromString("drop")))
        return NULL;
    return PyModule_Create(&module);
}
