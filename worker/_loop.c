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
 * while the loop runs; they are written back before every call into the runtime's own
 * Python code (the callbacks above) and read again after it, and when the loop ends. User
 * code, which never sees the processor or the batch, runs without that.
 *
 * Every item of the columns is taken as a new reference for the record that uses it, and
 * each list's length is checked at each read: user code may change them, and the loop must
 * then raise IndexError as the Python loop does, not read freed or missing items.
 *
 * A call whose arguments are not of the shapes the loop reads directly (lists for the
 * columns, bytes for the producer prefix, a list for the context's productions) returns
 * NotImplemented, and the caller runs the Python loop instead.
 */

#include "../runtime/_ccore.h"  /* (Python.h, and what the compiled cores share) */

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
    X(timestamps) X(seqs) X(ids) X(producer) X(streams) X(failed) X(perf_counter)

#define DECLARE(n) static PyObject *s_##n = NULL;
NAMES(DECLARE)

static int intern_names(void)
{
#define INTERN(n) if (!(s_##n = PyUnicode_InternFromString(#n))) return -1;
    NAMES(INTERN)
    return 0;
}

/* ------------------------------------------------------------------ the context's core
 *
 * worker/context.py's KeyContext is a Python class over ContextCore: the fields a call of
 * user code is bound by (its key, timestamp, Effects, undo mark) and the batch's writes and
 * productions live in this struct, so the loop below binds a record with four pointer
 * writes, and ctx.state.get(), ctx.state.set() and ctx.produce() run in C on their common
 * path: bytes, no keyword, a key's state not saved yet or saved as a plain tuple. Anything
 * else (another type to convert or refuse, a value over the limit, keywords, a call moved
 * to another key) is handed to the Python reference in worker/context.py (_CoreRef,
 * _KeyState), which does the checks and raises the errors, so both say the same thing. */

static PyObject *ref_get = NULL, *ref_set = NULL, *ref_clear = NULL, *ref_produce = NULL, *ref_rebind = NULL;
static Py_ssize_t max_value = 0;
static PyTypeObject ContextCoreType, StateHandleType;

typedef struct {
    PyObject_HEAD
    PyObject *key, *timestamp, *eff, *saved, *writes, *out, *committed, *read_state, *outputs;
    PyObject *handle;  /* the StateHandle ctx.state returns */
    Py_ssize_t reads;  /* ctx.state.get() calls so far (worker/batch.py's prefetch counts them) */
} Core;

typedef struct {
    PyObject_HEAD
    PyObject *ctx;  /* the Core */
} Handle;

#define CORE_FIELDS(X) X(key) X(timestamp) X(eff) X(saved) X(writes) X(out) X(committed) X(read_state) \
    X(outputs) X(handle)

static int core_traverse(Core *self, visitproc visit, void *arg)
{
#define VISIT(f) Py_VISIT(self->f);
    CORE_FIELDS(VISIT)
    return 0;
}

static int core_clear(Core *self)
{
#define CLEAR(f) Py_CLEAR(self->f);
    CORE_FIELDS(CLEAR)
    return 0;
}

static void core_dealloc(Core *self)
{
    PyObject_GC_UnTrack(self);
    core_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *core_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (ref_get == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "worker._loop.init_context() was not called");
        return NULL;
    }
    Core *self = (Core *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->key = PyBytes_FromStringAndSize(NULL, 0);
    self->timestamp = PyLong_FromLong(0);
    self->eff = Py_NewRef(Py_None);
    self->saved = Py_NewRef(unsaved);
    self->writes = PyDict_New();
    self->out = PyList_New(0);
    self->committed = Py_NewRef(Py_None);
    self->read_state = Py_NewRef(Py_None);
    self->outputs = PyFrozenSet_New(NULL);
    Handle *h = PyObject_GC_New(Handle, &StateHandleType);
    if (h != NULL) {
        h->ctx = Py_NewRef((PyObject *)self);
        PyObject_GC_Track(h);
    }
    self->handle = (PyObject *)h;
    if (!self->key || !self->timestamp || !self->writes || !self->out || !self->outputs || !h) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyObject *core_produce(Core *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *stream = PyVectorcall_NARGS(nargsf) == 2 ? args[0] : NULL, *value = stream ? args[1] : NULL;
    if (stream != NULL && kwnames == NULL && PyUnicode_CheckExact(stream) && PyBytes_CheckExact(value)
        && PyBytes_GET_SIZE(value) <= max_value && PyList_CheckExact(self->out) && PyFrozenSet_CheckExact(self->outputs)) {
        int known = PySet_Contains(self->outputs, stream);
        if (known < 0)
            return NULL;
        if (known) {
            PyObject *p = PyTuple_Pack(4, stream, self->key, value, self->timestamp);
            if (p == NULL)
                return NULL;
            int rc = PyList_Append(self->out, p);
            Py_DECREF(p);
            if (rc < 0)
                return NULL;
            Py_RETURN_NONE;
        }
    }
    return to_reference(ref_produce, (PyObject *)self, args, nargsf, kwnames);
}

/* rebind(key, timestamp): the call works on another key (a flow's steps, per item). In C when
 * the call has written no ctx.state it would have to keep for undo, and is not moving back in
 * time without Effects yet; the reference (_CoreRef.rebind) does the rest. */
static PyObject *core_rebind(Core *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs == 2 && self->saved == unsaved && PyLong_CheckExact(args[1]) && PyLong_CheckExact(self->timestamp)) {
        int back = 0;
        if (self->eff == Py_None && (back = PyObject_RichCompareBool(args[1], self->timestamp, Py_LT)) < 0)
            return NULL;
        if (!back) {
            Py_XSETREF(self->key, Py_NewRef(args[0]));
            Py_XSETREF(self->timestamp, Py_NewRef(args[1]));
            Py_RETURN_NONE;
        }
    }
    if (ref_rebind == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "worker._loop.init_rebind() was not called");
        return NULL;
    }
    return to_reference(ref_rebind, (PyObject *)self, args, (size_t)nargs, NULL);
}

