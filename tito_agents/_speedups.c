/* Optional C helper for the capture hot path: the integers of a JSON id array, in one pass.
 *
 * `parse_ids(data)` takes the text between the brackets of a JSON array of token ids (bytes or any
 * buffer) and returns a bytearray of native int32 values, or None when the text is not a list of
 * JSON integers in [0, 2**31): then the caller parses the body with a full JSON parser, which
 * names the problem. JSON whitespace is allowed around numbers and commas; leading zeros, signs,
 * fractions, exponents, empty items and trailing commas are not.
 *
 * numpy's text parser takes ~25 ns per id here; this takes ~2-3. Built by hatch_build.py when a C
 * compiler is present; tito_agents._wire falls back to numpy without it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static inline int is_ws(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static PyObject *parse_ids(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0) {
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)view.buf;
    const unsigned char *end = p + view.len;
    /* at most one id per two bytes ("1,2,3"), plus one */
    Py_ssize_t capacity = view.len / 2 + 1;
    PyObject *out = PyByteArray_FromStringAndSize(NULL, capacity * (Py_ssize_t)sizeof(int32_t));
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int32_t *ids = (int32_t *)PyByteArray_AS_STRING(out);
    Py_ssize_t n = 0;
    int valid = 1;

    while (p < end && is_ws(*p)) p++;
    if (p < end) {
        for (;;) {
            /* one number: "0" or [1-9][0-9]*, at most 2**31 - 1 */
            if (p >= end || *p < '0' || *p > '9') { valid = 0; break; }
            if (*p == '0' && p + 1 < end && p[1] >= '0' && p[1] <= '9') { valid = 0; break; }
            int64_t value = 0;
            int digits = 0;
            while (p < end && *p >= '0' && *p <= '9') {
                value = value * 10 + (*p - '0');
                p++;
                if (++digits > 10) break;
            }
            if (digits > 10 || value > INT32_MAX) { valid = 0; break; }
            ids[n++] = (int32_t)value;
            while (p < end && is_ws(*p)) p++;
            if (p >= end) break;
            if (*p != ',') { valid = 0; break; }
            p++;
            while (p < end && is_ws(*p)) p++;
        }
    }
    PyBuffer_Release(&view);
    if (!valid) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    if (PyByteArray_Resize(out, n * (Py_ssize_t)sizeof(int32_t)) != 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"parse_ids", parse_ids, METH_O,
     "parse_ids(data) -> bytearray | None: native int32 ids of a JSON id list's inner text."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "tito_agents._speedups",
    "Optional C helper for parsing token-id arrays (see _speedups.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }
