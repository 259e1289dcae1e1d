/* A flow's `process` step, compiled (issue 30): runtime/flows/steps.py's loop over a call's
 * items (Process.push), its context's per-record fields and produce(), and its held
 * ctx.state's get, set and clear, in C on their common path. The classic stage's loop and
 * context are compiled the same way (worker/_loop.c); a flow's step was Python, some fifteen
 * interpreter calls per record per step besides the user's own code.
 *
 * The Python classes in runtime/flows/steps.py are the reference: _StepCoreRef (the context's
 * fields and produce) and _HeldRef (the held state). What the C path does not take (keywords,
 * a value that is not bytes or is over the limit, a key the call has not read yet) goes to
 * them, so both raise the same errors and read storage the same way. steps.py subclasses
 * StepCore and HeldCore (its Python methods come after the C ones in the MRO) when this module
 * was built and MILLSTREAM_PURE_PYTHON is not set.
 *
 * run() binds each item (key, value, timestamp): the stage's context rebound to it (a C
 * method of worker/_loop.c's ContextCore, or the Python one), the step's key and timestamp
 * set, a Record made by writing its five slots (runtime/record.py's Record is checked at
 * init(): plain object slots, or init() refuses and steps.py keeps the Python loop), and the
 * user's function called. */

#include "../_ccore.h"  /* (Python.h, and what the compiled cores share) */

static PyTypeObject *record_type = NULL;
static Py_ssize_t slot_offset[5];
static PyObject *empty_bytes = NULL, *empty_str = NULL;
static PyObject *ref_get = NULL, *ref_set = NULL, *ref_clear = NULL, *ref_produce = NULL;
static Py_ssize_t max_held = 0;

static PyTypeObject StepCoreType, HeldCoreType;

typedef struct {
    PyObject_HEAD
    PyObject *key, *timestamp, *out, *ctx, *state;
} Step;

typedef struct {
    PyObject_HEAD
    PyObject *step, *held, *dirty;
} Held;

/* ------------------------------------------------------------------ the step's context */

#define STEP_FIELDS(X) X(key) X(timestamp) X(out) X(ctx) X(state)

static int step_traverse(Step *self, visitproc visit, void *arg)
{
#define VISIT(f) Py_VISIT(self->f);
    STEP_FIELDS(VISIT)
    return 0;
}

static int step_clear(Step *self)
{
#define CLEAR(f) Py_CLEAR(self->f);
    STEP_FIELDS(CLEAR)
    return 0;
}

