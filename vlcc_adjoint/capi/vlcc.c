/*
 * libvlcc: the functions of vlcc.h, a thin layer over the Python engine.
 *
 * Each function checks what only C can check (NULL pointers, handles), takes
 * the GIL, calls the Python side (vlcc_adjoint.capi._bridge names the call
 * behind each function), turns any exception into a return code and a
 * message, and releases the GIL.  Between calls the GIL is free, so the
 * engine's background threads (writes to slower levels, read-ahead) run while
 * the program computes.  Nothing here interprets a schedule: vlcc_run_next
 * resumes the Python iterator of the run's answers, which pulls the rows
 * through the one action machine (vlcc_adjoint.schedules.Machine).
 *
 * Embedding.  The first open starts the interpreter if the program has not
 * (a program that runs Python already, or a Python extension that calls this
 * library, shares its interpreter): configured as the interpreter that built
 * this library (its sys.executable, so its virtual environment and
 * site-packages are found) with the directory of the vlcc_adjoint package
 * that built it first on sys.path, without Python's signal handlers (the
 * program keeps SIGINT).  Those paths are compiled in (vlcc_config.h, written
 * by vlcc_adjoint.capi's build), so a program runs from any directory without
 * environment variables.  At exit the handles left open are closed (pending
 * writes flushed) and the interpreter is finalised, if this library started it.
 *
 * Handles.  A handle is not a pointer to memory but an encoded slot number
 * and generation of a table of open objects: a closed handle (whose slot may
 * have been reused since) or one of the other kind is recognised and
 * refused, never dereferenced.  The table is guarded by the GIL.
 *
 * Errors.  Every function returns VLCC_OK or a VLCC_E_ code and leaves a
 * message in a per-thread buffer that vlcc_last_error() returns.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vlcc.h"
#include "vlcc_config.h" /* VLCC_PYTHON_EXECUTABLE, VLCC_PACKAGE_ROOT, VLCC_LIBPYTHON */

/* -- errors ---------------------------------------------------------------- */

#define ERROR_BYTES 4096
static _Thread_local char last_error[ERROR_BYTES];

static int fail(int code, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(last_error, ERROR_BYTES, fmt, args);
    va_end(args);
    if (n >= ERROR_BYTES) /* cut: say so */
        memcpy(last_error + ERROR_BYTES - 5, "...", 4);
    return code;
}

const char *vlcc_last_error(void) { return last_error; }

int vlcc_set_last_error(int code, const char *message)
{
    return fail(code, "%s", message ? message : "");
}

/* -- the interpreter ------------------------------------------------------- */

static pthread_once_t start_once = PTHREAD_ONCE_INIT;
static int started;                 /* the Python side is ready */
static int we_initialised;          /* this library started the interpreter */
static pthread_t init_thread;       /* ... in this thread */
static char start_error[ERROR_BYTES];
static const int start_code = VLCC_E_PYTHON;

static PyObject *bridge_open_run, *bridge_open_history, *bridge_error;
static PyObject *name_protect, *name_actions, *name_close, *name_commit, *name_checkout;

enum { KIND_FREE = 0, KIND_RUN = 1, KIND_HISTORY = 2 };
enum { RUN_OPEN = 0, RUN_RUNNING = 1, RUN_DONE = 2, RUN_FAILED = 3 };

typedef struct {
    uint32_t generation; /* changes when the slot is freed */
    int kind;
    int state;           /* runs: RUN_... */
    PyObject *obj;       /* the Python run or history */
    PyObject *rows;      /* runs: the iterator of answers, once started */
} slot_t;

static slot_t *slots;
static uint32_t slot_count, slot_capacity;
static uint32_t *free_slots, free_count;

static void stop_python(void);

/* The message of the Python exception being raised (and its code), cleared. */
static int python_error(const char *call)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    int code = VLCC_E_INTERNAL;
    const char *text = NULL;
    PyObject *described = NULL;
    if (value != NULL && bridge_error != NULL)
        described = PyObject_CallOneArg(bridge_error, value);
    if (described != NULL && PyTuple_Check(described) && PyTuple_GET_SIZE(described) == 2) {
        code = (int)PyLong_AsLong(PyTuple_GET_ITEM(described, 0));
        text = PyUnicode_AsUTF8(PyTuple_GET_ITEM(described, 1));
    }
    if (text == NULL) {
        PyErr_Clear();
        text = "an exception that could not be described";
        if (value != NULL) {
            PyObject *s = PyObject_Str(value);
            const char *t = s ? PyUnicode_AsUTF8(s) : NULL;
            if (t != NULL) {
                fail(code, "%s: %s", call, t);
                Py_XDECREF(s);
                goto done;
            }
            Py_XDECREF(s);
            PyErr_Clear();
        }
    }
    fail(code, "%s: %s", call, text);
