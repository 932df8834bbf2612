/* Batched UDP datagrams for the UDP frontend: recvmmsg(2) and sendmmsg(2).
 *
 * Python's socket module has neither call. A `Datagrams` object owns no socket: it reads and
 * writes a file descriptor the caller keeps open. `recv()` returns the datagrams queued on it
 * (up to `slots`, without blocking) as (bytes, address) pairs in the socket module's address
 * form; `sendto(data, address)` queues a reply while the object holds (between `recv()` and
 * `flush()`), else sends it at once; `flush()` sends the queue with as few system calls as the
 * kernel takes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

/* The largest UDP payload; a datagram received larger than a slot is dropped (MSG_TRUNC). */
#define SLOT_BYTES 65536
#define MAX_SLOTS 1024

typedef struct {
    PyObject *data; /* bytes, owned */
    struct sockaddr_storage to;
    socklen_t to_len;
} Pending;

typedef struct {
    PyObject_HEAD
    int fd;
    int family;
    int slots;
    int holding;           /* replies queue until flush() */
    char *buffers;         /* slots * SLOT_BYTES, pages touched only as datagrams need */
    struct mmsghdr *in;    /* slots */
    struct iovec *in_iov;  /* slots */
    struct sockaddr_storage *in_from;
    Pending *pending;      /* the queue of replies */
    Py_ssize_t queued, capacity;
    struct mmsghdr *out;   /* capacity */
    struct iovec *out_iov; /* capacity */
    unsigned long long dropped; /* replies not sent, over the object's life */
    int last_error;        /* errno of the last reply not sent, 0 if none */
} Datagrams;

static int
Datagrams_init(Datagrams *self, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"fd", "family", "slots", NULL};
    int fd, family, slots = 32;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "ii|i", keywords, &fd, &family, &slots))
        return -1;
    if (family != AF_INET && family != AF_INET6) {
        PyErr_Format(PyExc_ValueError, "family %d is neither AF_INET nor AF_INET6", family);
        return -1;
    }
    if (slots < 1 || slots > MAX_SLOTS) {
        PyErr_Format(PyExc_ValueError, "slots %d is not within 1..%d", slots, MAX_SLOTS);
        return -1;
    }
    if (self->buffers != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Datagrams is already initialised");
        return -1;
    }
    self->fd = fd;
    self->family = family;
    self->slots = slots;
    self->buffers = PyMem_RawMalloc((size_t)slots * SLOT_BYTES);
    self->in = PyMem_RawCalloc((size_t)slots, sizeof(struct mmsghdr));
    self->in_iov = PyMem_RawCalloc((size_t)slots, sizeof(struct iovec));
    self->in_from = PyMem_RawCalloc((size_t)slots, sizeof(struct sockaddr_storage));
    if (!self->buffers || !self->in || !self->in_iov || !self->in_from) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < slots; i++) {
        self->in_iov[i].iov_base = self->buffers + (size_t)i * SLOT_BYTES;
        self->in_iov[i].iov_len = SLOT_BYTES;
        self->in[i].msg_hdr.msg_iov = &self->in_iov[i];
        self->in[i].msg_hdr.msg_iovlen = 1;
        self->in[i].msg_hdr.msg_name = &self->in_from[i];
    }
    return 0;
}

static void
discard_queue(Datagrams *self)
{
    for (Py_ssize_t i = 0; i < self->queued; i++)
        Py_CLEAR(self->pending[i].data);
    self->queued = 0;
}

static void
Datagrams_dealloc(Datagrams *self)
{
    discard_queue(self);
    PyMem_RawFree(self->buffers);
    PyMem_RawFree(self->in);
    PyMem_RawFree(self->in_iov);
    PyMem_RawFree(self->in_from);
    PyMem_RawFree(self->pending);
    PyMem_RawFree(self->out);
    PyMem_RawFree(self->out_iov);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The socket module's form of an address: (host, port) or (host, port, flowinfo, scope_id). */
static PyObject *
address(const struct sockaddr_storage *from)
{
    char text[INET6_ADDRSTRLEN];
    if (from->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)from;
        inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
        return Py_BuildValue("(si)", text, ntohs(in->sin_port));
    }
    if (from->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)from;
        inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
        return Py_BuildValue("(siII)", text, ntohs(in6->sin6_port),
                             (unsigned int)ntohl(in6->sin6_flowinfo),
                             (unsigned int)in6->sin6_scope_id);
    }
    PyErr_Format(PyExc_OSError, "datagram from address family %d", from->ss_family);
    return NULL;
}

