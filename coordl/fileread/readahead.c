/* coordl.fileread._readahead: whole-file reads in native threads, so read-ahead never takes the GIL.
 *
 * A loader worker reads the next items' files while it preps the current one. With Python threads
 * each read takes the GIL back several times (the pool's queue, the future, every os.* call), and
 * each time the prep thread releases the GIL around a C call (a torch op, the JPEG decoder) a read
 * thread can take it, so the prep thread waits (reports/bench_loader.md, issue 27 session 7). Here
 * the reads run in pthreads that never touch Python objects: the prep thread's submit() queues a
 * path, result() waits with the GIL released and makes the bytes object.
 *
 * The read is fileread.read_file's: with direct=True, O_DIRECT into a page-aligned buffer, falling
 * back to an ordinary read when the file system refuses O_DIRECT (EINVAL at open or at the read)
 * or the file is over DIRECT_MAX_BYTES; a file longer than fstat said is read to its end.
 *
 * Lifetimes: a request is shared by its handle (the Python object) and the queue/thread, each
 * holding one reference under the reader's mutex; a handle holds a reference to its reader, so a
 * reader is freed only when no handle is left. A reader copied into a forked child has no threads
 * there (and its mutex may be held by a parent thread): it is never used in the child (the Python
 * side makes one per process) and its dealloc leaks it instead of joining threads that do not exist.
 *
 * Why one file of ~420 lines: the read, the threads and the two Python types share one mutex and one
 * request lifetime; split, each part would need the others' locking rules.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ALIGN 4096
#define DIRECT_MAX_BYTES ((size_t)64 << 20)
#define MAX_THREADS 64

enum { PENDING, RUNNING, DONE, DROPPED };

typedef struct Req {
    char *path;
    int direct;
    int state;
    int refs;
    int err; /* errno of a failed read, else 0 */
    char *buf;
    size_t len;
    struct Req *next;
} Req;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t work; /* threads wait for requests */
    pthread_cond_t done; /* result() waits for its request */
    Req *head, *tail;
    pthread_t threads[MAX_THREADS];
    int nthreads;
    int stop;
    pid_t owner;
} Reader;

typedef struct {
    PyObject_HEAD
    Reader *reader;
    Req *req;
} Handle;

static PyTypeObject HandleType;

/* -- the read (no GIL, no Python) ---------------------------------------------------------------- */

/* Close ``fd``, free ``buf`` (may be NULL) and return ``e``: every way out of a failed read. */
static int give_up(int fd, char *buf, int e) {
    free(buf);
    close(fd);
    return e;
}

/* ``path`` opened with ``flags`` and its size in ``*size``: the descriptor, or -errno. */
static int open_sized(const char *path, int flags, size_t *size) {
    int fd = open(path, flags | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return -give_up(fd, NULL, errno);
    *size = st.st_size > 0 ? (size_t)st.st_size : 0;
    return fd;
}

static int read_buffered(Req *r) {
    size_t size;
    int fd = open_sized(r->path, O_RDONLY, &size);
    if (fd < 0)
        return -fd;
    size_t cap = size > 0 ? size + 1 : 4096;
    char *buf = malloc(cap);
    size_t got = 0;
    if (buf == NULL)
        return give_up(fd, NULL, ENOMEM);
    for (;;) {
        ssize_t n = read(fd, buf + got, cap - got);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return give_up(fd, buf, errno);
        }
        if (n == 0)
            break;
        got += (size_t)n;
        if (got == cap) { /* it grew since fstat */
            char *more = realloc(buf, cap * 2);
            if (more == NULL)
                return give_up(fd, buf, ENOMEM);
            buf = more;
            cap *= 2;
        }
    }
    close(fd);
    r->buf = buf;
    r->len = got;
    return 0;
}