done:
    Py_XDECREF(described);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Clear();
    return code;
}

static int startup_failed(const char *what)
{
    if (PyErr_Occurred()) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        PyObject *s = value ? PyObject_Str(value) : NULL;
        const char *t = s ? PyUnicode_AsUTF8(s) : NULL;
        snprintf(start_error, ERROR_BYTES, "%s: %s: %s", what,
                 type ? ((PyTypeObject *)type)->tp_name : "error", t ? t : "(no message)");
        Py_XDECREF(s);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        PyErr_Clear();
    } else {
        snprintf(start_error, ERROR_BYTES, "%s", what);
    }
    return -1;
}

static int import_bridge(void)
{
    PyObject *sys_path = PySys_GetObject("path"); /* borrowed */
    PyObject *root = PyUnicode_DecodeFSDefault(VLCC_PACKAGE_ROOT);
    if (sys_path == NULL || root == NULL)
        return startup_failed("cannot read sys.path");
    int present = PySequence_Contains(sys_path, root);
    if (present == 0 && PyList_Insert(sys_path, 0, root) < 0)
        present = -1;
    Py_DECREF(root);
    if (present < 0)
        return startup_failed("cannot put the package's directory on sys.path");
    PyObject *bridge = PyImport_ImportModule("vlcc_adjoint.capi._bridge");
    if (bridge == NULL)
        return startup_failed("cannot import vlcc_adjoint.capi._bridge (built from "
                              VLCC_PACKAGE_ROOT ", for " VLCC_PYTHON_EXECUTABLE ")");
    bridge_open_run = PyObject_GetAttrString(bridge, "open_run");
    bridge_open_history = PyObject_GetAttrString(bridge, "open_history");
    bridge_error = PyObject_GetAttrString(bridge, "error");
    Py_DECREF(bridge);
    name_protect = PyUnicode_InternFromString("protect");
    name_actions = PyUnicode_InternFromString("actions");
    name_close = PyUnicode_InternFromString("close");
    name_commit = PyUnicode_InternFromString("commit");
    name_checkout = PyUnicode_InternFromString("checkout");
    if (!bridge_open_run || !bridge_open_history || !bridge_error || !name_protect ||
        !name_actions || !name_close || !name_commit || !name_checkout)
        return startup_failed("vlcc_adjoint.capi._bridge lacks a function libvlcc calls");
    return 0;
}