static PyObject *
Datagrams_recv(Datagrams *self, PyObject *Py_UNUSED(ignored))
{
    if (self->buffers == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Datagrams is not initialised");
        return NULL;
    }
    for (int i = 0; i < self->slots; i++)
        self->in[i].msg_hdr.msg_namelen = sizeof(struct sockaddr_storage);
    int got; /* non-blocking: the GIL is kept */
    do {
        got = recvmmsg(self->fd, self->in, (unsigned int)self->slots, MSG_DONTWAIT, NULL);
    } while (got < 0 && errno == EINTR);
    if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return PyList_New(0);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    for (int i = 0; i < got; i++) {
        if (self->in[i].msg_hdr.msg_flags & MSG_TRUNC)
            continue; /* larger than any DNS message over UDP: not a query */
        PyObject *data = PyBytes_FromStringAndSize(self->in_iov[i].iov_base, self->in[i].msg_len);
        PyObject *from = data ? address(&self->in_from[i]) : NULL;
        PyObject *pair = from ? PyTuple_Pack(2, data, from) : NULL;
        Py_XDECREF(data);
        Py_XDECREF(from);
        if (pair == NULL || PyList_Append(list, pair) < 0) {
            Py_XDECREF(pair);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(pair);
    }
    self->holding = 1;
    return list;
}

/* `addr` in the socket module's form, for this socket's family, into `to`. */
static int
parse_address(Datagrams *self, PyObject *addr, struct sockaddr_storage *to, socklen_t *to_len)
{
    const char *host;
    int port;
    unsigned int flowinfo = 0, scope_id = 0;
    if (!PyTuple_Check(addr)) {
        PyErr_Format(PyExc_TypeError, "address must be a tuple, not %.100s",
                     Py_TYPE(addr)->tp_name);
        return -1;
    }
    memset(to, 0, sizeof *to);
    if (self->family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)to;
        if (!PyArg_ParseTuple(addr, "si;IPv4 address must be (host, port)", &host, &port))
            return -1;
        if (inet_pton(AF_INET, host, &in->sin_addr) != 1) {
            PyErr_Format(PyExc_ValueError, "%.100s is not an IPv4 address", host);
            return -1;
        }
        in->sin_family = AF_INET;
        in->sin_port = htons((uint16_t)port);
        *to_len = sizeof *in;
    } else {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)to;
        if (!PyArg_ParseTuple(addr, "si|II;IPv6 address must be (host, port[, flowinfo, scope_id])",
                              &host, &port, &flowinfo, &scope_id))
            return -1;
        if (inet_pton(AF_INET6, host, &in6->sin6_addr) != 1) {
            PyErr_Format(PyExc_ValueError, "%.100s is not an IPv6 address", host);
            return -1;
        }
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        in6->sin6_flowinfo = htonl(flowinfo);
        in6->sin6_scope_id = scope_id;
        *to_len = sizeof *in6;
    }
    if (port < 0 || port > 65535) {
        PyErr_Format(PyExc_ValueError, "port %d is not within 0..65535", port);
        return -1;
    }
    return 0;
}

static int
grow(Datagrams *self)
{
    Py_ssize_t capacity = self->capacity ? self->capacity * 2 : self->slots;
    Pending *pending = PyMem_RawRealloc(self->pending, (size_t)capacity * sizeof(Pending));
    if (pending == NULL)
        return -1;
    self->pending = pending;
    struct mmsghdr *out = PyMem_RawRealloc(self->out, (size_t)capacity * sizeof(struct mmsghdr));
    if (out == NULL)
        return -1;
    self->out = out;
    struct iovec *iov = PyMem_RawRealloc(self->out_iov, (size_t)capacity * sizeof(struct iovec));
    if (iov == NULL)
        return -1;
    self->out_iov = iov;
    self->capacity = capacity;
    return 0;
}

