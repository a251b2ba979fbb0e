/*
 * The per-entry path of detection_section, in C.
 *
 * A `with detector.detection_section(name):` costs one call and two method calls per
 * entry. In Python each of those is a frame, and reading the clock from Python is a
 * call too; here the dispatcher finds the section's handle in a dict and checks the
 * call site, and the handle counts the entry and, for one entry in every
 * profiling_interval, reads CLOCK_MONOTONIC itself.
 *
 * The behaviour is that of SectionHandle and StragglerDetector.detection_section in
 * sections.py and detector.py, which remain the implementation wherever this module
 * is not built; the test suite runs against both. Everything that is not per entry
 * (creating sections, a new call site, errors) is delegated to Python callables.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>
#include <stddef.h>
#include <time.h>

static PyObject *str_start;
static PyObject *str_stop;
static PyObject *str_total_entry_cnt;
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

/* ---- Handle: the context manager of one section ------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *section;      /* CustomSection */
    PyObject *code;         /* code object of the first call site */
    PyObject *accepted;     /* set of (code, lasti) call sites accepted for this name */
    PyObject *append;       /* section.cpu_elapsed_times.append */
    PyObject *timer;        /* KernelTimer switched on for measured entries, or NULL */
    Py_ssize_t count_offset; /* where the section's total_entry_cnt slot lives */
    long long interval;
    long long t0;           /* clock at the measured outermost entry; 0 when none */
    long long nested;       /* entries of this handle inside the measured one */
    int lasti;
} Handle;

static PyTypeObject HandleType;

/* The byte offset of a slots class's writable object attribute `name`. */
static Py_ssize_t
slot_offset(PyObject *obj, PyObject *name)
{
    PyObject *descr = PyObject_GetAttr((PyObject *)Py_TYPE(obj), name);
    Py_ssize_t offset = -1;
    if (descr == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear();
    }
    else if (Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
             PyObject_TypeCheck(obj, PyDescr_TYPE(descr))) {
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type == T_OBJECT_EX && !(member->flags & READONLY)) {
            offset = member->offset;
        }
    }
    Py_XDECREF(descr);
    if (offset < 0) {
        PyErr_Format(PyExc_TypeError,
                     "Handle: %.100s.%U must be a writable slot (a slots dataclass field)",
                     Py_TYPE(obj)->tp_name, name);
    }
    return offset;
}