static void start_python(void)
{
    PyGILState_STATE gil = PyGILState_UNLOCKED;
    if (!Py_IsInitialized()) {
        /* Python's own extension modules (numpy's) resolve its symbols in the
           global scope: make sure libpython is there even if this library was
           loaded with RTLD_LOCAL. */
        dlopen(VLCC_LIBPYTHON, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
        PyConfig config;
        PyConfig_InitPythonConfig(&config);
        config.install_signal_handlers = 0;
        config.parse_argv = 0;
        PyStatus status =
            PyConfig_SetBytesString(&config, &config.program_name, VLCC_PYTHON_EXECUTABLE);
        if (!PyStatus_Exception(status))
            status = Py_InitializeFromConfig(&config);
        PyConfig_Clear(&config);
        if (PyStatus_Exception(status)) {
            snprintf(start_error, ERROR_BYTES, "cannot start Python (%s): %s",
                     VLCC_PYTHON_EXECUTABLE, status.err_msg ? status.err_msg : "error");
            return;
        }
        we_initialised = 1;
        init_thread = pthread_self();
    } else {
        gil = PyGILState_Ensure();
    }
    int rc = import_bridge();
    if (we_initialised) {
        atexit(stop_python);
        PyEval_SaveThread(); /* the GIL is free between calls */
    } else {
        PyGILState_Release(gil);
    }
    if (rc == 0)
        started = 1;
}

/* Start the Python side once; 0 if it is ready. */
static int ready(const char *call)
{
    pthread_once(&start_once, start_python);
    if (!started)
        return fail(start_code, "%s: %s", call, start_error);
    return 0;
}

/* At exit: close every handle left open (pending writes flushed), then
   finalise the interpreter we started, if this is the thread that started it
   (finalising from another thread waits forever for Python's idea of the main
   thread, which may be gone); otherwise leave it to the end of the process. */
static void stop_python(void)
{
    if (!Py_IsInitialized())
        return;
    PyGILState_Ensure();
    for (uint32_t i = 0; i < slot_count; i++) {
        slot_t *s = &slots[i];
        if (s->kind == KIND_FREE)
            continue;
        Py_CLEAR(s->rows);
        PyObject *r = PyObject_CallMethodNoArgs(s->obj, name_close);
        if (r == NULL) {
            python_error("closing a handle left open at exit");
            fprintf(stderr, "vlcc: %s\n", last_error);
        }
        Py_XDECREF(r);
        Py_CLEAR(s->obj);
        s->kind = KIND_FREE;
    }
    if (pthread_equal(pthread_self(), init_thread))
        Py_FinalizeEx();
}

/* -- handles ----------------------------------------------------------------- */

#define HALF (sizeof(uintptr_t) * 4)
#define LOW_MASK (((uintptr_t)1 << HALF) - 1)

static void *encode(uint32_t index, uint32_t generation)
{
    return (void *)(((uintptr_t)generation << HALF) | (uintptr_t)(index + 1));
}

/* GIL held: the slot of handle h if it is open and of this kind, else NULL. */
static slot_t *lookup(const void *h, int kind)
{
    uintptr_t v = (uintptr_t)h;
    uintptr_t low = v & LOW_MASK;
    if (low == 0 || low > slot_count)
        return NULL;
    slot_t *s = &slots[low - 1];
    if (s->kind != kind || (uintptr_t)s->generation != (v >> HALF))
        return NULL;
    return s;
}

/* GIL held: a new slot holding obj (stolen), or NULL (obj released) if out of memory. */
static void *add_slot(int kind, PyObject *obj)
{
    uint32_t index;
    if (free_count > 0) {
        index = free_slots[--free_count];
    } else {
        if (slot_count == slot_capacity) {
            uint32_t capacity = slot_capacity ? 2 * slot_capacity : 16;
            if (capacity >= LOW_MASK) {
                Py_DECREF(obj);
                return NULL;
            }
            slot_t *grown = realloc(slots, capacity * sizeof(slot_t));
            uint32_t *grown_free = realloc(free_slots, capacity * sizeof(uint32_t));
            if (grown != NULL)
                slots = grown;
            if (grown_free != NULL)
                free_slots = grown_free;
            if (grown == NULL || grown_free == NULL) {
                Py_DECREF(obj);
                return NULL;
            }
            slot_capacity = capacity;
        }
        index = slot_count++;
        slots[index].generation = 1;
    }
    slot_t *s = &slots[index];
    s->kind = kind;
    s->state = RUN_OPEN;
    s->obj = obj;
    s->rows = NULL;
    return encode(index, s->generation);
}

/* GIL held: free a slot (its references are dropped). */
static void free_slot(slot_t *s)
{
    Py_CLEAR(s->rows);
    Py_CLEAR(s->obj);
    s->kind = KIND_FREE;
    s->generation = (uint32_t)((s->generation + 1) & LOW_MASK);
    if (s->generation == 0)
        s->generation = 1;
    free_slots[free_count++] = (uint32_t)(s - slots);
}

static int bad_handle(const char *call, const char *what, const void *h)
{
    if (h == NULL)
        return fail(VLCC_E_HANDLE, "%s: %s is NULL; open one first (%s_open)", call, what,
                    strcmp(what, "run") == 0 ? "vlcc_run" : "vlcc_history");
    return fail(VLCC_E_HANDLE,
                "%s: %s is not an open %s handle (closed already, or never opened); "
                "open one with %s_open",
                call, what, what, strcmp(what, "run") == 0 ? "vlcc_run" : "vlcc_history");
}

/* -- shared helpers ---------------------------------------------------------- */

static int check_protect_args(const char *call, const char *name, const char *dtype, int32_t ndim,
                              const int64_t *shape)
{
    if (name == NULL)
        return fail(VLCC_E_ARGUMENT, "%s: name is NULL; pass the region's name", call);
    if (dtype == NULL)
        return fail(VLCC_E_ARGUMENT, "%s: dtype is NULL; pass numpy's name, e.g. \"float64\"",
                    call);
    if (ndim < 0 || ndim > 32)
        return fail(VLCC_E_ARGUMENT,
                    "%s: ndim is %d; a region has 0 (a scalar) to 32 dimensions", call,
                    (int)ndim);
    if (ndim > 0 && shape == NULL)
        return fail(VLCC_E_ARGUMENT, "%s: shape is NULL for ndim %d; pass ndim extents", call,
                    (int)ndim);
    return VLCC_OK;
}

/* GIL held: obj.protect(name, address, dtype, shape). */
static int call_protect(const char *call, PyObject *obj, const char *name, void *data,
                        const char *dtype, int32_t ndim, const int64_t *shape)
{
    PyObject *py_name = PyUnicode_FromString(name);
    PyObject *address = PyLong_FromVoidPtr(data);
    PyObject *py_dtype = PyUnicode_FromString(dtype);
    PyObject *extents = PyTuple_New(ndim);
    PyObject *result = NULL;
    if (py_name && address && py_dtype && extents) {
        int32_t i = 0;
        for (; i < ndim; i++) {
            PyObject *extent = PyLong_FromLongLong((long long)shape[i]);
            if (extent == NULL)
                break;
            PyTuple_SET_ITEM(extents, i, extent);
        }
        if (i == ndim)
            result = PyObject_CallMethodObjArgs(obj, name_protect, py_name, address, py_dtype,
                                                extents, NULL);
    }
    Py_XDECREF(py_name);
    Py_XDECREF(address);
    Py_XDECREF(py_dtype);
    Py_XDECREF(extents);
    if (result == NULL)
        return python_error(call);
    Py_DECREF(result);
    return VLCC_OK;
}

/* GIL held: obj.close() and the slot freed, whatever close says. */
static int close_slot(const char *call, slot_t *s)
{
    Py_CLEAR(s->rows); /* a run's answers first: the machine stops there */
    PyObject *result = PyObject_CallMethodNoArgs(s->obj, name_close);
    int rc = VLCC_OK;
    if (result == NULL)
        rc = python_error(call);
    Py_XDECREF(result);
    free_slot(s);
    return rc;
}

/* Close a run or a history (the handle of `kind`, called `what` in messages). */
static int close_handle(const char *call, void *handle, int kind, const char *what)
{
    if (handle == NULL || !started)
        return bad_handle(call, what, handle);
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc;
    slot_t *s = lookup(handle, kind);
    if (s == NULL)
        rc = bad_handle(call, what, handle);
    else
        rc = close_slot(call, s);
    PyGILState_Release(gil);
    return rc;
}

/* -- runs ---------------------------------------------------------------------- */

int vlcc_run_open(vlcc_run **run, const char *config_json)
{
    static const char call[] = "vlcc_run_open";
    if (run == NULL)
        return fail(VLCC_E_ARGUMENT, "%s: run is NULL; pass the address of a vlcc_run *", call);
    *run = NULL;
    if (config_json == NULL)
        return fail(VLCC_E_ARGUMENT,
                    "%s: config_json is NULL; pass the schedule as JSON, e.g. "
                    "{\"schedule\": {\"kind\": \"revolve\", \"steps\": 1000, \"snapshots\": 10}}",
                    call);
    if (ready(call))
        return start_code;
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = VLCC_OK;
    PyObject *text = PyUnicode_FromString(config_json);
    PyObject *obj = text ? PyObject_CallOneArg(bridge_open_run, text) : NULL;
    Py_XDECREF(text);
    if (obj == NULL) {
        rc = python_error(call);
    } else {
        void *handle = add_slot(KIND_RUN, obj);
        if (handle == NULL)
            rc = fail(VLCC_E_INTERNAL, "%s: out of memory for a handle", call);
        else
            *run = (vlcc_run *)handle;
    }
    PyGILState_Release(gil);
    return rc;
}

/* Protect a region of a run's or a history's state (the handle of `kind`). */
static int protect_region(const char *call, void *handle, int kind, const char *what,
                          const char *name, void *data, const char *dtype, int32_t ndim,
                          const int64_t *shape)
{
    if (handle == NULL || !started)
        return bad_handle(call, what, handle);
    int rc = check_protect_args(call, name, dtype, ndim, shape);
    if (rc != VLCC_OK)
        return rc;
    PyGILState_STATE gil = PyGILState_Ensure();
    slot_t *s = lookup(handle, kind);
    if (s == NULL)
        rc = bad_handle(call, what, handle);
    else
        rc = call_protect(call, s->obj, name, data, dtype, ndim, shape);
    PyGILState_Release(gil);
    return rc;
}

int vlcc_run_protect(vlcc_run *run, const char *name, void *data, const char *dtype,
                     int32_t ndim, const int64_t *shape)
{
    return protect_region("vlcc_run_protect", run, KIND_RUN, "run", name, data, dtype, ndim,
                          shape);
}

/* GIL held: the next answer of a started run into *action. */
static int next_answer(const char *call, slot_t *s, vlcc_action *action)
{
    PyObject *row = PyIter_Next(s->rows);
    if (row == NULL) {
        Py_CLEAR(s->rows);
        if (PyErr_Occurred()) {
            s->state = RUN_FAILED;
            return python_error(call);
        }
        s->state = RUN_DONE;
        action->kind = VLCC_DONE;
        action->from = action->to = 0;
        return VLCC_OK;
    }
    int rc = VLCC_OK;
    if (PyTuple_CheckExact(row) && PyTuple_GET_SIZE(row) == 3) {
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(row, 0));
        long long from = PyLong_AsLongLong(PyTuple_GET_ITEM(row, 1));
        long long to = PyLong_AsLongLong(PyTuple_GET_ITEM(row, 2));
        if (PyErr_Occurred()) {
            rc = python_error(call);
        } else {
            action->kind = (int32_t)kind;
            action->from = (int64_t)from;
            action->to = (int64_t)to;
        }
    } else {
        rc = fail(VLCC_E_INTERNAL, "%s: the run answered something else than (kind, from, to)",
                  call);
    }
    Py_DECREF(row);
    if (rc != VLCC_OK) {
        s->state = RUN_FAILED;
        Py_CLEAR(s->rows);
    }
    return rc;
}