/* Send the queue; a reply the kernel refuses is dropped and counted (UDP may lose it). */
static PyObject *
send_queue(Datagrams *self)
{
    Py_ssize_t sent = 0, n = self->queued;
    for (Py_ssize_t i = 0; i < n; i++) {
        Pending *p = &self->pending[i];
        memset(&self->out[i], 0, sizeof self->out[i]);
        self->out_iov[i].iov_base = PyBytes_AS_STRING(p->data);
        self->out_iov[i].iov_len = (size_t)PyBytes_GET_SIZE(p->data);
        self->out[i].msg_hdr.msg_iov = &self->out_iov[i];
        self->out[i].msg_hdr.msg_iovlen = 1;
        self->out[i].msg_hdr.msg_name = &p->to;
        self->out[i].msg_hdr.msg_namelen = p->to_len;
    }
    int error = 0; /* non-blocking: the GIL is kept */
    while (sent < n) {
        unsigned int count = (unsigned int)(n - sent < 1024 ? n - sent : 1024);
        int done = sendmmsg(self->fd, self->out + sent, count, MSG_DONTWAIT);
        if (done > 0) {
            sent += done;
            continue;
        }
        if (done < 0 && errno == EINTR)
            continue;
        error = done < 0 ? errno : EIO;
        if (error == EBADF || error == ENOTSOCK || error == EAGAIN || error == EWOULDBLOCK
            || error == ENOBUFS)
            break; /* the socket, not this reply: the rest would fail alike */
        sent++;    /* this reply alone (too large, unreachable): drop it, send the rest */
        self->dropped++;
    }
    discard_queue(self);
    if (sent < n)
        self->dropped += (unsigned long long)(n - sent);
    if (error == EBADF || error == ENOTSOCK) {
        errno = error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    self->last_error = error;
    return PyLong_FromLong(error);
}

static PyObject *
Datagrams_sendto(Datagrams *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "sendto() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!PyBytes_Check(args[0])) {
        PyErr_Format(PyExc_TypeError, "data must be bytes, not %.100s", Py_TYPE(args[0])->tp_name);
        return NULL;
    }
    if (self->buffers == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Datagrams is not initialised");
        return NULL;
    }
    if (self->queued == self->capacity && grow(self) < 0)
        return PyErr_NoMemory();
    Pending *p = &self->pending[self->queued];
    if (parse_address(self, args[1], &p->to, &p->to_len) < 0)
        return NULL;
    Py_INCREF(args[0]);
    p->data = args[0];
    self->queued++;
    if (self->holding)
        Py_RETURN_NONE;
    PyObject *error = send_queue(self);
    if (error == NULL)
        return NULL;
    Py_DECREF(error);
    Py_RETURN_NONE;
}

static PyObject *
Datagrams_flush(Datagrams *self, PyObject *Py_UNUSED(ignored))
{
    self->holding = 0;
    return send_queue(self);
}

static PyMethodDef Datagrams_methods[] = {
    {"recv", (PyCFunction)Datagrams_recv, METH_NOARGS,
     "recv() -> list of (bytes, address): the datagrams queued, up to `slots`; [] if none.\n"
     "Replies then queue until flush()."},
    {"sendto", (PyCFunction)(void (*)(void))Datagrams_sendto, METH_FASTCALL,
     "sendto(data, address): queue a reply (between recv() and flush()), else send it now."},
    {"flush", (PyCFunction)Datagrams_flush, METH_NOARGS,
     "flush() -> errno of the last reply the kernel refused (it is dropped), or 0; replies\n"
     "are sent at once again until the next recv()."},
    {NULL},
};

static PyMemberDef Datagrams_members[] = {
    {"fd", T_INT, offsetof(Datagrams, fd), READONLY, "the socket's file descriptor"},
    {"slots", T_INT, offsetof(Datagrams, slots), READONLY, "datagrams read per recv()"},
    {"dropped", T_ULONGLONG, offsetof(Datagrams, dropped), READONLY,
     "replies the kernel refused, over this object's life"},
    {"last_error", T_INT, offsetof(Datagrams, last_error), READONLY,
     "errno of the last send that refused a reply, 0 once a send succeeds"},
    {NULL},
};

static PyTypeObject DatagramsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "toposdns.serve.datagrams.Datagrams",
    .tp_doc = PyDoc_STR("Datagrams(fd, family, slots=32): batched UDP reads and writes on fd."),
    .tp_basicsize = sizeof(Datagrams),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Datagrams_init,
    .tp_dealloc = (destructor)Datagrams_dealloc,
    .tp_methods = Datagrams_methods,
    .tp_members = Datagrams_members,
};

static struct PyModuleDef datagrams_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "toposdns.serve.datagrams",
    .m_doc = PyDoc_STR("Batched UDP datagrams: recvmmsg(2) and sendmmsg(2)."),
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit_datagrams(void)
{
    if (PyType_Ready(&DatagramsType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&datagrams_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&DatagramsType);
    if (PyModule_AddObject(module, "Datagrams", (PyObject *)&DatagramsType) < 0) {
        Py_DECREF(&DatagramsType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