/* 0 when read; EINVAL when the caller should read the ordinary way; another errno on failure. */
static int read_direct(Req *r) {
    size_t size;
    int fd = open_sized(r->path, O_RDONLY | O_DIRECT, &size);
    if (fd < 0)
        return -fd; /* EINVAL: no O_DIRECT on this file system */
    if (size > DIRECT_MAX_BYTES)
        return give_up(fd, NULL, EINVAL);
    size_t want = (size / ALIGN + 1) * ALIGN; /* a block more: a short read ends it */
    char *buf = NULL;
    size_t got = 0;
    if (posix_memalign((void **)&buf, ALIGN, want) != 0)
        return give_up(fd, NULL, ENOMEM);
    for (;;) {
        ssize_t n = pread(fd, buf + got, want - got, (off_t)got);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return give_up(fd, buf, errno);
        }
        got += (size_t)n;
        if (got < want)
            break; /* a short read (0 included): the end of the file */
        if (want >= DIRECT_MAX_BYTES)
            return give_up(fd, buf, EINVAL);
        char *more = NULL; /* it grew since fstat: read on into a buffer twice the size */
        if (posix_memalign((void **)&more, ALIGN, want * 2) != 0)
            return give_up(fd, buf, ENOMEM);
        memcpy(more, buf, got);
        free(buf);
        buf = more;
        want *= 2;
    }
    close(fd);
    r->buf = buf;
    r->len = got;
    return 0;
}

static void do_read(Req *r) {
    int e = r->direct ? read_direct(r) : EINVAL;
    if (e == EINVAL)
        e = read_buffered(r);
    r->err = e;
}

static void req_release(Req *r) { /* under the reader's mutex */
    if (--r->refs == 0) {
        free(r->buf);
        free(r->path);
        free(r);
    }
}

static void *worker(void *arg) {
    Reader *self = arg;
    pthread_mutex_lock(&self->mu);
    for (;;) {
        while (!self->stop && self->head == NULL)
            pthread_cond_wait(&self->work, &self->mu);
        if (self->stop)
            break;
        Req *r = self->head;
        self->head = r->next;
        if (self->head == NULL)
            self->tail = NULL;
        if (r->state == DROPPED) {
            req_release(r);
            continue;
        }
        r->state = RUNNING;
        pthread_mutex_unlock(&self->mu);
        do_read(r);
        pthread_mutex_lock(&self->mu);
        if (r->state == RUNNING)
            r->state = DONE;
        pthread_cond_broadcast(&self->done);
        req_release(r);
    }
    pthread_mutex_unlock(&self->mu);
    return NULL;
}

/* -- Reader ------------------------------------------------------------------------------------- */

static int Reader_init(Reader *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"threads", NULL};
    int threads;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i", names, &threads))
        return -1;
    if (self->owner != 0) {
        PyErr_SetString(PyExc_RuntimeError, "a Reader is initialised once");
        return -1;
    }
    if (threads < 1 || threads > MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "threads must be 1..%d, got %d", MAX_THREADS, threads);
        return -1;
    }
    pthread_mutex_init(&self->mu, NULL);
    pthread_cond_init(&self->work, NULL);
    pthread_cond_init(&self->done, NULL);
    self->owner = getpid();
    for (int i = 0; i < threads; i++) {
        int rc = pthread_create(&self->threads[i], NULL, worker, self);
        if (rc != 0) {
            if (self->nthreads > 0)
                break; /* fewer threads than asked: still a working reader */
            errno = rc;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        self->nthreads++;
    }
    return 0;
}

