/* What the compiled cores share (worker/_loop.c: a batch's record loop and the context user
 * code calls; runtime/flows/_steps.c: a flow's process step): their fields as attributes, the
 * hand-off to a method's Python reference, and a Record made by writing its slots. Included
 * by both; every function is static, so each module has its own copy and no symbol crosses
 * between them. */

#ifndef MILLSTREAM_CCORE_H
#define MILLSTREAM_CCORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

/* A field (a PyObject * at ``offset`` in the struct) as an attribute: readable and writable
 * from Python (the classes over a core use them), never deleted, as every C path reads the
 * fields without a check for NULL. */
static PyObject *field_get(PyObject *self, void *offset)
{
    PyObject *v = *(PyObject **)((char *)self + (Py_ssize_t)offset);
    return Py_NewRef(v != NULL ? v : Py_None);
}

static int field_set(PyObject *self, PyObject *value, void *offset)
{
    if (value == NULL) {
        PyErr_Format(PyExc_AttributeError, "a %s's fields cannot be deleted", Py_TYPE(self)->tp_name);
        return -1;
    }
    Py_XSETREF(*(PyObject **)((char *)self + (Py_ssize_t)offset), Py_NewRef(value));
    return 0;
}

/* ref(self, *args, **kwargs): the Python reference of a method, for what the C path does not take. */
static PyObject *to_reference(PyObject *ref, PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t total = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *small[8], **all = total + 1 <= 8 ? small : PyMem_Malloc((total + 1) * sizeof(PyObject *));
    if (all == NULL)
        return PyErr_NoMemory();
    all[0] = self;
    for (Py_ssize_t k = 0; k < total; k++)
        all[k + 1] = args[k];
    PyObject *r = PyObject_Vectorcall(ref, all, nargs + 1, kwnames);
    if (all != small)
        PyMem_Free(all);
    return r;
}

/* runtime/record.py's Record: its five fields' slot offsets into ``offsets``, once each is a
 * plain object slot; -1 with TypeError otherwise (the caller then keeps its Python path). */
static int record_slots(PyObject *cls, Py_ssize_t offsets[5])
{
    static const char *fields[5] = {"key", "value", "timestamp", "id", "stream"};
    Py_ssize_t found[5];
    PyObject *dict = ((PyTypeObject *)cls)->tp_dict;
    for (int k = 0; k < 5; k++) {
        PyObject *descr = PyDict_GetItemString(dict, fields[k]);  /* borrowed */
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", ((PyTypeObject *)cls)->tp_name, fields[k]);
            return -1;
        }
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY)) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a plain object slot", ((PyTypeObject *)cls)->tp_name,
                         fields[k]);
            return -1;
        }
        found[k] = m->offset;
    }
    memcpy(offsets, found, sizeof found);  /* only once every field passed */
    return 0;
}

/* A Record with its five slots written directly: what Record(key, value, ts, id, stream)
 * makes, without the Python frame of its __init__. */
static PyObject *slots_record(PyTypeObject *type, const Py_ssize_t offsets[5], PyObject *key, PyObject *value,
                              PyObject *ts, PyObject *rid, PyObject *stream)
{
    PyObject *r = type->tp_alloc(type, 0);
    if (r == NULL)
        return NULL;
    PyObject *fields[5] = {key, value, ts, rid, stream};
    for (int k = 0; k < 5; k++)
        *(PyObject **)((char *)r + offsets[k]) = Py_NewRef(fields[k]);
    return r;
}

#endif
