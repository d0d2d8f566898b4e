/*
 * _kiln.c - the CPython extension behind `import kiln`: a thin layer over
 * libkiln's public C API (include/kiln/kiln.h) and nothing else.
 *
 * It defines one type, kiln._kiln.Session (a loaded model plus a
 * kiln_session on one of its signatures), one small type, RunOptions (a
 * deadline and a cancel flag for kiln_session_run_opts), and the exception
 * classes. kiln/__init__.py builds the ONNX Runtime-shaped API on top
 * (InferenceSession subclasses Session; run() is this file's Session_run,
 * called directly, so a call costs one C function and no Python frames).
 *
 * Data crosses without copies where numpy's layout allows:
 *   - an input ndarray that is C-contiguous, aligned and in native byte
 *     order is wrapped in place (kiln_tensor_wrap); anything else is copied
 *     once into such an array (the module counts those copies, see
 *     input_copies());
 *   - each output tensor is taken from the kiln_outputs
 *     (kiln_outputs_take) and handed to numpy as the array's memory; a
 *     capsule that frees the tensor becomes the array's base.
 * Strings are the exception both ways (numpy object arrays hold Python
 * objects, Kiln holds kiln_string), and so are outputs Kiln does not own.
 *
 * Loading and running release the GIL: Kiln's sessions may be used from
 * many threads at once (kiln.h), so Python threads run models in parallel.
 * Errors raise KilnError subclasses whose message is kiln_last_error(),
 * read on the same thread right after the failing call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#include "kiln/kiln.h"

/* ---- dtypes ---- */

/* Per Kiln dtype: ONNX Runtime's type string and the numpy type that holds
 * it. Types numpy lacks travel as their bit patterns: bfloat16 as uint16,
 * the float8/float4 types as uint8, int4/int2 as int8 and uint4/uint2 as
 * uint8 (one element per byte, as Kiln stores them). */
static const struct dtype_entry {
    const char *ort;  /* "tensor(float)" */
    int npy;          /* NPY_FLOAT; -1 = none */
} dtype_table[KILN_DTYPE_COUNT] = {
    [KILN_DTYPE_UNDEFINED] = {"tensor(undefined)", -1},
    [KILN_DTYPE_F32] = {"tensor(float)", NPY_FLOAT32},
    [KILN_DTYPE_F16] = {"tensor(float16)", NPY_FLOAT16},
    [KILN_DTYPE_BF16] = {"tensor(bfloat16)", NPY_UINT16},
    [KILN_DTYPE_F64] = {"tensor(double)", NPY_FLOAT64},
    [KILN_DTYPE_I8] = {"tensor(int8)", NPY_INT8},
    [KILN_DTYPE_U8] = {"tensor(uint8)", NPY_UINT8},
    [KILN_DTYPE_I16] = {"tensor(int16)", NPY_INT16},
    [KILN_DTYPE_U16] = {"tensor(uint16)", NPY_UINT16},
    [KILN_DTYPE_I32] = {"tensor(int32)", NPY_INT32},
    [KILN_DTYPE_U32] = {"tensor(uint32)", NPY_UINT32},
    [KILN_DTYPE_I64] = {"tensor(int64)", NPY_INT64},
    [KILN_DTYPE_U64] = {"tensor(uint64)", NPY_UINT64},
    [KILN_DTYPE_BOOL] = {"tensor(bool)", NPY_BOOL},
    [KILN_DTYPE_STRING] = {"tensor(string)", NPY_OBJECT},
    [KILN_DTYPE_F8E4M3FN] = {"tensor(float8e4m3fn)", NPY_UINT8},
    [KILN_DTYPE_F8E4M3FNUZ] = {"tensor(float8e4m3fnuz)", NPY_UINT8},
    [KILN_DTYPE_F8E5M2] = {"tensor(float8e5m2)", NPY_UINT8},
    [KILN_DTYPE_F8E5M2FNUZ] = {"tensor(float8e5m2fnuz)", NPY_UINT8},
    [KILN_DTYPE_U4] = {"tensor(uint4)", NPY_UINT8},
    [KILN_DTYPE_I4] = {"tensor(int4)", NPY_INT8},
    [KILN_DTYPE_F4E2M1] = {"tensor(float4e2m1)", NPY_UINT8},
    [KILN_DTYPE_F8E8M0] = {"tensor(float8e8m0)", NPY_UINT8},
    [KILN_DTYPE_U2] = {"tensor(uint2)", NPY_UINT8},
    [KILN_DTYPE_I2] = {"tensor(int2)", NPY_INT8},
};
_Static_assert(KILN_DTYPE_COUNT == 25, "a Kiln dtype was added: give it a row in dtype_table");

/* The Kiln dtype of a numpy array, given the dtype the signature expects
 * (so that uint16 can mean bfloat16 bits and uint8 float8 bits); UNDEFINED
 * when numpy's type has no Kiln counterpart. */
static kiln_dtype dtype_from_numpy(PyArray_Descr *d, kiln_dtype want)
{
    int size = (int)d->elsize;
    switch (d->kind) {
    case 'f':
        return size == 4 ? KILN_DTYPE_F32 : size == 8 ? KILN_DTYPE_F64 : size == 2 ? KILN_DTYPE_F16
                                                                                    : KILN_DTYPE_UNDEFINED;
    case 'b':
        return size == 1 ? KILN_DTYPE_BOOL : KILN_DTYPE_UNDEFINED;
    case 'i':
        if (size == 1) return want == KILN_DTYPE_I4 || want == KILN_DTYPE_I2 ? want : KILN_DTYPE_I8;
        return size == 2 ? KILN_DTYPE_I16 : size == 4 ? KILN_DTYPE_I32 : size == 8 ? KILN_DTYPE_I64
                                                                                   : KILN_DTYPE_UNDEFINED;
    case 'u':
        if (size == 1)
            return want > KILN_DTYPE_STRING && dtype_table[want].npy == NPY_UINT8 ? want
                                                                                   : KILN_DTYPE_U8;
        if (size == 2) return want == KILN_DTYPE_BF16 ? KILN_DTYPE_BF16 : KILN_DTYPE_U16;
        return size == 4 ? KILN_DTYPE_U32 : size == 8 ? KILN_DTYPE_U64 : KILN_DTYPE_UNDEFINED;
    case 'O':
    case 'S':
    case 'U':
        return KILN_DTYPE_STRING;
    default:
        return KILN_DTYPE_UNDEFINED;
    }
}