int vlcc_run_next(vlcc_run *run, vlcc_action *action)
{
    static const char call[] = "vlcc_run_next";
    if (action == NULL)
        return fail(VLCC_E_ARGUMENT, "%s: action is NULL; pass the address of a vlcc_action",
                    call);
    if (run == NULL || !started)
        return bad_handle(call, "run", run);
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc;
    slot_t *s = lookup(run, KIND_RUN);
    if (s == NULL) {
        rc = bad_handle(call, "run", run);
    } else if (s->state == RUN_RUNNING) {
        rc = next_answer(call, s, action);
    } else if (s->state == RUN_OPEN) {
        s->rows = PyObject_CallMethodNoArgs(s->obj, name_actions);
        if (s->rows == NULL) {
            rc = python_error(call); /* still open: e.g. protect, then next again */
        } else {
            s->state = RUN_RUNNING;
            rc = next_answer(call, s, action);
        }
    } else if (s->state == RUN_DONE) {
        rc = fail(VLCC_E_STATE,
                  "%s: the run is over (it answered VLCC_DONE); close it with vlcc_run_close",
                  call);
    } else {
        rc = fail(VLCC_E_STATE,
                  "%s: an earlier vlcc_run_next of this run failed (its message said why) and "
                  "the run cannot go on; close it with vlcc_run_close",
                  call);
    }
    PyGILState_Release(gil);
    return rc;
}

