/*
 * The per-entry path of detection_section, in C.
 *
 * sections.py defines what an entry does (EntryCounter, SectionHandle and
 * SectionRegistry.enter); this module is an accelerator of exactly that definition,
 * used wherever it is built, and tests/test_hotpath_parity.py runs the same scripted
 * entries through both and compares everything observable. Here the dispatcher finds
 * the section's handle in a dict and checks the call site, and the handle counts the
 * entry and, for one entry in every profiling_interval, reads CLOCK_MONOTONIC itself.
 * Everything that is not per entry (creating sections, a new call site, errors) is
 * delegated to Python callables.
 *
 * Each object owns its state: the entry count of a section lives in a Counter (read
 * by CustomSection.total_entry_cnt through Counter.value); nothing here writes into
 * a Python object's memory.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>
#include <stddef.h>
#include <math.h>
#include <time.h>

static PyObject *str_start;
static PyObject *str_stop;
static PyObject *str_counter;
static PyObject *str_cpu_elapsed_times;
static PyObject *str_append;
static PyObject *str_code;
static PyObject *str_lasti;
static PyObject *str_name;
static PyObject *str_profile_cuda;

static long long
monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + (long long)ts.tv_nsec;
}

/* ---- Counter: the entry count of one section ---------------------------------- */

typedef struct {
    PyObject_HEAD
    long long value;
} Counter;

static int
Counter_init(Counter *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"value", NULL};
    long long value = 0;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|L:Counter", kwlist, &value)) {
        return -1;
    }
    if (value < 0) {
        PyErr_Format(PyExc_ValueError, "Counter: value must be >= 0, got %lld", value);
        return -1;
    }
    self->value = value;
    return 0;
}

static PyObject *
Counter_get_value(Counter *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(self->value);
}

static int
Counter_set_value(Counter *self, PyObject *value, void *Py_UNUSED(closure))
{
    long long v;

    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "Counter.value cannot be deleted");
        return -1;
    }
    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "Counter.value must be an int, not %.100s",
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (v < 0) {
        PyErr_Format(PyExc_ValueError, "Counter.value must be >= 0, got %lld", v);
        return -1;
    }
    self->value = v;
    return 0;
}

static PyGetSetDef Counter_getset[] = {
    {"value", (getter)Counter_get_value, (setter)Counter_set_value,
     "Entries counted so far.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CounterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "nvrx.straggler._hotpath.Counter",
    .tp_doc = "Counter(value=0)\n--\n\nThe entry count of one section (EntryCounter in C).",
    .tp_basicsize = sizeof(Counter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Counter_init,
    .tp_getset = Counter_getset,
};

/* ---- Handle: the context manager of one section ------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *section;     /* CustomSection */
    Counter *counter;      /* section.counter */
    PyObject *code;        /* code object of the first call site; None: no site checks */
    PyObject *accepted;    /* set of (file, code, lasti) call sites accepted */
    PyObject *append;      /* section.cpu_elapsed_times.append */
    PyObject *timer;       /* KernelTimer switched on for measured entries, or NULL */
    PyObject *bound_enter; /* __enter__ and __exit__ bound to this handle once */
    PyObject *bound_exit;
    long long interval;
    long long t0;          /* clock at the measured outermost entry; 0 when none */
    long long nested;      /* entries of this handle inside the measured one */
    int lasti;
} Handle;

static PyTypeObject HandleType;

static int
Handle_init(Handle *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"section", "interval", "code", "lasti", "timer", NULL};
    PyObject *section, *code, *timer = Py_None, *counter, *samples, *append, *site, *accepted;
    long long interval;
    int lasti;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OLOi|O:Handle", kwlist, &section,
                                     &interval, &code, &lasti, &timer)) {
        return -1;
    }
    if (interval < 1) {
        PyErr_Format(PyExc_ValueError, "Handle: interval must be >= 1, got %lld", interval);
        return -1;
    }
    if (!PyCode_Check(code)) {
        PyErr_Format(PyExc_TypeError, "Handle: code must be a code object, not %.100s",
                     Py_TYPE(code)->tp_name);
        return -1;
    }
    counter = PyObject_GetAttr(section, str_counter);
    if (counter == NULL) {
        return -1;
    }
    if (!Py_IS_TYPE(counter, &CounterType)) {
        PyErr_Format(PyExc_TypeError, "Handle: section.counter must be a %s, not %.100s",
                     CounterType.tp_name, Py_TYPE(counter)->tp_name);
        Py_DECREF(counter);
        return -1;
    }
    samples = PyObject_GetAttr(section, str_cpu_elapsed_times);
    append = samples == NULL ? NULL : PyObject_GetAttr(samples, str_append);
    Py_XDECREF(samples);
    if (append == NULL) {
        Py_DECREF(counter);
        return -1;
    }
    site = Py_BuildValue("(OOi)", ((PyCodeObject *)code)->co_filename, code, lasti);
    accepted = site == NULL ? NULL : PySet_New(NULL);
    if (accepted == NULL || PySet_Add(accepted, site) < 0) {
        Py_XDECREF(site);
        Py_XDECREF(accepted);
        Py_DECREF(append);
        Py_DECREF(counter);
        return -1;
    }
    Py_DECREF(site);

    Py_XSETREF(self->section, Py_NewRef(section));
    Py_XSETREF(self->counter, (Counter *)counter);
    Py_XSETREF(self->code, Py_NewRef(code));
    Py_XSETREF(self->accepted, accepted);
    Py_XSETREF(self->append, append);
    if (timer == Py_None) {
        Py_CLEAR(self->timer);
    }
    else {
        Py_XSETREF(self->timer, Py_NewRef(timer));
    }
    self->interval = interval;
    self->lasti = lasti;
    self->t0 = 0;
    self->nested = 0;
    return 0;
}

static int
require_init(Handle *self)
{
    if (self->section == NULL) {
        PyErr_SetString(PyExc_TypeError, "Handle is not initialised");
        return -1;
    }
    return 0;
}

static PyObject *
Handle_enter(Handle *self, PyObject *Py_UNUSED(ignored))
{
    long long n;

    if (require_init(self) < 0) {
        return NULL;
    }
    n = self->counter->value;
    if (n == LLONG_MAX) {
        PyErr_SetString(PyExc_OverflowError, "the entry count would overflow");
        return NULL;
    }
    self->counter->value = n + 1;
    if (self->t0) {
        self->nested++;
    }
    else if (n % self->interval == 0) {
        if (self->timer != NULL) {
            PyObject *timer = Py_NewRef(self->timer);
            PyObject *res = PyObject_CallMethodNoArgs(timer, str_start);
            Py_DECREF(timer);
            if (res == NULL) {
                return NULL;
            }
            Py_DECREF(res);
        }
        self->t0 = monotonic_ns();
    }
    Py_RETURN_NONE;
}

/* Switch the kernel timer off. If that fails too, its error is raised with the first
 * one as its context, as a `finally:` clause in Python would do. */
static int
stop_timer(PyObject *timer, int failed)
{
    PyObject *first_type = NULL, *first = NULL, *first_tb = NULL, *res;

    if (failed) {
        PyErr_Fetch(&first_type, &first, &first_tb);
        PyErr_NormalizeException(&first_type, &first, &first_tb);
        if (first != NULL && first_tb != NULL) {
            PyException_SetTraceback(first, first_tb);
        }
    }
    res = PyObject_CallMethodNoArgs(timer, str_stop);
    if (res != NULL) {
        Py_DECREF(res);
        if (failed) {
            PyErr_Restore(first_type, first, first_tb);
        }
        return failed ? -1 : 0;
    }
    if (failed) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (value != NULL && first != NULL) {
            PyException_SetContext(value, Py_NewRef(first));
        }
        PyErr_Restore(type, value, tb);
        Py_XDECREF(first_type);
        Py_XDECREF(first);
        Py_XDECREF(first_tb);
    }
    return -1;
}

static PyObject *
Handle_exit(Handle *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long t0;
    int failed = 0;

    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "__exit__ expected 3 arguments, got %zd", nargs);
        return NULL;
    }
    if (require_init(self) < 0) {
        return NULL;
    }
    if (self->nested) {
        self->nested--;
        Py_RETURN_NONE;
    }
    t0 = self->t0;
    if (!t0) {
        Py_RETURN_NONE;
    }
    self->t0 = 0;
    if (args[0] == Py_None) {
        PyObject *append = Py_NewRef(self->append);
        PyObject *ms = PyFloat_FromDouble((double)(monotonic_ns() - t0) * 1e-6);
        PyObject *res = ms == NULL ? NULL : PyObject_CallOneArg(append, ms);
        Py_DECREF(append);
        Py_XDECREF(ms);
        Py_XDECREF(res);
        failed = res == NULL;
    }
    if (self->timer != NULL) {
        PyObject *timer = Py_NewRef(self->timer);
        failed = stop_timer(timer, failed) < 0;
        Py_DECREF(timer);
    }
    if (failed) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static int
Handle_traverse(Handle *self, visitproc visit, void *arg)
{
    Py_VISIT(self->section);
    Py_VISIT(self->counter);
    Py_VISIT(self->code);
    Py_VISIT(self->accepted);
    Py_VISIT(self->append);
    Py_VISIT(self->timer);
    Py_VISIT(self->bound_enter);
    Py_VISIT(self->bound_exit);
    return 0;
}

static int
Handle_clear(Handle *self)
{
    Py_CLEAR(self->section);
    Py_CLEAR(self->counter);
    Py_CLEAR(self->code);
    Py_CLEAR(self->accepted);
    Py_CLEAR(self->append);
    Py_CLEAR(self->timer);
    Py_CLEAR(self->bound_enter);
    Py_CLEAR(self->bound_exit);
    return 0;
}

static void
Handle_dealloc(Handle *self)
{
    PyObject_GC_UnTrack(self);
    Handle_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/*
 * `with handle:` looks __enter__ and __exit__ up on the handle's type and calls the
 * descriptor found there. A method descriptor would bind a new method object on every
 * entry (two allocations per `with`, more than everything else the handle does).
 * Here they are getset descriptors that return functions bound to the handle once,
 * when it was made (the cycle handle -> bound function -> handle is visited by the GC).
 * This is the plain descriptor protocol on one static type.
 */
static PyMethodDef enter_def = {"__enter__", (PyCFunction)Handle_enter, METH_NOARGS,
                                "Count the entry; time it if sampled."};
static PyMethodDef exit_def = {"__exit__", (PyCFunction)(void (*)(void))Handle_exit,
                               METH_FASTCALL, "Record the sampled entry's time unless it raised."};

static PyObject *
Handle_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Handle *self = (Handle *)type->tp_alloc(type, 0);

    if (self == NULL) {
        return NULL;
    }
    self->bound_enter = PyCFunction_New(&enter_def, (PyObject *)self);
    self->bound_exit = self->bound_enter == NULL ? NULL
                                                 : PyCFunction_New(&exit_def, (PyObject *)self);
    if (self->bound_exit == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyObject *
bound(Handle *self, PyObject *fn, PyMethodDef *def)
{
    /* Only NULL after a GC clear: bind afresh rather than fail. */
    return fn != NULL ? Py_NewRef(fn) : PyCFunction_New(def, (PyObject *)self);
}

static PyObject *
Handle_get_enter(Handle *self, void *Py_UNUSED(closure))
{
    return bound(self, self->bound_enter, &enter_def);
}

static PyObject *
Handle_get_exit(Handle *self, void *Py_UNUSED(closure))
{
    return bound(self, self->bound_exit, &exit_def);
}

static PyObject *
Handle_get_timer(Handle *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->timer == NULL ? Py_None : self->timer);
}

static PyObject *
Handle_get_measuring(Handle *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->t0 != 0);
}

static PyObject *
Handle_get_code(Handle *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->code == NULL ? Py_None : self->code);
}

static int
Handle_set_code(Handle *self, PyObject *value, void *Py_UNUSED(closure))
{
    if (value == NULL || (value != Py_None && !PyCode_Check(value))) {
        PyErr_SetString(PyExc_TypeError, "Handle.code must be a code object or None");
        return -1;
    }
    Py_XSETREF(self->code, Py_NewRef(value));
    return 0;
}