/* ---- errors ---- */

static PyObject *KilnError;                        /* RuntimeError subclass */
static PyObject *status_errors[KILN_ERR_DEADLINE + 1]; /* one subclass per status */
static const struct {
    kiln_status st;
    const char *name;  /* class name in kiln */
    int value_error;   /* also a ValueError */
    const char *doc;
} error_classes[] = {
    {KILN_ERR_INVALID_ARGUMENT, "InvalidArgument", 1,
     "An input or argument is wrong (name, dtype, shape, value)."},
    {KILN_ERR_INVALID_MODEL, "InvalidModel", 0, "The model file is malformed or inconsistent."},
    {KILN_ERR_UNSUPPORTED, "Unsupported", 0, "The model is well-formed but uses something Kiln lacks."},
    {KILN_ERR_NOT_FOUND, "NotFound", 0, "A file, signature, input or output name does not exist."},
    {KILN_ERR_IO, "FileError", 0, "Reading or writing a file failed."},
    {KILN_ERR_OUT_OF_MEMORY, "OutOfMemory", 0, "An allocation failed or a size limit was hit."},
    {KILN_ERR_RUNTIME, "RunFailed", 0, "A kernel failed on these values."},
    {KILN_ERR_INTERNAL, "InternalError", 0, "A bug in Kiln."},
    {KILN_ERR_DEADLINE, "DeadlineExceeded", 0, "The run passed its deadline or was cancelled."},
};

/* Raise the exception for status st with message msg; returns NULL. */
static PyObject *raise_status(kiln_status st, const char *msg)
{
    PyObject *cls = (st > KILN_OK && st <= KILN_ERR_DEADLINE && status_errors[st])
                        ? status_errors[st]
                        : KilnError;
    PyObject *text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
    if (!text) return NULL;
    PyObject *exc = PyObject_CallOneArg(cls, text);
    Py_DECREF(text);
    if (!exc) return NULL;
    PyObject *name = PyUnicode_FromString(kiln_status_name(st));
    if (!name || PyObject_SetAttrString(exc, "status", name) < 0) {
        Py_XDECREF(name);
        Py_DECREF(exc);
        return NULL;
    }
    Py_DECREF(name);
    PyErr_SetObject(cls, exc);
    Py_DECREF(exc);
    return NULL;
}

/* Raise for a failed Kiln call, with Kiln's own message. */
static PyObject *raise_kiln(kiln_status st) { return raise_status(st, kiln_last_error()); }

/* Raise InvalidArgument with a message of this file's own. */
static PyObject *raise_invalid(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return raise_status(KILN_ERR_INVALID_ARGUMENT, buf);
}

/* ---- signatures as Python values ---- */

/* (name, type string, shape) of one input or output: shape is None for an
 * unknown rank, else a list of int (fixed), str (symbolic) or None. */
static PyObject *value_info_tuple(const kiln_value_info *vi)
{
    PyObject *shape;
    if (vi->rank < 0) {
        shape = Py_NewRef(Py_None);
    } else {
        shape = PyList_New(vi->rank);
        if (!shape) return NULL;
        for (int i = 0; i < vi->rank; i++) {
            PyObject *d;
            if (vi->dims[i] >= 0) d = PyLong_FromLongLong((long long)vi->dims[i]);
            else if (vi->dim_names[i] && vi->dim_names[i][0]) d = PyUnicode_FromString(vi->dim_names[i]);
            else d = Py_NewRef(Py_None);
            if (!d) {
                Py_DECREF(shape);
                return NULL;
            }
            PyList_SET_ITEM(shape, i, d);
        }
    }
    unsigned dt = (unsigned)vi->dtype < KILN_DTYPE_COUNT ? (unsigned)vi->dtype : 0;
    const char *ort = vi->dtype == KILN_DTYPE_SEQUENCE   ? "seq(tensor)"
                      : vi->dtype == KILN_DTYPE_OPTIONAL ? "optional"
                                                         : dtype_table[dt].ort;
    return Py_BuildValue("(ssN)", vi->name, ort, shape);
}

/* (name, method, [inputs], [outputs]) of a signature. */
static PyObject *signature_tuple(const kiln_signature *sig)
{
    int ni = kiln_signature_input_count(sig), no = kiln_signature_output_count(sig);
    PyObject *ins = PyList_New(ni), *outs = PyList_New(no);
    if (!ins || !outs) goto fail;
    for (int i = 0; i < ni; i++) {
        PyObject *v = value_info_tuple(kiln_signature_input(sig, i));
        if (!v) goto fail;
        PyList_SET_ITEM(ins, i, v);
    }
    for (int i = 0; i < no; i++) {
        PyObject *v = value_info_tuple(kiln_signature_output(sig, i));
        if (!v) goto fail;
        PyList_SET_ITEM(outs, i, v);
    }
    const char *method = kiln_signature_method(sig);
    return Py_BuildValue("(ssNN)", kiln_signature_name(sig), method ? method : "", ins, outs);
fail:
    Py_XDECREF(ins);
    Py_XDECREF(outs);
    return NULL;
}

/* ---- RunOptions ---- */

typedef struct {
    PyObject_HEAD
    long long timeout_ms;  /* 0 = none */
    volatile int cancel;   /* set by terminate = True, read by running kernels' loop */
} RunOptionsObject;