int vlcc_run_close(vlcc_run *run)
{
    return close_handle("vlcc_run_close", run, KIND_RUN, "run");
}

/* -- histories ----------------------------------------------------------------- */

int vlcc_history_open(vlcc_history **h, const char *path, const char *mode)
{
    static const char call[] = "vlcc_history_open";
    if (h == NULL)
        return fail(VLCC_E_ARGUMENT, "%s: h is NULL; pass the address of a vlcc_history *",
                    call);
    *h = NULL;
    if (path == NULL)
        return fail(VLCC_E_ARGUMENT, "%s: path is NULL; pass the history's directory", call);
    if (mode == NULL)
        return fail(VLCC_E_ARGUMENT, "%s: mode is NULL; pass \"r\", \"a\" or \"w\"", call);
    if (ready(call))
        return start_code;
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = VLCC_OK;
    PyObject *py_path = PyUnicode_DecodeFSDefault(path);
    PyObject *py_mode = PyUnicode_FromString(mode);
    PyObject *obj = NULL;
    if (py_path && py_mode)
        obj = PyObject_CallFunctionObjArgs(bridge_open_history, py_path, py_mode, NULL);
    Py_XDECREF(py_path);
    Py_XDECREF(py_mode);
    if (obj == NULL) {
        rc = python_error(call);
    } else {
        void *handle = add_slot(KIND_HISTORY, obj);
        if (handle == NULL)
            rc = fail(VLCC_E_INTERNAL, "%s: out of memory for a handle", call);
        else
            *h = (vlcc_history *)handle;
    }
    PyGILState_Release(gil);
    return rc;
}