static int
Handle_init(Handle *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"section", "interval", "code", "lasti", "timer", NULL};
    PyObject *section, *code, *timer = Py_None, *samples, *append, *site, *accepted;
    long long interval;
    int lasti;
    Py_ssize_t offset;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OLOi|O:Handle", kwlist, &section,
                                     &interval, &code, &lasti, &timer)) {
        return -1;
    }
    if (interval < 1) {
        PyErr_Format(PyExc_ValueError, "Handle: interval must be >= 1, got %lld", interval);
        return -1;
    }
    offset = slot_offset(section, str_total_entry_cnt);
    if (offset < 0) {
        return -1;
    }
    samples = PyObject_GetAttrString(section, "cpu_elapsed_times");
    if (samples == NULL) {
        return -1;
    }
    append = PyObject_GetAttrString(samples, "append");
    Py_DECREF(samples);
    if (append == NULL) {
        return -1;
    }
    if (!PyCode_Check(code)) {
        Py_DECREF(append);
        PyErr_Format(PyExc_TypeError, "Handle: code must be a code object, not %.100s",
                     Py_TYPE(code)->tp_name);
        return -1;
    }
    site = Py_BuildValue("(OOi)", ((PyCodeObject *)code)->co_filename, code, lasti);
    accepted = site == NULL ? NULL : PySet_New(NULL);
    if (accepted == NULL || PySet_Add(accepted, site) < 0) {
        Py_XDECREF(site);
        Py_XDECREF(accepted);
        Py_DECREF(append);
        return -1;
    }
    Py_DECREF(site);

    Py_INCREF(section);
    Py_XSETREF(self->section, section);
    Py_INCREF(code);
    Py_XSETREF(self->code, code);
    Py_XSETREF(self->accepted, accepted);
    Py_XSETREF(self->append, append);
    if (timer == Py_None) {
        Py_CLEAR(self->timer);
    }
    else {
        Py_INCREF(timer);
        Py_XSETREF(self->timer, timer);
    }
    self->count_offset = offset;
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
    PyObject **slot, *old, *next;
    long long n;

    if (require_init(self) < 0) {
        return NULL;
    }
    slot = (PyObject **)((char *)self->section + self->count_offset);
    old = *slot;
    if (old == NULL) {
        PyErr_SetString(PyExc_AttributeError, "section has no total_entry_cnt");
        return NULL;
    }
    /* Only an int: converting anything else could run Python code that replaces (and
     * frees) `old` while we hold it borrowed. */
    if (!PyLong_Check(old)) {
        PyErr_Format(PyExc_TypeError, "total_entry_cnt must be an int, not %.100s",
                     Py_TYPE(old)->tp_name);
        return NULL;
    }
    n = PyLong_AsLongLong(old);
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (n == LLONG_MAX) {
        PyErr_SetString(PyExc_OverflowError, "total_entry_cnt would overflow");
        return NULL;
    }
    next = PyLong_FromLongLong(n + 1);
    if (next == NULL) {
        return NULL;
    }
    *slot = next;
    Py_DECREF(old);

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
    /* A handle's own class (Handle_new) inherits this function and must be visited
     * here; a Python subclass's subtype_traverse visits its class itself. */
    if ((Py_TYPE(self)->tp_flags & Py_TPFLAGS_HEAPTYPE) &&
        Py_TYPE(self)->tp_traverse == (traverseproc)Handle_traverse) {
        Py_VISIT(Py_TYPE(self));
    }
    Py_VISIT(self->section);
    Py_VISIT(self->code);
    Py_VISIT(self->accepted);
    Py_VISIT(self->append);
    Py_VISIT(self->timer);
    return 0;
}

static int
Handle_clear(Handle *self)
{
    Py_CLEAR(self->section);
    Py_CLEAR(self->code);
    Py_CLEAR(self->accepted);
    Py_CLEAR(self->append);
    Py_CLEAR(self->timer);
    return 0;
}

static void
Handle_dealloc(Handle *self)
{
    /* Heap subclasses (a handle's own class included: a spec without Py_tp_dealloc
     * gets subtype_dealloc) reach this through subtype_dealloc, which releases the
     * class afterwards: it must not be released here too. */
    PyObject_GC_UnTrack(self);
    Handle_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/*
 * `with handle:` looks __enter__ and __exit__ up on the handle's type. Found as methods
 * of a C type, each is bound to the handle on every entry: two allocations, which cost
 * more than everything else the handle does. So each handle gets a subclass of its
 * own, whose __enter__ and __exit__ are functions already bound to that one handle;
 * the lookup then returns them as they are. (The cycle handle -> its class -> bound
 * functions -> handle is collected by the GC once the registry drops the handle.)
 */
static PyMethodDef Handle_methods[] = {
    {"__enter__", (PyCFunction)Handle_enter, METH_NOARGS, "Count the entry; time it if sampled."},
    {"__exit__", (PyCFunction)(void (*)(void))Handle_exit, METH_FASTCALL,
     "Record the sampled entry's time unless it raised."},
    {NULL, NULL, 0, NULL},
};
static PyType_Slot bound_slots[] = {{0, NULL}};
static PyType_Spec bound_spec = {
    .name = "nvrx.straggler._hotpath.Handle",
    .basicsize = 0,
    .itemsize = 0,
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = bound_slots,
};

static int
bind_method(PyObject *type, PyMethodDef *def, PyObject *self)
{
    PyObject *fn = PyCFunction_New(def, self);
    int rc = fn == NULL ? -1 : PyObject_SetAttrString(type, def->ml_name, fn);
    Py_XDECREF(fn);
    return rc;
}

static PyObject *
Handle_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *own_type, *self;

    if (type != &HandleType) {
        return PyType_GenericNew(type, args, kwds);
    }
    own_type = PyType_FromSpecWithBases(&bound_spec, (PyObject *)&HandleType);
    if (own_type == NULL) {
        return NULL;
    }
    self = PyType_GenericNew((PyTypeObject *)own_type, NULL, NULL);
    /* The same two functions as the type's methods (a Python subclass uses those). */
    if (self != NULL && (bind_method(own_type, &Handle_methods[0], self) < 0 ||
                         bind_method(own_type, &Handle_methods[1], self) < 0)) {
        Py_CLEAR(self);
    }
    Py_DECREF(own_type); /* the handle holds its class */
    return self;
}

static PyObject *
Handle_get_timer(Handle *self, void *Py_UNUSED(closure))
{
    if (self->timer == NULL) {
        Py_RETURN_NONE;
    }
    Py_INCREF(self->timer);
    return self->timer;
}

static PyObject *
Handle_get_measuring(Handle *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->t0 != 0);
}

static PyMemberDef Handle_members[] = {
    {"section", T_OBJECT, offsetof(Handle, section), READONLY, "The CustomSection timed."},
    {"code", T_OBJECT, offsetof(Handle, code), READONLY, "Code object of the first call site."},
    {"lasti", T_INT, offsetof(Handle, lasti), READONLY, "Instruction offset of that call site."},
    {"accepted", T_OBJECT, offsetof(Handle, accepted), READONLY,
     "Call sites accepted for this name: (file, code, lasti)."},
    {"_nested", T_LONGLONG, offsetof(Handle, nested), READONLY,
     "Entries inside the measured one."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Handle_getset[] = {
    {"timer", (getter)Handle_get_timer, NULL, "The kernel timer of measured entries, or None.",
     NULL},
    {"measuring", (getter)Handle_get_measuring, NULL, "True inside a measured entry.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "nvrx.straggler._hotpath.Handle",
    .tp_doc = "Handle(section, interval, code, lasti, timer=None)\n--\n\n"
              "The context manager of one section: counts entries, times one in every "
              "interval.",
    .tp_basicsize = sizeof(Handle),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_new = Handle_new,
    .tp_init = (initproc)Handle_init,
    .tp_dealloc = (destructor)Handle_dealloc,
    .tp_traverse = (traverseproc)Handle_traverse,
    .tp_clear = (inquiry)Handle_clear,
    .tp_methods = Handle_methods,
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

    if (PyObject_TypeCheck(handle, &HandleType)) {
        Handle *h = (Handle *)handle;
        same = (PyObject *)code == h->code && lasti == h->lasti;
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
                       : (want_code == (PyObject *)code && value == lasti);
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

/* ---- module --------------------------------------------------------------------- */

static int
intern_all(void)
{
    str_start = PyUnicode_InternFromString("start");
    str_stop = PyUnicode_InternFromString("stop");
    str_total_entry_cnt = PyUnicode_InternFromString("total_entry_cnt");
    str_code = PyUnicode_InternFromString("code");
    str_lasti = PyUnicode_InternFromString("lasti");
    str_name = PyUnicode_InternFromString("name");
    str_profile_cuda = PyUnicode_InternFromString("profile_cuda");
    return (str_start && str_stop && str_total_entry_cnt && str_code && str_lasti && str_name &&
            str_profile_cuda)
               ? 0
               : -1;
}

static struct PyModuleDef hotpath_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "nvrx.straggler._hotpath",
    .m_doc = "detection_section's per-entry path in C (see sections.py).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    PyObject *module;

    if (intern_all() < 0 || PyType_Ready(&HandleType) < 0 || PyType_Ready(&DispatcherType) < 0) {
        return NULL;
    }
    module = PyModule_Create(&hotpath_module);
    if (module == NULL) {
        return NULL;
    }
    Py_INCREF(&HandleType);
    if (PyModule_AddObject(module, "Handle", (PyObject *)&HandleType) < 0) {
        Py_DECREF(&HandleType);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&DispatcherType);
    if (PyModule_AddObject(module, "Dispatcher", (PyObject *)&DispatcherType) < 0) {
        Py_DECREF(&DispatcherType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