static PyObject *core_state(Core *self, void *closure)
{
    return Py_NewRef(self->handle);
}

static PyMethodDef core_methods[] = {
    {"produce", (PyCFunction)(void (*)(void))core_produce, METH_FASTCALL | METH_KEYWORDS,
     "produce(stream, value, *, key=None, timestamp=None): see runtime.Context.produce."},
    {"rebind", (PyCFunction)(void (*)(void))core_rebind, METH_FASTCALL,
     "rebind(key, timestamp): see worker.context.KeyContext.rebind."},
    {NULL, NULL, 0, NULL},
};

/* The fields as attributes (_ccore.h's field_get and field_set): readable and writable from
 * Python (KeyContext's own methods use them), never deleted. */
static PyObject *core_reads(Core *self, void *closure)
{
    return PyLong_FromSsize_t(self->reads);
}

#define FIELD(name, f) {name, (getter)field_get, (setter)field_set, NULL, (void *)offsetof(Core, f)},
static PyGetSetDef core_getset[] = {
    {"state", (getter)core_state, NULL, "This key's state (runtime.Context.state).", NULL},
    {"_state", (getter)core_state, NULL, NULL, NULL},
    {"reads", (getter)core_reads, NULL, "ctx.state.get() calls so far.", NULL},
    FIELD("_key", key) FIELD("_timestamp", timestamp) FIELD("eff", eff) FIELD("_saved", saved)
    FIELD("writes", writes) FIELD("out", out) FIELD("committed", committed) FIELD("read_state", read_state)
    FIELD("outputs", outputs)
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ContextCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "worker._loop.ContextCore",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The per-call fields of worker.context.KeyContext, and its hot methods.",
    .tp_new = core_new,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_traverse = (traverseproc)core_traverse,
    .tp_clear = (inquiry)core_clear,
    .tp_methods = core_methods,
    .tp_getset = core_getset,
};

static int handle_traverse(Handle *self, visitproc visit, void *arg)
{
    Py_VISIT(self->ctx);
    return 0;
}

static int handle_clear(Handle *self)
{
    Py_CLEAR(self->ctx);
    return 0;
}