static PyMemberDef Handle_members[] = {
    {"section", T_OBJECT, offsetof(Handle, section), READONLY, "The CustomSection timed."},
    {"lasti", T_INT, offsetof(Handle, lasti), READONLY, "Instruction offset of that call site."},
    {"accepted", T_OBJECT, offsetof(Handle, accepted), READONLY,
     "Call sites accepted for this name: (file, code, lasti)."},
    {"_nested", T_LONGLONG, offsetof(Handle, nested), READONLY,
     "Entries inside the measured one."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Handle_getset[] = {
    {"__enter__", (getter)Handle_get_enter, NULL, "Count the entry; time it if sampled.", NULL},
    {"__exit__", (getter)Handle_get_exit, NULL, "Record the sampled entry's time unless it raised.",
     NULL},
    {"code", (getter)Handle_get_code, (setter)Handle_set_code,
     "Code object of the first call site; None once call sites are no longer checked.", NULL},
    {"timer", (getter)Handle_get_timer, NULL, "The kernel timer of measured entries, or None.",
     NULL},
    {"measuring", (getter)Handle_get_measuring, NULL, "True inside a measured entry.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "nvrx.straggler._hotpath.Handle",
    .tp_doc = "Handle(section, interval, code, lasti, timer=None)\n--\n\n"
              "The context manager of one section (SectionHandle in C).",
    .tp_basicsize = sizeof(Handle),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Handle_new,
    .tp_init = (initproc)Handle_init,
    .tp_dealloc = (destructor)Handle_dealloc,
    .tp_traverse = (traverseproc)Handle_traverse,
    .tp_clear = (inquiry)Handle_clear,
    .tp_members = Handle_members,
    .tp_getset = Handle_getset,
};

/* ---- Dispatcher: detection_section(name=None, profile_cuda=True) ----------------- */

typedef struct {
    PyObject_HEAD
    PyObject *cpu_handles;    /* dict: name -> handle, profile_cuda false */
    PyObject *kernel_handles; /* dict: name -> handle, profile_cuda true */
    PyObject *anonymous;      /* dict: (code, lasti, profile_cuda) -> handle, name None */
    PyObject *miss;           /* miss(name, profile_cuda, frame) -> handle */
    PyObject *moved;          /* moved(handle, frame): a call site not seen before */
    vectorcallfunc vectorcall;
} Dispatcher;

static int
frame_lasti(PyFrameObject *frame)
{
#if PY_VERSION_HEX >= 0x030B0000
    return PyFrame_GetLasti(frame);
#else
    return frame->f_lasti < 0 ? -1 : frame->f_lasti * (int)sizeof(_Py_CODEUNIT);
#endif
}

/* 1 if `handle` was made for this call site, 0 if not, -1 on error. */
static int
same_site(PyObject *handle, PyFrameObject *frame)
{
    PyCodeObject *code = PyFrame_GetCode(frame);
    int lasti = frame_lasti(frame);
    int same;

    if (Py_IS_TYPE(handle, &HandleType)) {
        Handle *h = (Handle *)handle;
        same = h->code == Py_None || ((PyObject *)code == h->code && lasti == h->lasti);
    }
    else {
        /* A handle written in Python (CUDA event timing): same attributes. */
        PyObject *want_code = PyObject_GetAttr(handle, str_code);
        PyObject *want_lasti = want_code == NULL ? NULL : PyObject_GetAttr(handle, str_lasti);
        same = -1;
        if (want_lasti != NULL) {
            long value = PyLong_AsLong(want_lasti);
            same = (value == -1 && PyErr_Occurred())
                       ? -1
                       : (want_code == Py_None ||
                          (want_code == (PyObject *)code && value == lasti));
        }
        Py_XDECREF(want_code);
        Py_XDECREF(want_lasti);
    }
    Py_DECREF(code);
    return same;
}

static PyObject *
Dispatcher_call(Dispatcher *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *name = nargs > 0 ? args[0] : NULL;
    PyObject *profile_cuda = nargs > 1 ? args[1] : NULL;
    PyObject *handle, *result;
    PyFrameObject *frame;
    int cuda, same;

    if (nargs > 2) {
        PyErr_Format(PyExc_TypeError,
                     "detection_section() takes at most 2 positional arguments (%zd given)",
                     nargs);
        return NULL;
    }
    if (kwnames != NULL) {
        Py_ssize_t i, n = PyTuple_GET_SIZE(kwnames);
        for (i = 0; i < n; i++) {
            PyObject *key = PyTuple_GET_ITEM(kwnames, i);
            PyObject **target;
            if (PyUnicode_Compare(key, str_profile_cuda) == 0) {
                target = &profile_cuda;
            }
            else if (PyUnicode_Compare(key, str_name) == 0) {
                target = &name;
            }
            else {
                if (!PyErr_Occurred()) {
                    PyErr_Format(PyExc_TypeError,
                                 "detection_section() got an unexpected keyword argument %R",
                                 key);
                }
                return NULL;
            }
            if (*target != NULL) {
                PyErr_Format(PyExc_TypeError,
                             "detection_section() got multiple values for argument %R", key);
                return NULL;
            }
            *target = args[nargs + i];
        }
    }
    if (name == NULL) {
        name = Py_None;
    }
    if (profile_cuda == NULL) {
        profile_cuda = Py_True;
    }
    cuda = PyObject_IsTrue(profile_cuda);
    if (cuda < 0) {
        return NULL;
    }
    frame = PyEval_GetFrame();
    if (frame == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "detection_section() needs a calling Python frame");
        return NULL;
    }
    if (name == Py_None) {
        /* A section named after its call site: the site is the key. */
        PyCodeObject *code = PyFrame_GetCode(frame);
        /* Code objects of different files can compare equal: the file is in the key. */
        PyObject *key = Py_BuildValue("(ONiO)", code->co_filename, code, frame_lasti(frame),
                                      cuda ? Py_True : Py_False);
        if (key == NULL) {
            return NULL;
        }
        handle = PyDict_GetItemWithError(self->anonymous, key);
        Py_XINCREF(handle);
        Py_DECREF(key);
        if (handle != NULL) {
            return handle;
        }
    }
    else {
        handle = PyDict_GetItemWithError(cuda ? self->kernel_handles : self->cpu_handles, name);
    }
    if (handle == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        PyObject *miss = Py_NewRef(self->miss);
        result = PyObject_CallFunctionObjArgs(miss, name, profile_cuda, (PyObject *)frame, NULL);
        Py_DECREF(miss);
        return result;
    }
    Py_INCREF(handle);
    same = same_site(handle, frame);
    if (same == 1) {
        return handle;
    }
    if (same == 0) {
        PyObject *moved = Py_NewRef(self->moved);
        result = PyObject_CallFunctionObjArgs(moved, handle, (PyObject *)frame, NULL);
        Py_DECREF(moved);
    }
    else {
        result = NULL;
    }
    if (result == NULL) {
        Py_DECREF(handle);
        return NULL;
    }
    Py_DECREF(result);
    return handle;
}

static int
Dispatcher_init(Dispatcher *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"cpu_handles", "kernel_handles", "anonymous", "miss", "moved", NULL};
    PyObject *cpu, *kernel, *anonymous, *miss, *moved;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O!OO:Dispatcher", kwlist, &PyDict_Type,
                                     &cpu, &PyDict_Type, &kernel, &PyDict_Type, &anonymous,
                                     &miss, &moved)) {
        return -1;
    }
    if (!PyDict_CheckExact(cpu) || !PyDict_CheckExact(kernel) || !PyDict_CheckExact(anonymous)) {
        PyErr_SetString(PyExc_TypeError, "Dispatcher: the handle maps must be plain dicts");
        return -1;
    }
    if (!PyCallable_Check(miss) || !PyCallable_Check(moved)) {
        PyErr_SetString(PyExc_TypeError, "Dispatcher: miss and moved must be callable");
        return -1;
    }
    Py_INCREF(cpu);
    Py_XSETREF(self->cpu_handles, cpu);
    Py_INCREF(kernel);
    Py_XSETREF(self->kernel_handles, kernel);
    Py_INCREF(anonymous);
    Py_XSETREF(self->anonymous, anonymous);
    Py_INCREF(miss);
    Py_XSETREF(self->miss, miss);
    Py_INCREF(moved);
    Py_XSETREF(self->moved, moved);
    self->vectorcall = (vectorcallfunc)Dispatcher_call;
    return 0;
}

static PyObject *
Dispatcher_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Dispatcher *self = (Dispatcher *)PyType_GenericNew(type, args, kwds);
    if (self != NULL) {
        /* Calling an object whose __init__ has not run raises, not crashes. */
        self->vectorcall = NULL;
    }
    return (PyObject *)self;
}

static PyObject *
Dispatcher_tp_call(Dispatcher *self, PyObject *args, PyObject *kwargs)
{
    if (self->vectorcall == NULL) {
        PyErr_SetString(PyExc_TypeError, "Dispatcher is not initialised");
        return NULL;
    }
    return PyVectorcall_Call((PyObject *)self, args, kwargs);
}

static int
Dispatcher_traverse(Dispatcher *self, visitproc visit, void *arg)
{
    Py_VISIT(self->cpu_handles);
    Py_VISIT(self->kernel_handles);
    Py_VISIT(self->anonymous);
    Py_VISIT(self->miss);
    Py_VISIT(self->moved);
    return 0;
}

static int
Dispatcher_clear(Dispatcher *self)
{
    self->vectorcall = NULL; /* a call after a GC clear raises instead of crashing */
    Py_CLEAR(self->cpu_handles);
    Py_CLEAR(self->kernel_handles);
    Py_CLEAR(self->anonymous);
    Py_CLEAR(self->miss);
    Py_CLEAR(self->moved);
    return 0;
}