static void step_dealloc(Step *self)
{
    PyObject_GC_UnTrack(self);
    step_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* What object.__new__ says of a class with abstract methods left (the cores' own tp_new
 * would skip that check). */
static int refuse_abstract(PyTypeObject *type)
{
    if (!(type->tp_flags & Py_TPFLAGS_IS_ABSTRACT))
        return 0;
    PyErr_Format(PyExc_TypeError, "Can't instantiate abstract class %s", type->tp_name);
    return -1;
}

static PyObject *step_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (ref_produce == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "runtime.flows._steps.init() was not called");
        return NULL;
    }
    if (refuse_abstract(type) < 0)
        return NULL;
    Step *self = (Step *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->key = Py_NewRef(empty_bytes);
    self->timestamp = PyLong_FromLong(0);
    self->out = PyList_New(0);
    self->ctx = Py_NewRef(Py_None);
    self->state = Py_NewRef(Py_None);
    if (!self->timestamp || !self->out) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* produce(stream, value): the item (key, value, timestamp) onto the call's list, as the
 * reference's common path does; anything with a keyword goes to the reference. */
static PyObject *step_produce(Step *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) == 2 && kwnames == NULL && self->out != NULL && PyList_CheckExact(self->out)
        && self->key != NULL && self->timestamp != NULL) {  /* (NULL only once the collector cleared it) */
        PyObject *item = PyTuple_Pack(3, self->key, args[1], self->timestamp);
        if (item == NULL)
            return NULL;
        int rc = PyList_Append(self->out, item);
        Py_DECREF(item);
        if (rc < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    return to_reference(ref_produce, (PyObject *)self, args, nargsf, kwnames);
}

static PyObject *step_state(Step *self, void *closure)
{
    return Py_NewRef(self->state != NULL ? self->state : Py_None);
}

static PyMethodDef step_methods[] = {
    {"produce", (PyCFunction)(void (*)(void))step_produce, METH_FASTCALL | METH_KEYWORDS,
     "produce(stream, value, *, key=None, timestamp=None): see runtime.Context.produce."},
    {NULL, NULL, 0, NULL},
};

#define STEP_FIELD(name, f) {name, (getter)field_get, (setter)field_set, NULL, (void *)offsetof(Step, f)},
static PyGetSetDef step_getset[] = {
    {"state", (getter)step_state, NULL, "The step's state of this key (runtime.Context.state).", NULL},
    STEP_FIELD("key", key) STEP_FIELD("timestamp", timestamp) STEP_FIELD("out", out) STEP_FIELD("ctx", ctx)
    STEP_FIELD("_state", state)
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject StepCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "runtime.flows._steps.StepCore",
    .tp_basicsize = sizeof(Step),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The per-record fields of runtime.flows.steps.StepContext, and its produce().",
    .tp_new = step_new,
    .tp_dealloc = (destructor)step_dealloc,
    .tp_traverse = (traverseproc)step_traverse,
    .tp_clear = (inquiry)step_clear,
    .tp_methods = step_methods,
    .tp_getset = step_getset,
};

/* ------------------------------------------------------------------ the held state */

static int held_traverse(Held *self, visitproc visit, void *arg)
{
    Py_VISIT(self->step);
    Py_VISIT(self->held);
    Py_VISIT(self->dirty);
    return 0;
}

static int held_clear(Held *self)
{
    Py_CLEAR(self->step);
    Py_CLEAR(self->held);
    Py_CLEAR(self->dirty);
    return 0;
}

static void held_dealloc(Held *self)
{
    PyObject_GC_UnTrack(self);
    held_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *held_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (ref_get == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "runtime.flows._steps.init() was not called");
        return NULL;
    }
    if (refuse_abstract(type) < 0)
        return NULL;
    Held *self = (Held *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->step = Py_NewRef(Py_None);
    self->held = PyDict_New();
    self->dirty = PySet_New(NULL);
    if (!self->held || !self->dirty) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* The key the step works on, if the held state is of the shapes the C path reads (its step a
 * StepCore with a bytes key, an exact dict and set); NULL, with no error set, otherwise.
 * Borrowed. */
static PyObject *held_key(Held *self)
{
    if (self->step == NULL || !PyObject_TypeCheck(self->step, &StepCoreType) || self->held == NULL
        || !PyDict_CheckExact(self->held) || self->dirty == NULL || !PySet_CheckExact(self->dirty))
        return NULL;
    PyObject *key = ((Step *)self->step)->key;
    return key != NULL && PyBytes_CheckExact(key) ? key : NULL;
}

static PyObject *held_get(Held *self, PyObject *unused)
{
    PyObject *key = held_key(self);
    if (key != NULL) {
        /* (held and the key kept alive: a key of another type the user put in the dict may
         * run Python code in the comparison, and that code may replace them) */
        PyObject *held = Py_NewRef(self->held);
        Py_INCREF(key);
        PyObject *v = Py_XNewRef(PyDict_GetItemWithError(held, key));
        Py_DECREF(key);
        Py_DECREF(held);
        if (v != NULL)
            return v;
        if (PyErr_Occurred())
            return NULL;
    }
    return PyObject_CallOneArg(ref_get, (PyObject *)self);  /* read from its cell, and held */
}

static int hold(Held *self, PyObject *key, PyObject *value)
{
    PyObject *held = Py_NewRef(self->held), *dirty = Py_NewRef(self->dirty);  /* (as in held_get) */
    Py_INCREF(key);
    int rc = PyDict_SetItem(held, key, value);
    if (rc == 0)
        rc = PySet_Add(dirty, key);
    Py_DECREF(key);
    Py_DECREF(held);
    Py_DECREF(dirty);
    return rc;
}

static PyObject *held_set(Held *self, PyObject *value)
{
    PyObject *key = held_key(self);
    if (key == NULL || !PyBytes_CheckExact(value) || PyBytes_GET_SIZE(value) > max_held)
        return PyObject_CallFunctionObjArgs(ref_set, (PyObject *)self, value, NULL);
    if (hold(self, key, value) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *held_clear_state(Held *self, PyObject *unused)
{
    PyObject *key = held_key(self);
    if (key == NULL)
        return PyObject_CallOneArg(ref_clear, (PyObject *)self);
    if (hold(self, key, Py_None) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef held_methods[] = {
    {"get", (PyCFunction)held_get, METH_NOARGS, "This key's state (None: none)."},
    {"set", (PyCFunction)held_set, METH_O, "Replace this key's state."},
    {"clear", (PyCFunction)held_clear_state, METH_NOARGS, "Delete this key's state."},
    {NULL, NULL, 0, NULL},
};

#define HELD_FIELD(name, f) {name, (getter)field_get, (setter)field_set, NULL, (void *)offsetof(Held, f)},
static PyGetSetDef held_getset[] = {
    HELD_FIELD("_step", step) HELD_FIELD("_held", held) HELD_FIELD("_dirty", dirty)
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject HeldCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "runtime.flows._steps.HeldCore",
    .tp_basicsize = sizeof(Held),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A process step's held ctx.state: get, set and clear of runtime.flows.steps._HeldRef.",
    .tp_new = held_new,
    .tp_dealloc = (destructor)held_dealloc,
    .tp_traverse = (traverseproc)held_traverse,
    .tp_clear = (inquiry)held_clear,
    .tp_methods = held_methods,
    .tp_getset = held_getset,
};

/* ------------------------------------------------------------------ the loop */

static PyObject *make_record(PyObject *key, PyObject *value, PyObject *ts)
{
    return slots_record(record_type, slot_offset, key, value, ts, empty_bytes, empty_str);
}

/* run(step, fn, rebind, items): for each (key, value, timestamp) of the list ``items``,
 * rebind(key, timestamp), the step's key and timestamp set, fn(step, Record(...)). */
static PyObject *s_run(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "run(step, fn, rebind, items)");
        return NULL;
    }
    if (record_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "runtime.flows._steps.init() was not called");
        return NULL;
    }
    PyObject *step = args[0], *fn = args[1], *rebind = args[2], *items = args[3];
    if (!PyObject_TypeCheck(step, &StepCoreType) || !PyList_Check(items)) {
        PyErr_SetString(PyExc_TypeError, "run() takes a StepCore and a list of items");
        return NULL;
    }
    Step *s = (Step *)step;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {  /* (its length read each time) */
        PyObject *item = PyList_GET_ITEM(items, i);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 3) {
            PyErr_Format(PyExc_TypeError, "a flow step's item %zd is not a (key, value, timestamp) tuple", i);
            return NULL;
        }
        Py_INCREF(item);
        PyObject *key = PyTuple_GET_ITEM(item, 0), *value = PyTuple_GET_ITEM(item, 1),
                 *ts = PyTuple_GET_ITEM(item, 2);
        PyObject *r = PyObject_Vectorcall(rebind, (PyObject *[]){key, ts}, 2, NULL);
        if (r == NULL) {
            Py_DECREF(item);
            return NULL;
        }
        Py_DECREF(r);
        Py_XSETREF(s->key, Py_NewRef(key));
        Py_XSETREF(s->timestamp, Py_NewRef(ts));
        PyObject *rec = make_record(key, value, ts);
        Py_DECREF(item);
        if (rec == NULL)
            return NULL;
        r = PyObject_Vectorcall(fn, (PyObject *[]){step, rec}, 2, NULL);
        Py_DECREF(rec);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_NONE;
}

/* init(record_cls, get, set, clear, produce, max_held): Record's slots checked and noted, and
 * the Python references the C paths fall back on. */
static PyObject *s_init(PyObject *mod, PyObject *args)
{
    PyObject *cls, *get, *set, *clear, *produce;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "O!OOOOn", &PyType_Type, &cls, &get, &set, &clear, &produce, &limit))
        return NULL;
    if (record_slots(cls, slot_offset) < 0)
        return NULL;
    Py_XSETREF(record_type, (PyTypeObject *)Py_NewRef(cls));
    Py_XSETREF(ref_get, Py_NewRef(get));
    Py_XSETREF(ref_set, Py_NewRef(set));
    Py_XSETREF(ref_clear, Py_NewRef(clear));
    Py_XSETREF(ref_produce, Py_NewRef(produce));
    max_held = limit;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"init", s_init, METH_VARARGS, "init(record_cls, get, set, clear, produce, max_held)"},
    {"run", (PyCFunction)(void (*)(void))s_run, METH_FASTCALL, "run(step, fn, rebind, items)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_steps", "A flow's process step, compiled (runtime/flows/steps.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__steps(void)
{
    if (PyType_Ready(&StepCoreType) < 0 || PyType_Ready(&HeldCoreType) < 0)
        return NULL;
    if (empty_bytes == NULL && !(empty_bytes = PyBytes_FromStringAndSize(NULL, 0)))
        return NULL;
    if (empty_str == NULL && !(empty_str = PyUnicode_FromStringAndSize(NULL, 0)))
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "StepCore", (PyObject *)&StepCoreType) < 0
        || PyModule_AddObjectRef(m, "HeldCore", (PyObject *)&HeldCoreType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