static void handle_dealloc(Handle *self)
{
    PyObject_GC_UnTrack(self);
    handle_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Core *handle_core(Handle *self)
{
    if (self->ctx == NULL || !PyObject_TypeCheck(self->ctx, &ContextCoreType)) {
        PyErr_SetString(PyExc_RuntimeError, "a state handle without its context");
        return NULL;
    }
    return (Core *)self->ctx;
}

static PyObject *handle_get(Handle *self, PyObject *unused)
{
    Core *c = handle_core(self);
    if (c == NULL)
        return NULL;
    if (!PyDict_CheckExact(c->writes))
        return PyObject_CallOneArg(ref_get, (PyObject *)self);
    c->reads++;
    PyObject *v = PyDict_GetItemWithError(c->writes, c->key);  /* borrowed */
    if (v == NULL && !PyErr_Occurred() && PyDict_CheckExact(c->committed))
        v = PyDict_GetItemWithError(c->committed, c->key);
    if (v != NULL)
        return Py_NewRef(v);
    if (PyErr_Occurred())
        return NULL;
    return PyObject_CallOneArg(c->read_state, c->key);
}

static PyObject *handle_set(Handle *self, PyObject *value)
{
    Core *c = handle_core(self);
    if (c == NULL)
        return NULL;
    if (!PyBytes_CheckExact(value) || PyBytes_GET_SIZE(value) > max_value || !PyDict_CheckExact(c->writes)
        || (c->saved != unsaved && !PyTuple_CheckExact(c->saved)))
        return PyObject_CallFunctionObjArgs(ref_set, (PyObject *)self, value, NULL);
    PyObject *key = Py_NewRef(c->key);
    int rc = -1;
    if (c->saved == unsaved) {  /* the key's state before this call wrote it, for undo */
        PyObject *old = PyDict_GetItemWithError(c->writes, key);
        PyObject *saved = (old == NULL && PyErr_Occurred()) ? NULL
                          : PyTuple_Pack(2, old ? Py_True : Py_False, old ? old : Py_None);
        if (saved == NULL)
            goto end;
        Py_SETREF(c->saved, saved);
    }
    rc = PyDict_SetItem(c->writes, key, value);
end:
    Py_DECREF(key);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *handle_clear_state(Handle *self, PyObject *unused)
{
    return PyObject_CallOneArg(ref_clear, (PyObject *)self);
}

static PyMethodDef handle_methods[] = {
    {"get", (PyCFunction)handle_get, METH_NOARGS, "This key's state (None: none)."},
    {"set", (PyCFunction)handle_set, METH_O, "Replace this key's state."},
    {"clear", (PyCFunction)handle_clear_state, METH_NOARGS, "Delete this key's state."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef handle_members[] = {
    {"_ctx", T_OBJECT_EX, offsetof(Handle, ctx), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject StateHandleType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "worker._loop.StateHandle",
    .tp_basicsize = sizeof(Handle),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "ctx.state of a ContextCore: runtime.State's get, set and clear.",
    .tp_dealloc = (destructor)handle_dealloc,
    .tp_traverse = (traverseproc)handle_traverse,
    .tp_clear = (inquiry)handle_clear,
    .tp_methods = handle_methods,
    .tp_members = handle_members,
};

static PyObject *l_init_context(PyObject *mod, PyObject *args)
{
    PyObject *mark, *get, *set, *clear, *produce;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "OOOOOn", &mark, &get, &set, &clear, &produce, &limit))
        return NULL;
    if (unsaved != NULL && unsaved != mark) {
        PyErr_SetString(PyExc_RuntimeError, "init_context(): another 'not saved' mark than init()'s");
        return NULL;
    }
    Py_XSETREF(unsaved, Py_NewRef(mark));
    Py_XSETREF(ref_get, Py_NewRef(get));
    Py_XSETREF(ref_set, Py_NewRef(set));
    Py_XSETREF(ref_clear, Py_NewRef(clear));
    Py_XSETREF(ref_produce, Py_NewRef(produce));
    max_value = limit;
    Py_RETURN_NONE;
}

static PyObject *make_record(PyObject *key, PyObject *value, PyObject *ts, PyObject *rid, PyObject *stream)
{
    return slots_record(record_type, slot_offset, key, value, ts, rid, stream);
}

static PyObject *l_init_rebind(PyObject *mod, PyObject *ref)
{
    Py_XSETREF(ref_rebind, Py_NewRef(ref));
    Py_RETURN_NONE;
}

static PyObject *l_init(PyObject *mod, PyObject *args)
{
    PyObject *cls, *sentinel;
    if (!PyArg_ParseTuple(args, "O!O", &PyType_Type, &cls, &sentinel))
        return NULL;
    if (record_slots(cls, slot_offset) < 0)
        return NULL;
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

/* What one call of run_records holds: the processor's objects it reads once, as the Python
 * loop reads them into locals, and the counters. */
typedef struct {
    PyObject *proc, *batch, *producer;                               /* borrowed: the arguments */
    PyObject *keys, *values, *tss, *seqs, *ids, *prefix, *streams;   /* owned, from the columns */
    PyObject *commit, *ctx, *out, *fn, *calls, *clock, *record_above, *durations, *wm, *perf;  /* owned */
    PyObject *source;       /* owned: the record's place in its producer's order, or None */
    PyObject *per_record;   /* borrowed from streams: each record's stream, or NULL */
    PyObject *stream;       /* borrowed: the one stream of every record */
    int weak, drop_late, bounded;
    int core;               /* ctx is a ContextCore: its fields are written directly */
    double deadline;
    long long limit, work, taken, late, new_;
    int live;               /* the C counters are the current ones (Python's are stale) */
} Loop;

/* The counters back to Python, before a call into the runtime's own Python code (which may
 * read them); then read again after it. User code never sees the processor or the batch, so
 * the calls of user code go without. */
static int to_python(Loop *L)
{
    /* All four tried, the first failure kept (only MemoryError can fail here): none is left
     * stale because another failed before it. */
    PyObject *targets[4] = {L->proc, L->proc, L->proc, L->batch};
    PyObject *names[4] = {s__work, s__taken, s_late, s_new};
    long long values[4] = {L->work, L->taken, L->late, L->new_};
    PyObject *type = NULL, *error = NULL, *tb = NULL;
    for (int k = 0; k < 4; k++) {
        if (set_ll(targets[k], names[k], values[k]) < 0) {
            if (type == NULL)
                PyErr_Fetch(&type, &error, &tb);
            else
                PyErr_Clear();
        }
    }
    if (type != NULL) {
        PyErr_Restore(type, error, tb);
        return -1;
    }
    L->live = 0;
    return 0;
}

static int from_python(Loop *L)
{
    if (get_ll(L->proc, s__work, &L->work) < 0 || get_ll(L->proc, s__taken, &L->taken) < 0
        || get_ll(L->proc, s_late, &L->late) < 0 || get_ll(L->batch, s_new, &L->new_) < 0)
        return -1;
    L->live = 1;
    return 0;
}

/* list[i] as a new reference, or IndexError as Python's subscript raises it (user code may
 * have shortened a column's list: it is read again for every record). */
static PyObject *item(PyObject *list, Py_ssize_t i)
{
    if (i >= PyList_GET_SIZE(list)) {
        PyErr_SetString(PyExc_IndexError, "list index out of range");
        return NULL;
    }
    return Py_NewRef(PyList_GET_ITEM(list, i));
}

/* ``method(*args)`` of the runtime's Python, with the counters written back around it. */
static PyObject *runtime_call(Loop *L, PyObject *obj, PyObject *name, PyObject *const *args, Py_ssize_t n,
                              PyObject *kwnames)
{
    if (to_python(L) < 0)
        return NULL;
    PyObject *method = PyObject_GetAttr(obj, name);
    if (method == NULL)
        return NULL;
    PyObject *r = PyObject_Vectorcall(method, args, n, kwnames);
    Py_DECREF(method);
    if (r != NULL && from_python(L) < 0)
        Py_CLEAR(r);
    return r;
}

static int runtime_call_void(Loop *L, PyObject *obj, PyObject *name, PyObject *const *args, Py_ssize_t n,
                             PyObject *kwnames)
{
    PyObject *r = runtime_call(L, obj, name, args, n, kwnames);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* A call of user code raised ``error``: undone, then retried and perhaps dead-lettered by
 * the processor's _run_user, with ``error`` as the exception being handled (as in the
 * Python loop's except clause: what those calls raise has it as its __context__). The
 * handled exception is saved and restored through the public API, which reads the topmost
 * one and writes the current frame's: the same thing on a tablet's thread, where the loop
 * runs (inside a generator whose caller handles one, it would leave the caller's in place). */
static int raised(Loop *L, PyObject *error, Py_ssize_t mark, PyObject *key, PyObject *value, PyObject *ts,
                  PyObject *rid, PyObject *stream)
{
    PyObject *handled = PyErr_GetHandledException();
    PyErr_SetHandledException(error);
    int rc = -1;
    PyObject *mark_obj = PyLong_FromSsize_t(mark), *now = NULL, *again = NULL, *record_fn = NULL, *kw = NULL;
    if (mark_obj == NULL || runtime_call_void(L, L->ctx, s_undo, &mark_obj, 1, NULL) < 0)
        goto end;
    if ((now = PyObject_CallNoArgs(L->clock)) == NULL || runtime_call_void(L, L->calls, s_ended, &now, 1, NULL) < 0)
        goto end;
    if ((again = make_record(key, value, ts, rid, stream)) == NULL
        || (record_fn = PyObject_GetAttr(L->proc, s__record_fn)) == NULL || (kw = PyTuple_Pack(1, s_failed)) == NULL)
        goto end;
    PyObject *args[9] = {L->commit, key, ts, value, rid, record_fn, again, L->source, error};
    rc = runtime_call_void(L, L->proc, s__run_user, args, 8, kw);
end:
    Py_XDECREF(mark_obj);
    Py_XDECREF(now);
    Py_XDECREF(again);
    Py_XDECREF(record_fn);
    Py_XDECREF(kw);
    PyErr_SetHandledException(handled);
    Py_XDECREF(handled);
    return rc;
}

/* The batch is full (limit or time budget): 1; not: 0; an error: -1. */
static int full(Loop *L)
{
    int stop = L->work >= L->limit;
    if (!stop && L->taken && !(L->taken & 7)) {
        PyObject *now = PyObject_CallNoArgs(L->perf);
        if (now == NULL)
            return -1;
        double t = PyFloat_AsDouble(now);
        Py_DECREF(now);
        if (t == -1.0 && PyErr_Occurred())
            return -1;
        stop = t >= L->deadline;
    }
    if (stop && PyObject_SetAttr(L->proc, s__stop, Py_True) < 0)
        return -1;
    return stop;
}

/* How long a call took, as the Python loop computes it (t1 - t0: floats from the usual
 * clock, any numbers from another), and whether that is a slow call. */
static PyObject *took(Loop *L, PyObject *t0, PyObject *t1, int *slow)
{
    if (PyFloat_CheckExact(t0) && PyFloat_CheckExact(t1) && PyFloat_CheckExact(L->record_above)) {
        double d = PyFloat_AS_DOUBLE(t1) - PyFloat_AS_DOUBLE(t0);
        *slow = d >= PyFloat_AS_DOUBLE(L->record_above);
        return PyFloat_FromDouble(d);
    }
    PyObject *d = PyNumber_Subtract(t1, t0);
    if (d == NULL)
        return NULL;
    *slow = PyObject_RichCompareBool(d, L->record_above, Py_GE);
    if (*slow < 0)
        Py_CLEAR(d);
    return d;
}

/* One record ``*ip`` through user code (or counted late, or dropped); ``*ip`` moves past it.
 * 1: go on; 0: the batch is full, nothing taken; -1: an error of the runtime (not of user
 * code, which raised() handles). */
static int one(Loop *L, Py_ssize_t *ip)
{
    Py_ssize_t i = *ip;
    if (L->bounded) {
        int stop = full(L);
        if (stop != 0)
            return stop < 0 ? -1 : 0;
    }
    int rc = -1, late, slow;
    PyObject *key = NULL, *value = NULL, *ts = NULL, *stream = NULL, *seq = NULL, *rid = NULL;
    PyObject *t0 = NULL, *t1 = NULL, *running = NULL, *record = NULL, *res = NULL, *d = NULL, *eff = NULL;
    if (!(key = item(L->keys, i)) || !(value = item(L->values, i)) || !(ts = item(L->tss, i)))
        goto end;
    if (!(stream = L->per_record != NULL ? item(L->per_record, i) : Py_NewRef(L->stream)))
        goto end;
    if (L->seqs != Py_None) {
        if (!(seq = item(L->seqs, i)))
            goto end;
        unsigned long long s = PyLong_AsUnsignedLongLong(seq);
        if (s == (unsigned long long)-1 && PyErr_Occurred())
            goto end;
        Py_ssize_t plen = PyBytes_GET_SIZE(L->prefix);
        if (!(rid = PyBytes_FromStringAndSize(NULL, plen + 8)))
            goto end;
        char *p = PyBytes_AS_STRING(rid);
        memcpy(p, PyBytes_AS_STRING(L->prefix), plen);
        for (int b = 7; b >= 0; b--, s >>= 8)
            p[plen + b] = (char)(s & 0xff);
        if (L->weak && L->producer != Py_None) {
            PyObject *src = PyTuple_Pack(2, L->producer, seq);
            if (src == NULL)
                goto end;
            Py_SETREF(L->source, src);
        }
    } else if (!(rid = item(L->ids, i))) {
        goto end;
    }
    *ip = i + 1;
    L->taken++;
    if ((late = PyObject_RichCompareBool(ts, L->wm, Py_LT)) < 0)
        goto end;
    if (late) {
        L->late++;
        PyObject *metrics = PyObject_GetAttr(L->proc, s_metrics);
        PyObject *counter = metrics ? PyObject_GetAttr(metrics, s_late) : NULL;
        Py_XDECREF(metrics);
        int failed = counter == NULL || runtime_call_void(L, counter, s_inc, NULL, 0, NULL) < 0;
        Py_XDECREF(counter);
        if (failed)
            goto end;
        if (L->drop_late) {
            rc = 1;
            goto end;
        }
    }
    L->new_++;
    L->work++;
    Py_ssize_t mark = PyList_GET_SIZE(L->out);
    if (L->core) {  /* KeyContext.begin: the core's fields, written directly */
        Core *c = (Core *)L->ctx;
        Py_SETREF(c->key, Py_NewRef(key));
        Py_SETREF(c->timestamp, Py_NewRef(ts));
        Py_SETREF(c->eff, Py_NewRef(Py_None));
        Py_SETREF(c->saved, Py_NewRef(unsaved));
    } else if (PyObject_SetAttr(L->ctx, s__key, key) < 0 || PyObject_SetAttr(L->ctx, s__timestamp, ts) < 0
               || PyObject_SetAttr(L->ctx, s_eff, Py_None) < 0 || PyObject_SetAttr(L->ctx, s__saved, unsaved) < 0) {
        goto end;
    }
    if (!(t0 = PyObject_CallNoArgs(L->clock)) || !(running = PyTuple_Pack(2, key, t0))
        || PyObject_SetAttr(L->calls, s_running_call, running) < 0
        || !(record = make_record(key, value, ts, rid, stream)))
        goto end;
    PyObject *call_args[2] = {L->ctx, record};
    res = PyObject_Vectorcall(L->fn, call_args, 2, NULL);
    if (res == NULL) {  /* user code raised: anything, SystemExit too */
        PyObject *type, *error, *tb;
        PyErr_Fetch(&type, &error, &tb);
        PyErr_NormalizeException(&type, &error, &tb);
        if (tb != NULL)
            PyException_SetTraceback(error, tb);
        Py_XDECREF(type);
        Py_XDECREF(tb);
        rc = raised(L, error, mark, key, value, ts, rid, stream) < 0 ? -1 : 1;
        Py_XDECREF(error);
        goto end;
    }
    if (!(t1 = PyObject_CallNoArgs(L->clock)) || PyObject_SetAttr(L->calls, s_running_call, Py_None) < 0
        || !(d = took(L, t0, t1, &slow)) || PyList_Append(L->durations, d) < 0)
        goto end;
    if (slow) {
        PyObject *args[3] = {key, d, t1};
        if (runtime_call_void(L, L->calls, s_slow, args, 3, NULL) < 0)
            goto end;
    }
    /* A production earlier than the call holds the watermark (KeyContext.produce makes the
     * call's Effects for one); strong ones are routed when the batch is done. */
    if (!(eff = L->core ? Py_NewRef(((Core *)L->ctx)->eff) : PyObject_GetAttr(L->ctx, s_eff)))
        goto end;
    if (eff != Py_None || (L->weak && PyList_GET_SIZE(L->out) > mark)) {
        PyObject *mark_obj = PyLong_FromSsize_t(mark);
        PyObject *n_obj = mark_obj ? PyLong_FromSsize_t(PyList_GET_SIZE(L->out)) : NULL;
        int failed = n_obj == NULL;
        if (!failed) {
            PyObject *args[7] = {L->commit, eff, mark_obj, ts, rid, L->source, n_obj};
            failed = runtime_call_void(L, L->proc, s__after_call, args, 7, NULL) < 0;
        }
        Py_XDECREF(mark_obj);
        Py_XDECREF(n_obj);
        if (failed)
            goto end;
    }
    rc = 1;
end:
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_XDECREF(ts);
    Py_XDECREF(stream);
    Py_XDECREF(seq);
    Py_XDECREF(rid);
    Py_XDECREF(t0);
    Py_XDECREF(t1);
    Py_XDECREF(running);
    Py_XDECREF(record);
    Py_XDECREF(res);
    Py_XDECREF(d);
    Py_XDECREF(eff);
    return rc;
}

/* A list attribute of the columns, or None; ``*not_mine`` is set for anything else. */
static PyObject *list_or_none(PyObject *cols, PyObject *name, int *not_mine)
{
    PyObject *v = PyObject_GetAttr(cols, name);
    if (v != NULL && v != Py_None && !PyList_CheckExact(v))
        *not_mine = 1;
    return v;
}

static void release(Loop *L)
{
    PyObject **owned[] = {&L->keys, &L->values, &L->tss, &L->seqs, &L->ids, &L->prefix, &L->streams,
                          &L->commit, &L->ctx, &L->out, &L->fn, &L->calls, &L->clock, &L->record_above,
                          &L->durations, &L->wm, &L->perf, &L->source};
    for (size_t k = 0; k < sizeof(owned) / sizeof(owned[0]); k++)
        Py_CLEAR(*owned[k]);
}

/* Reads what the loop needs. 1: ready; 0: arguments of another shape (NotImplemented);
 * -1: an error. Nothing is changed before it returns 1. */
static int prepare(Loop *L, PyObject *cols, PyObject *stop, Py_ssize_t i, Py_ssize_t *n)
{
    int not_mine = 0;
    if (!(L->keys = list_or_none(cols, s_keys, &not_mine)) || !(L->values = list_or_none(cols, s_values, &not_mine))
        || !(L->tss = list_or_none(cols, s_timestamps, &not_mine)) || !(L->seqs = list_or_none(cols, s_seqs, &not_mine))
        || !(L->ids = list_or_none(cols, s_ids, &not_mine)) || !(L->prefix = PyObject_GetAttr(cols, s_producer))
        || !(L->streams = PyObject_GetAttr(cols, s_streams)))
        return -1;
    if (not_mine || L->keys == Py_None || L->values == Py_None || L->tss == Py_None || i < 0
        || (L->seqs != Py_None && !PyBytes_CheckExact(L->prefix)) || (L->seqs == Py_None && L->ids == Py_None))
        return 0;
    L->stream = PyUnicode_CheckExact(L->streams) ? L->streams : empty_str;
    L->per_record = PyList_CheckExact(L->streams) ? L->streams : NULL;
    L->bounded = stop == Py_None;
    if (L->bounded) {
        *n = PyList_GET_SIZE(L->keys);
    } else if ((*n = PyLong_AsSsize_t(stop)) == -1 && PyErr_Occurred()) {
        return -1;
    }
    PyObject *late_records = NULL, *weak = NULL, *started = NULL, *budget = NULL;
    int rc = -1;
    if (!(L->commit = PyObject_GetAttr(L->batch, s_commit)) || !(L->ctx = PyObject_GetAttr(L->proc, s_ctx))
        || !(L->out = PyObject_GetAttr(L->ctx, s_out)) || !(L->fn = PyObject_GetAttr(L->proc, s__one))
        || !(L->calls = PyObject_GetAttr(L->proc, s_calls)) || !(L->clock = PyObject_GetAttr(L->calls, s_clock))
        || !(L->record_above = PyObject_GetAttr(L->calls, s_record_above))
        || !(L->durations = PyObject_GetAttr(L->proc, s__durations)) || !(weak = PyObject_GetAttr(L->proc, s_weak))
        || !(L->wm = PyObject_GetAttr(L->proc, s__wm)) || !(late_records = PyObject_GetAttr(L->proc, s_late_records))
        || !(L->perf = PyObject_GetAttr(time_module, s_perf_counter))
        || !(started = PyObject_GetAttr(L->proc, s__started)) || !(budget = PyObject_GetAttr(L->proc, s__budget)))
        goto end;
    L->core = PyObject_TypeCheck(L->ctx, &ContextCoreType);
    if (!PyList_CheckExact(L->out) || !PyList_CheckExact(L->durations)) {
        rc = 0;
        goto end;
    }
    if ((L->weak = PyObject_IsTrue(weak)) < 0)
        goto end;
    if ((L->drop_late = PyObject_RichCompareBool(late_records, drop_str, Py_EQ)) < 0)
        goto end;
    double s0 = PyFloat_AsDouble(started);
    if (s0 == -1.0 && PyErr_Occurred())
        goto end;
    double b = PyFloat_AsDouble(budget);
    if (b == -1.0 && PyErr_Occurred())
        goto end;
    L->deadline = s0 + b;
    if (get_ll(L->proc, s__limit, &L->limit) < 0 || from_python(L) < 0)
        goto end;
    rc = 1;
end:
    Py_XDECREF(late_records);
    Py_XDECREF(weak);
    Py_XDECREF(started);
    Py_XDECREF(budget);
    return rc;
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
    Loop L;
    memset(&L, 0, sizeof L);
    L.proc = args[0];
    L.batch = args[1];
    L.producer = args[4];
    L.source = Py_NewRef(args[6]);
    Py_ssize_t i = PyLong_AsSsize_t(args[3]), n = 0;
    PyObject *result = NULL;
    int ready = (i == -1 && PyErr_Occurred()) ? -1 : prepare(&L, args[2], args[5], i, &n);
    if (ready == 0) {
        result = Py_NewRef(Py_NotImplemented);
    } else if (ready > 0) {
        int rc = 1;
        while (i < n && (rc = one(&L, &i)) > 0)
            ;
        if (rc >= 0)
            result = PyLong_FromSsize_t(i);
    }
    if (L.live) {
        /* The counters back to Python, whatever happened (an error keeps its own exception). */
        PyObject *type, *error, *tb;
        PyErr_Fetch(&type, &error, &tb);
        if (to_python(&L) < 0) {
            if (type != NULL)
                PyErr_Clear();
            else
                Py_CLEAR(result);
        }
        if (type != NULL)
            PyErr_Restore(type, error, tb);
    }
    release(&L);
    return result;
}

static PyMethodDef methods[] = {
    {"init", l_init, METH_VARARGS, "init(Record, unsaved): the record type and the context's 'not saved' mark."},
    {"init_context", l_init_context, METH_VARARGS,
     "init_context(unsaved, get, set, clear, produce, max_value): worker/context.py's references."},
    {"init_rebind", l_init_rebind, METH_O, "init_rebind(rebind): worker/context.py's reference of rebind."},
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
    if (PyType_Ready(&ContextCoreType) < 0 || PyType_Ready(&StateHandleType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "ContextCore", (PyObject *)&ContextCoreType) < 0
        || PyModule_AddObjectRef(m, "StateHandle", (PyObject *)&StateHandleType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