static int RunOptions_init(RunOptionsObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"timeout_ms", NULL};
    long long timeout_ms = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|L:RunOptions", kwlist, &timeout_ms)) return -1;
    if (timeout_ms < 0) {
        PyErr_SetString(PyExc_ValueError, "timeout_ms must be >= 0");
        return -1;
    }
    self->timeout_ms = timeout_ms;
    self->cancel = 0;
    return 0;
}

static PyObject *RunOptions_get_terminate(RunOptionsObject *self, void *closure)
{
    return PyBool_FromLong(self->cancel);
}

static int RunOptions_set_terminate(RunOptionsObject *self, PyObject *v, void *closure)
{
    if (!v) {
        PyErr_SetString(PyExc_AttributeError, "terminate cannot be deleted");
        return -1;
    }
    int on = PyObject_IsTrue(v);
    if (on < 0) return -1;
    self->cancel = on;
    return 0;
}

static PyObject *RunOptions_get_timeout(RunOptionsObject *self, void *closure)
{
    return PyLong_FromLongLong(self->timeout_ms);
}

static int RunOptions_set_timeout(RunOptionsObject *self, PyObject *v, void *closure)
{
    long long ms = v ? PyLong_AsLongLong(v) : -1;
    if (ms == -1 && PyErr_Occurred()) return -1;
    if (ms < 0) {
        PyErr_SetString(PyExc_ValueError, "timeout_ms must be >= 0");
        return -1;
    }
    self->timeout_ms = ms;
    return 0;
}

static PyGetSetDef RunOptions_getset[] = {
    {"terminate", (getter)RunOptions_get_terminate, (setter)RunOptions_set_terminate,
     "Set to True (from any thread) to stop runs using these options between nodes; they "
     "raise DeadlineExceeded. Set back to False to reuse the options.",
     NULL},
    {"timeout_ms", (getter)RunOptions_get_timeout, (setter)RunOptions_set_timeout,
     "Milliseconds a run may take, counted from its start; 0 = no limit. A run past it stops "
     "between nodes and raises DeadlineExceeded.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RunOptionsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._kiln.RunOptions",
    .tp_basicsize = sizeof(RunOptionsObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "RunOptions(timeout_ms=0)\n\nPer-run options: a time limit and a cancel flag "
              "(terminate), as kiln_run_options offers them.",
    .tp_init = (initproc)RunOptions_init,
    .tp_new = PyType_GenericNew,
    .tp_getset = RunOptions_getset,
};

/* ---- Session ---- */

typedef struct {
    PyObject_HEAD
    kiln_model *model;
    kiln_session *session;
    const kiln_signature *sig;
} SessionObject;

static Py_ssize_t input_copies; /* inputs copied because their layout did not allow wrapping */

static void Session_dealloc(SessionObject *self)
{
    kiln_session_free(self->session);
    kiln_model_free(self->model);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Session_init(SessionObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"source", "signature", "threads", "optimize",
                             "max_tensor_bytes", "reference", "tags", "profile", "precision",
                             NULL};
    PyObject *source;
    const char *signature = NULL, *tags = NULL, *precision_name = NULL;
    int threads = 0, optimize = 1, reference = 0, profile = 0;
    long long max_tensor_bytes = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|ziiLizpz:Session", kwlist, &source, &signature,
                                     &threads, &optimize, &max_tensor_bytes, &reference, &tags,
                                     &profile, &precision_name))
        return -1;
    if (self->session) {
        PyErr_SetString(PyExc_RuntimeError, "Session is already initialized");
        return -1;
    }
    if (threads < 0) {
        raise_invalid("intra_op_num_threads must be >= 0, got %d", threads);
        return -1;
    }
    /* the compute precision (docs/COMPRESSION.md): None is fp32 */
    kiln_precision precision = KILN_PRECISION_FP32;
    if (precision_name && kiln_precision_parse(precision_name, &precision) != KILN_OK) {
        raise_invalid("precision must be 'fp32', 'bf16' or 'int8', got '%.100s'", precision_name);
        return -1;
    }
    kiln_load_options lo = {KILN_FORMAT_AUTO, tags, 0};
    kiln_model *model = NULL;
    kiln_status st;
    if (PyObject_CheckBuffer(source) && !PyUnicode_Check(source)) {
        Py_buffer view;
        if (PyObject_GetBuffer(source, &view, PyBUF_SIMPLE) < 0) return -1;
        Py_BEGIN_ALLOW_THREADS
        st = kiln_model_load_memory(view.buf, (size_t)view.len, &lo, &model);
        Py_END_ALLOW_THREADS
        PyBuffer_Release(&view);
    } else {
        PyObject *path = NULL;
        if (!PyUnicode_FSConverter(source, &path)) return -1;
        Py_BEGIN_ALLOW_THREADS
        st = kiln_model_load(PyBytes_AS_STRING(path), &lo, &model);
        Py_END_ALLOW_THREADS
        Py_DECREF(path);
    }
    if (st != KILN_OK) {
        raise_kiln(st);
        return -1;
    }
    kiln_session_options so;
    kiln_session_options_init(&so);
    so.threads = threads;
    so.optimize = optimize ? 1 : 0;
    so.max_tensor_bytes = max_tensor_bytes;
    so.reference = reference ? 1 : 0;
    so.profile = profile ? 1 : 0;
    so.precision = precision;
    if (so.profile && so.reference) {
        kiln_model_free(model);
        raise_status(KILN_ERR_UNSUPPORTED, "profiling is not available with the reference "
                     "kernels (use_reference_kernels): the reference executor keeps no profile");
        return -1;
    }
    kiln_session *session = NULL;
    Py_BEGIN_ALLOW_THREADS
    st = kiln_session_create(model, signature, &so, &session);
    Py_END_ALLOW_THREADS
    if (st != KILN_OK) {
        raise_kiln(st);
        kiln_model_free(model);
        return -1;
    }
    self->model = model;
    self->session = session;
    self->sig = kiln_session_signature(session);
    return 0;
}