static void
Dispatcher_dealloc(Dispatcher *self)
{
    PyObject_GC_UnTrack(self);
    Dispatcher_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject DispatcherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "nvrx.straggler._hotpath.Dispatcher",
    .tp_doc = "Dispatcher(cpu_handles, kernel_handles, anonymous, miss, moved)\n--\n\n"
              "detection_section(name=None, profile_cuda=True): the handle for this call "
              "site, from a dict lookup; everything else goes to miss or moved.",
    .tp_basicsize = sizeof(Dispatcher),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = Dispatcher_new,
    .tp_init = (initproc)Dispatcher_init,
    .tp_call = (ternaryfunc)Dispatcher_tp_call,
    .tp_vectorcall_offset = offsetof(Dispatcher, vectorcall),
    .tp_dealloc = (destructor)Dispatcher_dealloc,
    .tp_traverse = (traverseproc)Dispatcher_traverse,
    .tp_clear = (inquiry)Dispatcher_clear,
};

/* ---- summarize: the statistics of one window (statistics.summarize in C) ------- */

/* Neumaier's compensated sum: within an ulp or two of math.fsum for timing data. */
typedef struct {
    double sum;
    double comp;
} Sum;

static void
sum_add(Sum *s, double x)
{
    double t = s->sum + x;
    if (fabs(s->sum) >= fabs(x)) {
        s->comp += (s->sum - t) + x;
    }
    else {
        s->comp += (x - t) + s->sum;
    }
    s->sum = t;
}

/* Rearrange v[0..n) so that v[k] is the k-th smallest and v[0..k) are not larger. */
static void
select_kth(double *v, Py_ssize_t n, Py_ssize_t k)
{
    Py_ssize_t lo = 0, hi = n - 1;
    while (lo < hi) {
        double pivot = v[lo + (hi - lo) / 2];
        Py_ssize_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] < pivot) {
                i++;
            }
            while (v[j] > pivot) {
                j--;
            }
            if (i <= j) {
                double t = v[i];
                v[i] = v[j];
                v[j] = t;
                i++;
                j--;
            }
        }
        if (k <= j) {
            hi = j;
        }
        else if (k >= i) {
            lo = i;
        }
        else {
            return;
        }
    }
}