static void Reader_dealloc(Reader *self) {
    if (self->owner == getpid() && self->nthreads > 0) {
        pthread_mutex_lock(&self->mu);
        self->stop = 1;
        pthread_cond_broadcast(&self->work);
        pthread_mutex_unlock(&self->mu);
        Py_BEGIN_ALLOW_THREADS
        for (int i = 0; i < self->nthreads; i++)
            pthread_join(self->threads[i], NULL);
        Py_END_ALLOW_THREADS
        /* No handle is left (each holds a reference to this reader): what is queued was dropped. */
        while (self->head != NULL) {
            Req *r = self->head;
            self->head = r->next;
            req_release(r);
        }
        pthread_cond_destroy(&self->done);
        pthread_cond_destroy(&self->work);
        pthread_mutex_destroy(&self->mu);
    } /* else: never started, or a forked copy without its threads: leak, do not touch the mutex */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Reader_submit(Reader *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"path", "direct", NULL};
    PyObject *path_obj = NULL;
    int direct = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|p", names, PyUnicode_FSConverter, &path_obj, &direct))
        return NULL;
    if (self->owner != getpid() || self->nthreads == 0) {
        Py_DECREF(path_obj);
        PyErr_SetString(PyExc_RuntimeError, "this Reader's threads are in another process (made before a fork)");
        return NULL;
    }
    const char *path = PyBytes_AS_STRING(path_obj);
    if (strlen(path) != (size_t)PyBytes_GET_SIZE(path_obj)) {
        Py_DECREF(path_obj);
        PyErr_SetString(PyExc_ValueError, "embedded null byte in the path");
        return NULL;
    }
    Req *r = calloc(1, sizeof(Req));
    char *copy = strdup(path);
    Py_DECREF(path_obj);
    Handle *h = r && copy ? PyObject_New(Handle, &HandleType) : NULL;
    if (h == NULL) {
        free(r);
        free(copy);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    r->path = copy;
    r->direct = direct;
    r->state = PENDING;
    r->refs = 2; /* the handle, the queue */
    Py_INCREF(self);
    h->reader = self;
    h->req = r;
    pthread_mutex_lock(&self->mu);
    if (self->tail != NULL)
        self->tail->next = r;
    else
        self->head = r;
    self->tail = r;
    pthread_cond_signal(&self->work);
    pthread_mutex_unlock(&self->mu);
    return (PyObject *)h;
}

static PyMethodDef Reader_methods[] = {
    {"submit", (PyCFunction)(void (*)(void))Reader_submit, METH_VARARGS | METH_KEYWORDS,
     "submit(path, direct=False) -> Handle: read the whole file in a reader thread"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "coordl.fileread._readahead.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Reader(threads): whole-file reads in native threads (see the module's text)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Reader_init,
    .tp_dealloc = (destructor)Reader_dealloc,
    .tp_methods = Reader_methods,
};

/* -- Handle ------------------------------------------------------------------------------------- */

static PyObject *Handle_result(Handle *self, PyObject *unused) {
    Reader *rd = self->reader;
    Req *r = self->req;
    if (r == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "this read was already taken or cancelled");
        return NULL;
    }
    int state;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&rd->mu);
    r->refs++; /* this wait's own: another thread may cancel the handle meanwhile */
    while (r->state == PENDING || r->state == RUNNING)
        pthread_cond_wait(&rd->done, &rd->mu);
    state = r->state;
    if (state == DROPPED)
        req_release(r);
    pthread_mutex_unlock(&rd->mu);
    Py_END_ALLOW_THREADS
    if (state == DROPPED) {
        PyErr_SetString(PyExc_RuntimeError, "this read was cancelled while waited for");
        return NULL;
    }
    /* DONE: the thread no longer touches buf, len or err. */
    PyObject *out;
    if (r->err != 0) {
        errno = r->err;
        out = PyErr_SetFromErrnoWithFilename(PyExc_OSError, r->path);
    } else {
        out = PyBytes_FromStringAndSize(r->buf, (Py_ssize_t)r->len);
    }
    pthread_mutex_lock(&rd->mu);
    if (self->req == r) { /* the handle's reference too (the wait's keeps refs above 0 here) */
        self->req = NULL;
        r->refs--;
    }
    req_release(r); /* the wait's */
    pthread_mutex_unlock(&rd->mu);
    return out;
}

static void handle_drop(Handle *self) {
    Req *r = self->req;
    if (r == NULL)
        return;
    pthread_mutex_lock(&self->reader->mu);
    if (r->state != DONE) {
        r->state = DROPPED; /* pending: the thread skips it; running: it finishes and frees it */
        pthread_cond_broadcast(&self->reader->done); /* a result() waiting on it in another thread */
    }
    self->req = NULL;
    req_release(r);
    pthread_mutex_unlock(&self->reader->mu);
}

static PyObject *Handle_cancel(Handle *self, PyObject *unused) {
    handle_drop(self);
    Py_RETURN_NONE;
}

static void Handle_dealloc(Handle *self) {
    handle_drop(self);
    Py_XDECREF(self->reader);
    PyObject_Free(self);
}

static PyMethodDef Handle_methods[] = {
    {"result", (PyCFunction)Handle_result, METH_NOARGS,
     "the file's bytes (waits without the GIL); OSError naming the file when the read failed"},
    {"cancel", (PyCFunction)Handle_cancel, METH_NOARGS, "drop the read (not made if not started)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "coordl.fileread._readahead.Handle",
    .tp_basicsize = sizeof(Handle),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "a read submitted to a Reader",
    .tp_dealloc = (destructor)Handle_dealloc,
    .tp_methods = Handle_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_readahead", "Whole-file reads in native threads (see readahead.c).", -1, NULL,
};

PyMODINIT_FUNC PyInit__readahead(void) {
    if (PyType_Ready(&ReaderType) < 0 || PyType_Ready(&HandleType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&ReaderType);
    if (PyModule_AddObject(m, "Reader", (PyObject *)&ReaderType) < 0) {
        Py_DECREF(&ReaderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