static int session_ready(SessionObject *self)
{
    if (self->session) return 1;
    PyErr_SetString(PyExc_RuntimeError, "Session.__init__ was not called");
    return 0;
}

/* The signature input named name, or NULL. */
static const kiln_value_info *find_input(const kiln_signature *sig, const char *name)
{
    int n = kiln_signature_input_count(sig);
    for (int i = 0; i < n; i++) {
        const kiln_value_info *vi = kiln_signature_input(sig, i);
        if (strcmp(vi->name, name) == 0) return vi;
    }
    return NULL;
}

/* A Kiln string tensor holding the elements of arr (str, bytes or numpy
 * string scalars), in C order. */
static kiln_tensor *strings_to_tensor(const char *name, PyArrayObject *arr, int rank,
                                      const int64_t *dims)
{
    PyArrayObject *obj = (PyArrayObject *)PyArray_FROM_OTF((PyObject *)arr, NPY_OBJECT,
                                                           NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED);
    if (!obj) return NULL;
    kiln_tensor *t = NULL;
    kiln_status st = kiln_tensor_create(KILN_DTYPE_STRING, rank, dims, &t);
    if (st != KILN_OK) {
        Py_DECREF(obj);
        raise_kiln(st);
        return NULL;
    }
    npy_intp n = PyArray_SIZE(obj);
    PyObject **items = (PyObject **)PyArray_DATA(obj);
    for (npy_intp i = 0; i < n; i++) {
        const char *bytes;
        Py_ssize_t len;
        PyObject *it = items[i];
        if (PyBytes_Check(it)) {
            bytes = PyBytes_AS_STRING(it);
            len = PyBytes_GET_SIZE(it);
        } else if (PyUnicode_Check(it)) {
            bytes = PyUnicode_AsUTF8AndSize(it, &len);
            if (!bytes) goto fail;
        } else {
            raise_invalid("input '%s': element %zd is %s, expected str or bytes", name,
                          (Py_ssize_t)i, it ? Py_TYPE(it)->tp_name : "NULL");
            goto fail;
        }
        st = kiln_tensor_set_string(t, (size_t)i, bytes, (size_t)len);
        if (st != KILN_OK) {
            raise_kiln(st);
            goto fail;
        }
    }
    Py_DECREF(obj);
    return t;
fail:
    kiln_tensor_free(t);
    Py_DECREF(obj);
    return NULL;
}

/* One input of a run: the Kiln tensor and the array whose memory it may
 * borrow (kept alive until the run ends). */
struct feed_item {
    PyObject *key;         /* borrowed from the run's copy of the dict */
    const char *name;      /* UTF-8 of key, owned by key */
    PyArrayObject *arr;    /* owned */
    kiln_tensor *tensor;   /* owned (wrapped or created) */
};

/* Turn one input_feed value into a Kiln tensor. */
static int feed_convert(SessionObject *self, struct feed_item *f, PyObject *value)
{
    const kiln_value_info *vi = find_input(self->sig, f->name);
    kiln_dtype want = vi ? vi->dtype : KILN_DTYPE_UNDEFINED;
    if (want == KILN_DTYPE_SEQUENCE || want == KILN_DTYPE_OPTIONAL) {
        raise_invalid("input '%s' is a %s value; the Python API passes tensors in "
                      "(docs/SEQUENCES.md)", f->name, kiln_dtype_name(want));
        return -1;
    }
    if (PyArray_Check(value)) {
        f->arr = (PyArrayObject *)Py_NewRef(value);
    } else if (want == KILN_DTYPE_BF16 || want > KILN_DTYPE_STRING) {
        /* a list of numbers cannot say whether it holds values or bit patterns */
        raise_invalid("input '%s' is %s, which numpy lacks: pass a numpy %s array of its bit "
                      "patterns", f->name, kiln_dtype_name(want),
                      dtype_table[want].npy == NPY_UINT16 ? "uint16"
                      : dtype_table[want].npy == NPY_INT8 ? "int8" : "uint8");
        return -1;
    } else {
        /* lists and scalars become arrays of the dtype the signature expects */
        int npy = (unsigned)want < KILN_DTYPE_COUNT && dtype_table[want].npy >= 0
                      ? dtype_table[want].npy
                      : NPY_NOTYPE;
        PyArray_Descr *d = npy == NPY_NOTYPE ? NULL : PyArray_DescrFromType(npy);
        f->arr = (PyArrayObject *)PyArray_FromAny(value, d, 0, 0, 0, NULL);
        if (!f->arr) return -1;
    }
    PyArrayObject *arr = f->arr;
    int rank = PyArray_NDIM(arr);
    if (rank > KILN_MAX_RANK) {
        raise_invalid("input '%s' has rank %d; Kiln's maximum is %d", f->name, rank, KILN_MAX_RANK);
        return -1;
    }
    int64_t dims[KILN_MAX_RANK];
    for (int i = 0; i < rank; i++) dims[i] = (int64_t)PyArray_DIM(arr, i);
    kiln_dtype dt = dtype_from_numpy(PyArray_DESCR(arr), want);
    if (dt == KILN_DTYPE_UNDEFINED) {
        PyObject *s = PyObject_Str((PyObject *)PyArray_DESCR(arr));
        raise_invalid("input '%s': numpy dtype %s has no Kiln dtype", f->name,
                      s ? PyUnicode_AsUTF8(s) : "?");
        Py_XDECREF(s);
        return -1;
    }
    if (dt == KILN_DTYPE_STRING) {
        f->tensor = strings_to_tensor(f->name, arr, rank, dims);
        return f->tensor ? 0 : -1;
    }
    if (!PyArray_IS_C_CONTIGUOUS(arr) || !PyArray_ISALIGNED(arr) || !PyArray_ISNOTSWAPPED(arr)) {
        PyArray_Descr *native = PyArray_DescrFromType(PyArray_DESCR(arr)->type_num);
        if (!native) return -1;
        PyArrayObject *c = (PyArrayObject *)PyArray_FromArray(
            arr, native, NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_ENSURECOPY);
        if (!c) return -1;
        Py_SETREF(f->arr, c);
        arr = c;
        input_copies++;
    }
    kiln_status st = kiln_tensor_wrap(dt, rank, dims, PyArray_DATA(arr), (size_t)PyArray_NBYTES(arr),
                                      &f->tensor);
    if (st != KILN_OK) {
        raise_kiln(st);
        return -1;
    }
    return 0;
}