int vlcc_history_protect(vlcc_history *h, const char *name, void *data, const char *dtype,
                         int32_t ndim, const int64_t *shape)
{
    return protect_region("vlcc_history_protect", h, KIND_HISTORY, "history", name, data, dtype,
                          ndim, shape);
}

int vlcc_history_commit(vlcc_history *h, const char *branch, const char *message,
                        char *version, size_t version_size)
{
    static const char call[] = "vlcc_history_commit";
    if (h == NULL || !started)
        return bad_handle(call, "history", h);
    if (version != NULL && version_size == 0)
        return fail(VLCC_E_ARGUMENT,
                    "%s: version_size is 0; pass a buffer of VLCC_VERSION_SIZE bytes (or "
                    "version NULL)",
                    call);
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = VLCC_OK;
    slot_t *s = lookup(h, KIND_HISTORY);
    if (s == NULL) {
        rc = bad_handle(call, "history", h);
    } else {
        PyObject *py_branch = branch ? PyUnicode_FromString(branch) : Py_NewRef(Py_None);
        PyObject *py_message = PyUnicode_FromString(message ? message : "");
        PyObject *size = PyLong_FromSize_t(version ? version_size : VLCC_VERSION_SIZE);
        PyObject *id = NULL;
        if (py_branch && py_message && size)
            id = PyObject_CallMethodObjArgs(s->obj, name_commit, py_branch, py_message, size,
                                            NULL);
        Py_XDECREF(py_branch);
        Py_XDECREF(py_message);
        Py_XDECREF(size);
        const char *text = id ? PyUnicode_AsUTF8(id) : NULL;
        if (text == NULL) {
            rc = python_error(call);
        } else if (version != NULL) {
            size_t n = strlen(text);
            if (n >= version_size)
                n = version_size - 1; /* the Python side checked that it fits */
            memcpy(version, text, n);
            version[n] = '\0';
        }
        Py_XDECREF(id);
    }
    PyGILState_Release(gil);
    return rc;
}

int vlcc_history_checkout(vlcc_history *h, const char *ref)
{
    static const char call[] = "vlcc_history_checkout";
    if (h == NULL || !started)
        return bad_handle(call, "history", h);
    if (ref == NULL)
        return fail(VLCC_E_ARGUMENT,
                    "%s: ref is NULL; pass a version id, a branch, a tag or \"HEAD\"", call);
    PyGILState_STATE gil = PyGILState_Ensure();
    int rc = VLCC_OK;
    slot_t *s = lookup(h, KIND_HISTORY);
    if (s == NULL) {
        rc = bad_handle(call, "history", h);
    } else {
        PyObject *py_ref = PyUnicode_FromString(ref);
        PyObject *result =
            py_ref ? PyObject_CallMethodObjArgs(s->obj, name_checkout, py_ref, NULL) : NULL;
        Py_XDECREF(py_ref);
        if (result == NULL)
            rc = python_error(call);
        Py_XDECREF(result);
    }
    PyGILState_Release(gil);
    return rc;
}

int vlcc_history_close(vlcc_history *h)
{
    return close_handle("vlcc_history_close", h, KIND_HISTORY, "history");
}