static PyObject *
summarize(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *seq, *result = NULL;
    Py_ssize_t n, i, count, half;
    double *v, lo, hi, median, mean;
    Sum total = {0.0, 0.0}, squares = {0.0, 0.0};

    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "summarize expected 2 arguments, got %zd", nargs);
        return NULL;
    }
    seq = PySequence_Fast(args[0], "summarize: samples must be iterable");
    if (seq == NULL) {
        return NULL;
    }
    n = PySequence_Fast_GET_SIZE(seq);
    if (n == 0) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError,
                        "summarize: samples is empty; a window needs at least one sample");
        return NULL;
    }
    if (args[1] == Py_None) {
        count = n;
    }
    else {
        count = PyLong_AsSsize_t(args[1]);
        if (count == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
        if (count < n) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError,
                         "summarize: count=%zd is below the number of samples (%zd)", count, n);
            return NULL;
        }
    }
    v = PyMem_Malloc((size_t)n * sizeof(double));
    if (v == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    lo = hi = 0.0;
    for (i = 0; i < n; i++) {
        double x = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (x == -1.0 && PyErr_Occurred()) {
            goto done;
        }
        v[i] = x;
        if (i == 0 || x < lo) {
            lo = x;
        }
        if (i == 0 || x > hi) {
            hi = x;
        }
        sum_add(&total, x);
    }
    mean = (total.sum + total.comp) / (double)n;
    for (i = 0; i < n; i++) {
        double d = v[i] - mean;
        sum_add(&squares, d * d);
    }
    half = n / 2;
    select_kth(v, n, half);
    median = v[half];
    if (n % 2 == 0) {
        double below = v[0];
        for (i = 1; i < half; i++) {
            if (v[i] > below) {
                below = v[i];
            }
        }
        median = (below + median) / 2.0;
    }
    result = Py_BuildValue("(dddddd)", lo, hi, median, mean,
                           sqrt((squares.sum + squares.comp) / (double)n), (double)count);
done:
    PyMem_Free(v);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef module_methods[] = {
    {"summarize", (PyCFunction)(void (*)(void))summarize, METH_FASTCALL,
     "summarize(samples, count) -> (min, max, median, mean, population std, count)\n\n"
     "nvrx.straggler.statistics.summarize in C."},
    {NULL, NULL, 0, NULL},
};

/* ---- module --------------------------------------------------------------------- */

static int
intern_all(void)
{
    str_start = PyUnicode_InternFromString("start");
    str_stop = PyUnicode_InternFromString("stop");
    str_counter = PyUnicode_InternFromString("counter");
    str_cpu_elapsed_times = PyUnicode_InternFromString("cpu_elapsed_times");
    str_append = PyUnicode_InternFromString("append");
    str_code = PyUnicode_InternFromString("code");
    str_lasti = PyUnicode_InternFromString("lasti");
    str_name = PyUnicode_InternFromString("name");
    str_profile_cuda = PyUnicode_InternFromString("profile_cuda");
    return (str_start && str_stop && str_counter && str_cpu_elapsed_times && str_append &&
            str_code && str_lasti && str_name && str_profile_cuda)
               ? 0
               : -1;
}

static int
add_type(PyObject *module, const char *name, PyTypeObject *type)
{
    Py_INCREF(type);
    if (PyModule_AddObject(module, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

static struct PyModuleDef hotpath_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "nvrx.straggler._hotpath",
    .m_doc = "detection_section's per-entry path and window statistics in C (see sections.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    PyObject *module;

    if (intern_all() < 0 || PyType_Ready(&CounterType) < 0 || PyType_Ready(&HandleType) < 0 ||
        PyType_Ready(&DispatcherType) < 0) {
        return NULL;
    }
    module = PyModule_Create(&hotpath_module);
    if (module == NULL) {
        return NULL;
    }
    if (add_type(module, "Counter", &CounterType) < 0 ||
        add_type(module, "Handle", &HandleType) < 0 ||
        add_type(module, "Dispatcher", &DispatcherType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