/* Free a capsule's tensor: the array that used its memory is gone. */
static void tensor_capsule_free(PyObject *cap)
{
    kiln_tensor_free(PyCapsule_GetPointer(cap, "kiln.tensor"));
}

/* A numpy array for an output tensor; takes ownership of t. */
static PyObject *tensor_to_array(kiln_tensor *t)
{
    if (t->dtype == KILN_DTYPE_SEQUENCE || t->dtype == KILN_DTYPE_OPTIONAL) {
        /* a sequence becomes a list of arrays, an optional its value or None
         * (docs/SEQUENCES.md); each item is taken from the container as it converts */
        kiln_tensor **items = t->data;
        int64_t n = t->dims[0];
        PyObject *r = NULL;
        if (t->dtype == KILN_DTYPE_OPTIONAL) {
            if (n == 0 || !items[0]) {
                r = Py_NewRef(Py_None);
            } else {
                kiln_tensor *it = items[0];
                items[0] = NULL;
                r = tensor_to_array(it);
            }
        } else if ((r = PyList_New((Py_ssize_t)n)) != NULL) {
            for (int64_t i = 0; i < n; i++) {
                kiln_tensor *it = items[i];
                items[i] = NULL;
                PyObject *a = it ? tensor_to_array(it) : NULL;
                if (!a) {
                    if (!it) raise_status(KILN_ERR_INTERNAL, "a sequence item is missing");
                    Py_CLEAR(r);
                    break;
                }
                PyList_SET_ITEM(r, (Py_ssize_t)i, a);
            }
        }
        kiln_tensor_free(t);
        return r;
    }
    npy_intp dims[KILN_MAX_RANK];
    int rank = t->rank;
    for (int i = 0; i < rank; i++) dims[i] = (npy_intp)t->dims[i];
    if ((unsigned)t->dtype >= KILN_DTYPE_COUNT || dtype_table[t->dtype].npy < 0) {
        kiln_tensor_free(t);
        return raise_status(KILN_ERR_INTERNAL, "an output has no dtype");
    }
    if (t->dtype == KILN_DTYPE_STRING) {
        PyArrayObject *a = (PyArrayObject *)PyArray_SimpleNew(rank, dims, NPY_OBJECT);
        if (!a) goto fail;
        const kiln_string *s = t->data;
        PyObject **items = (PyObject **)PyArray_DATA(a);
        npy_intp n = PyArray_SIZE(a);
        for (npy_intp i = 0; i < n; i++) {
            /* str where the bytes are UTF-8 (as ONNX Runtime returns), else bytes */
            PyObject *v = PyUnicode_DecodeUTF8(s[i].data ? s[i].data : "", (Py_ssize_t)s[i].len, NULL);
            if (!v) {
                PyErr_Clear();
                v = PyBytes_FromStringAndSize(s[i].data, (Py_ssize_t)s[i].len);
            }
            if (!v) {
                Py_DECREF(a);
                goto fail;
            }
            Py_XSETREF(items[i], v);
        }
        kiln_tensor_free(t);
        return (PyObject *)a;
    }
    int npy = dtype_table[t->dtype].npy;
    if (!t->owns_data || !t->data || t->nbytes == 0) {
        PyArrayObject *a = (PyArrayObject *)PyArray_SimpleNew(rank, dims, npy);
        if (!a) goto fail;
        if (t->nbytes && t->data && (size_t)PyArray_NBYTES(a) == t->nbytes)
            memcpy(PyArray_DATA(a), t->data, t->nbytes);
        kiln_tensor_free(t);
        return (PyObject *)a;
    }
    PyObject *cap = PyCapsule_New(t, "kiln.tensor", tensor_capsule_free);
    if (!cap) goto fail;
    /* from here the capsule owns t */
    PyObject *a = PyArray_SimpleNewFromData(rank, dims, npy, t->data);
    if (!a) {
        Py_DECREF(cap);
        return NULL;
    }
    if (PyArray_SetBaseObject((PyArrayObject *)a, cap) < 0) { /* steals cap */
        Py_DECREF(a);
        return NULL;
    }
    return a;
fail:
    kiln_tensor_free(t);
    return NULL;
}

#define FEED_ON_STACK 16

PyDoc_STRVAR(Session_run_doc,
"run(output_names, input_feed, run_options=None) -> list of numpy.ndarray\n\n"
"Run the model. input_feed maps input names to numpy arrays (lists and\n"
"scalars are converted to the dtype the signature declares; arrays must\n"
"have it already). output_names lists the outputs wanted, in order; None\n"
"or [] means all, in the signature's order. The GIL is released while the\n"
"model runs. Raises InvalidArgument (a ValueError) for a wrong input name,\n"
"dtype or shape, and other KilnError subclasses with Kiln's message.");

static PyObject *Session_run(SessionObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"output_names", "input_feed", "run_options", NULL};
    PyObject *output_names, *feed, *run_options = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O:run", kwlist, &output_names, &feed,
                                     &run_options))
        return NULL;
    if (!session_ready(self)) return NULL;
    if (!PyDict_Check(feed)) {
        PyErr_Format(PyExc_TypeError, "input_feed must be a dict of name -> array, got %s",
                     Py_TYPE(feed)->tp_name);
        return NULL;
    }
    /* a private copy: converting a value may run Python code that changes the caller's dict */
    feed = PyDict_Copy(feed);
    if (!feed) return NULL;
    kiln_run_options ro = {0, NULL};
    const kiln_run_options *rop = NULL;
    if (run_options != Py_None) {
        if (!PyObject_TypeCheck(run_options, &RunOptionsType)) {
            PyErr_Format(PyExc_TypeError, "run_options must be kiln.RunOptions, got %s",
                         Py_TYPE(run_options)->tp_name);
            Py_DECREF(feed);
            return NULL;
        }
        RunOptionsObject *r = (RunOptionsObject *)run_options;
        if (r->timeout_ms > 0) ro.deadline_ms = kiln_monotonic_ms() + r->timeout_ms;
        ro.cancel = &r->cancel;
        rop = &ro;
    }

    /* which outputs, by index into the signature's outputs */
    int n_sig_out = kiln_signature_output_count(self->sig);
    PyObject *names_seq = NULL;
    Py_ssize_t n_want = n_sig_out;
    if (output_names != Py_None) {
        names_seq = PySequence_Fast(output_names, "output_names must be a list of str or None");
        if (!names_seq) {
            Py_DECREF(feed);
            return NULL;
        }
        if (PySequence_Fast_GET_SIZE(names_seq) > 0) n_want = PySequence_Fast_GET_SIZE(names_seq);
        else Py_CLEAR(names_seq);
    }
    int want_stack[FEED_ON_STACK];
    int *want = n_want <= FEED_ON_STACK ? want_stack : PyMem_Malloc((size_t)n_want * sizeof *want);
    Py_ssize_t n_feed = PyDict_GET_SIZE(feed);
    struct feed_item feed_stack[FEED_ON_STACK];
    kiln_named_tensor named_stack[FEED_ON_STACK];
    struct feed_item *items = n_feed <= FEED_ON_STACK ? feed_stack
                                                      : PyMem_Calloc((size_t)n_feed, sizeof *items);
    kiln_named_tensor *named = n_feed <= FEED_ON_STACK ? named_stack
                                                       : PyMem_Calloc((size_t)n_feed, sizeof *named);
    PyObject *result = NULL;
    kiln_outputs *out = NULL;
    if (!want || !items || !named) {
        PyErr_NoMemory();
        goto done;
    }
    memset(items, 0, (size_t)n_feed * sizeof *items);
    for (Py_ssize_t k = 0; k < n_want; k++) {
        if (!names_seq) {
            want[k] = (int)k;
            continue;
        }
        PyObject *o = PySequence_Fast_GET_ITEM(names_seq, k);
        const char *nm = PyUnicode_Check(o) ? PyUnicode_AsUTF8(o) : NULL;
        if (!nm) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "output_names[%zd] must be str, got %s", k,
                             Py_TYPE(o)->tp_name);
            goto done;
        }
        want[k] = -1;
        for (int j = 0; j < n_sig_out; j++)
            if (strcmp(kiln_signature_output(self->sig, j)->name, nm) == 0) want[k] = j;
        if (want[k] < 0) {
            raise_invalid("'%s' is not an output of signature '%s'", nm,
                          kiln_signature_name(self->sig));
            goto done;
        }
    }

    /* inputs */
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *value;
    while (PyDict_Next(feed, &pos, &key, &value)) {
        struct feed_item *f = &items[i++];
        f->key = key;
        if (!PyUnicode_Check(key)) {
            PyErr_Format(PyExc_TypeError, "input_feed keys must be str, got %s",
                         Py_TYPE(key)->tp_name);
            goto done;
        }
        f->name = PyUnicode_AsUTF8(key);
        if (!f->name || feed_convert(self, f, value) < 0) goto done;
        named[i - 1].name = f->name;
        named[i - 1].tensor = f->tensor;
    }

    kiln_status st;
    Py_BEGIN_ALLOW_THREADS
    st = kiln_session_run_opts(self->session, named, (int)n_feed, rop, &out);
    Py_END_ALLOW_THREADS
    if (st != KILN_OK) {
        raise_kiln(st);
        goto done;
    }

    result = PyList_New(n_want);
    if (!result) goto done;
    for (Py_ssize_t k = 0; k < n_want; k++) {
        PyObject *arr = NULL;
        for (Py_ssize_t e = 0; e < k && !arr; e++) /* the same output asked for twice */
            if (want[e] == want[k]) arr = Py_NewRef(PyList_GET_ITEM(result, e));
        if (!arr) {
            kiln_tensor *t = kiln_outputs_take(out, want[k]);
            if (!t) {
                raise_status(KILN_ERR_INTERNAL, "an output of the run is missing");
                Py_CLEAR(result);
                goto done;
            }
            arr = tensor_to_array(t);
        }
        if (!arr) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, k, arr);
    }
done:
    kiln_outputs_free(out);
    for (Py_ssize_t k = 0; k < n_feed && items; k++) {
        kiln_tensor_free(items[k].tensor);
        Py_XDECREF(items[k].arr);
    }
    if (items != feed_stack) PyMem_Free(items);
    if (named != named_stack) PyMem_Free(named);
    if (want != want_stack) PyMem_Free(want);
    Py_XDECREF(names_seq);
    Py_DECREF(feed);
    return result;
}

static PyObject *Session_inputs(SessionObject *self, PyObject *unused)
{
    if (!session_ready(self)) return NULL;
    int n = kiln_signature_input_count(self->sig);
    PyObject *l = PyList_New(n);
    for (int i = 0; l && i < n; i++) {
        PyObject *v = value_info_tuple(kiln_signature_input(self->sig, i));
        if (!v) Py_CLEAR(l);
        else PyList_SET_ITEM(l, i, v);
    }
    return l;
}

static PyObject *Session_outputs(SessionObject *self, PyObject *unused)
{
    if (!session_ready(self)) return NULL;
    int n = kiln_signature_output_count(self->sig);
    PyObject *l = PyList_New(n);
    for (int i = 0; l && i < n; i++) {
        PyObject *v = value_info_tuple(kiln_signature_output(self->sig, i));
        if (!v) Py_CLEAR(l);
        else PyList_SET_ITEM(l, i, v);
    }
    return l;
}

static PyObject *Session_signatures(SessionObject *self, PyObject *unused)
{
    if (!session_ready(self)) return NULL;
    int n = kiln_model_signature_count(self->model);
    PyObject *l = PyList_New(n);
    for (int i = 0; l && i < n; i++) {
        PyObject *v = signature_tuple(kiln_model_signature(self->model, i));
        if (!v) Py_CLEAR(l);
        else PyList_SET_ITEM(l, i, v);
    }
    return l;
}

static PyObject *Session_signature_name(SessionObject *self, PyObject *unused)
{
    if (!session_ready(self)) return NULL;
    return PyUnicode_FromString(kiln_signature_name(self->sig));
}

static PyObject *Session_model_info(SessionObject *self, PyObject *unused)
{
    if (!session_ready(self)) return NULL;
    kiln_model_stats ms;
    kiln_model_get_stats(self->model, &ms);
    int no = kiln_model_opset_count(self->model);
    PyObject *opsets = PyDict_New();
    for (int i = 0; opsets && i < no; i++) {
        const char *domain;
        int64_t version;
        kiln_model_opset(self->model, i, &domain, &version);
        PyObject *v = PyLong_FromLongLong((long long)version);
        if (!v || PyDict_SetItemString(opsets, domain ? domain : "", v) < 0) Py_CLEAR(opsets);
        Py_XDECREF(v);
    }
    int nk = kiln_model_op_kinds(self->model);
    PyObject *ops = PyDict_New();
    for (int i = 0; ops && i < nk; i++) {
        const char *op;
        int count;
        kiln_model_op_kind(self->model, i, &op, &count);
        PyObject *v = PyLong_FromLong(count);
        if (!v || PyDict_SetItemString(ops, op, v) < 0) Py_CLEAR(ops);
        Py_XDECREF(v);
    }
    if (!opsets || !ops) {
        Py_XDECREF(opsets);
        Py_XDECREF(ops);
        return NULL;
    }
    return Py_BuildValue("{s:s,s:L,s:L,s:i,s:L,s:s,s:N,s:N}", "format",
                         kiln_model_format(self->model), "param_count", (long long)ms.param_count,
                         "param_bytes", (long long)ms.param_bytes, "node_count", ms.node_count,
                         "ir_version", (long long)ms.ir_version, "producer",
                         ms.producer ? ms.producer : "", "opsets", opsets, "ops", ops);
}

static PyObject *Session_optimization_log(SessionObject *self, PyObject *unused)
{
    if (!session_ready(self)) return NULL;
    char *text = NULL;
    kiln_status st;
    Py_BEGIN_ALLOW_THREADS
    st = kiln_session_optimization_log(self->session, &text);
    Py_END_ALLOW_THREADS
    if (st != KILN_OK) return raise_kiln(st);
    PyObject *s = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
    free(text);
    return s;
}

static PyObject *Session_precompile(SessionObject *self, PyObject *arg)
{
    if (!session_ready(self)) return NULL;
    PyObject *seq = PySequence_Fast(arg, "batch_sizes must be a list of int");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > 4096) {
        Py_DECREF(seq);
        return raise_invalid("precompile: %zd batch sizes; at most 4096", n);
    }
    int64_t *sizes = PyMem_Calloc((size_t)n + 1, sizeof *sizes);
    if (!sizes) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred()) {
            PyMem_Free(sizes);
            Py_DECREF(seq);
            return NULL;
        }
        sizes[i] = (int64_t)v;
    }
    Py_DECREF(seq);
    kiln_status st;
    Py_BEGIN_ALLOW_THREADS
    st = kiln_session_precompile(self->session, sizes, (int)n);
    Py_END_ALLOW_THREADS
    PyMem_Free(sizes);
    if (st != KILN_OK) return raise_kiln(st);
    Py_RETURN_NONE;
}

/* One profile entry (kiln_profile_entry) as a dict. */
static PyObject *profile_entry_dict(const kiln_profile_entry *e)
{
    PyObject *node = e->node ? PyUnicode_DecodeUTF8(e->node, (Py_ssize_t)strlen(e->node), "replace")
                             : (Py_INCREF(Py_None), Py_None);
    if (!node) return NULL;
    return Py_BuildValue("{s:s,s:N,s:s,s:L,s:L,s:d,s:d,s:i,s:i,s:i}", "op_type", e->op,
                         "node_name", node, "kernel", e->kernel, "calls", (long long)e->calls,
                         "total_ns", (long long)e->total_ns, "share", e->share, "flops", e->flops,
                         "nodes", e->nodes, "plan", e->plan, "step", e->step);
}

static PyObject *Session_profile_get(SessionObject *self, PyObject *arg)
{
    if (!session_ready(self)) return NULL;
    int by_op = PyObject_IsTrue(arg);
    if (by_op < 0) return NULL;
    kiln_profile *p = NULL;
    kiln_status st = kiln_session_profile_get(self->session, &p);
    if (st != KILN_OK) return raise_kiln(st);
    int n = by_op ? kiln_profile_op_count(p) : kiln_profile_step_count(p);
    PyObject *list = PyList_New(n);
    for (int i = 0; list && i < n; i++) {
        PyObject *d = profile_entry_dict(by_op ? kiln_profile_op(p, i) : kiln_profile_step(p, i));
        if (!d) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, d);
    }
    kiln_profile_free(p);
    return list;
}

static PyObject *Session_profile_enable(SessionObject *self, PyObject *arg)
{
    if (!session_ready(self)) return NULL;
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    kiln_status st = kiln_session_profile_enable(self->session, on);
    if (st != KILN_OK) return raise_kiln(st);
    Py_RETURN_NONE;
}

static PyObject *Session_profile_reset(SessionObject *self, PyObject *unused)
{
    if (!session_ready(self)) return NULL;
    kiln_status st = kiln_session_profile_reset(self->session);
    if (st != KILN_OK) return raise_kiln(st);
    Py_RETURN_NONE;
}

static PyMethodDef Session_methods[] = {
    {"run", (PyCFunction)(void (*)(void))Session_run, METH_VARARGS | METH_KEYWORDS, Session_run_doc},
    {"_inputs", (PyCFunction)Session_inputs, METH_NOARGS,
     "The signature's inputs as (name, type, shape) tuples."},
    {"_outputs", (PyCFunction)Session_outputs, METH_NOARGS,
     "The signature's outputs as (name, type, shape) tuples."},
    {"_signatures", (PyCFunction)Session_signatures, METH_NOARGS,
     "Every signature of the model as (name, method, inputs, outputs)."},
    {"_signature_name", (PyCFunction)Session_signature_name, METH_NOARGS,
     "The name of the signature this session runs."},
    {"_model_info", (PyCFunction)Session_model_info, METH_NOARGS,
     "Facts about the model (kiln_model_get_stats, opsets, op histogram) as a dict."},
    {"optimization_log", (PyCFunction)Session_optimization_log, METH_NOARGS,
     "optimization_log() -> str\n\nThe graph optimizer's log for this session's signature: one "
     "line per pass, then totals (\"optimizer disabled\" when optimization is off)."},
    {"_profile", (PyCFunction)Session_profile_get, METH_O,
     "The profile (kiln_session_profile_get) as a list of dicts, slowest first: per step, or "
     "per op type and kernel when the argument is true."},
    {"_profile_enable", (PyCFunction)Session_profile_enable, METH_O,
     "Turn the session's profiling on or off (kiln_session_profile_enable)."},
    {"_profile_reset", (PyCFunction)Session_profile_reset, METH_NOARGS,
     "Zero the profile's counters (kiln_session_profile_reset)."},
    {"precompile", (PyCFunction)Session_precompile, METH_O,
     "precompile(batch_sizes) -> None\n\nCompile and cache the execution plans for these batch "
     "sizes now (dimension 0 of every input set to each size, other symbolic dimensions to 1 "
     "unless fixed), so that the first run at each size does not pay for it."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SessionType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._kiln.Session",
    .tp_basicsize = sizeof(SessionObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Session(source, signature=None, threads=0, optimize=1, max_tensor_bytes=0, "
              "reference=0, tags=None, profile=False, precision=None)\n\nA loaded model and a session "
              "on one of its signatures; the base of kiln.InferenceSession. precision: 'fp32' "
              "(None), 'bf16' or 'int8' (docs/COMPRESSION.md); another value is InvalidArgument, a ValueError.",
    .tp_dealloc = (destructor)Session_dealloc,
    .tp_init = (initproc)Session_init,
    .tp_new = PyType_GenericNew,
    .tp_methods = Session_methods,
};

/* ---- module ---- */

static PyObject *mod_input_copies(PyObject *m, PyObject *unused)
{
    return PyLong_FromSsize_t(input_copies);
}

static PyObject *mod_version(PyObject *m, PyObject *unused) { return PyUnicode_FromString(kiln_version()); }

static PyMethodDef module_methods[] = {
    {"input_copies", mod_input_copies, METH_NOARGS,
     "input_copies() -> int\n\nHow many input arrays this process had to copy before a run "
     "because they were not C-contiguous, aligned and in native byte order (all others are "
     "read in place)."},
    {"version", mod_version, METH_NOARGS, "version() -> str\n\nlibkiln's version."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kiln_module = {
    PyModuleDef_HEAD_INIT, "kiln._kiln",
    "The C extension behind `import kiln` (use the kiln package, not this module).", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kiln(void)
{
    import_array();
    if (PyType_Ready(&SessionType) < 0 || PyType_Ready(&RunOptionsType) < 0) return NULL;
    PyObject *m = PyModule_Create(&kiln_module);
    if (!m) return NULL;
    PyObject *doc = PyUnicode_FromString("Kiln's error: the message is Kiln's own "
                                         "(kiln_last_error()); .status names the kiln_status.");
    KilnError = PyErr_NewExceptionWithDoc("kiln.KilnError", PyUnicode_AsUTF8(doc),
                                          PyExc_RuntimeError, NULL);
    Py_XDECREF(doc);
    if (!KilnError || PyModule_AddObjectRef(m, "KilnError", KilnError) < 0) goto fail;
    for (size_t i = 0; i < sizeof error_classes / sizeof error_classes[0]; i++) {
        char qual[64];
        snprintf(qual, sizeof qual, "kiln.%s", error_classes[i].name);
        PyObject *bases = error_classes[i].value_error
                              ? PyTuple_Pack(2, KilnError, PyExc_ValueError)
                              : PyTuple_Pack(1, KilnError);
        if (!bases) goto fail;
        PyObject *cls = PyErr_NewExceptionWithDoc(qual, error_classes[i].doc, bases, NULL);
        Py_DECREF(bases);
        if (!cls) goto fail;
        status_errors[error_classes[i].st] = cls;
        if (PyModule_AddObjectRef(m, error_classes[i].name, cls) < 0) goto fail;
    }
    if (PyModule_AddObjectRef(m, "Session", (PyObject *)&SessionType) < 0 ||
        PyModule_AddObjectRef(m, "RunOptions", (PyObject *)&RunOptionsType) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
