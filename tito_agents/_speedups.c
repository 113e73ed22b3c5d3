/* Optional C helper for the capture hot path: the integers of a JSON id array, in one pass.
 *
 * `parse_ids(data)` takes the text between the brackets of a JSON array of token ids (bytes or any
 * buffer) and returns a bytearray of native int32 values, or None when the text is not a list of
 * JSON integers in [0, 2**31): then the caller parses the body with a full JSON parser, which
 * names the problem. JSON whitespace is allowed around numbers and commas; leading zeros, signs,
 * fractions, exponents, empty items and trailing commas are not.
 *
 * numpy's text parser takes ~25 ns per id here; this takes ~3 (compact text is read 8 bytes at a
 * time, see parse_compact). Built by hatch_build.py when a C compiler is present;
 * tito_agents._capture.wire falls back to numpy without it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static inline int is_ws(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

#define HIGH 0x8080808080808080ULL

/* The value of the 1..7 digits in the top `length` lanes of `lanes` (one byte per lane, each
 * already 0..9, the most significant digit lowest): three multiplies instead of a loop. */
static inline int32_t swar_value(uint64_t lanes, int length) {
    uint64_t v = lanes & (~0ULL << (8 * (8 - length)));
    v = (v * 10 + (v >> 8)) & 0x00FF00FF00FF00FFULL;
    v = (v * 100 + (v >> 16)) & 0x0000FFFF0000FFFFULL;
    v = (v * 10000 + (v >> 32)) & 0xFFFFFFFFULL;
    return (int32_t)v;
}

/* One number of `length` digits at `p` (digits only, checked by the caller); -1 when JSON or the
 * id range refuses it (empty, a leading zero, more than 10 digits, >= 2**31). */
static inline int64_t number_value(const unsigned char *p, Py_ssize_t length) {
    if (length == 0 || length > 10 || (length > 1 && p[0] == '0')) return -1;
    int64_t value = 0;
    for (Py_ssize_t i = 0; i < length; i++) value = value * 10 + (p[i] - '0');
    return value > INT32_MAX ? -1 : value;
}

/* Compact JSON (digits and commas only, which is what vLLM writes), in one pass of 8-byte words at
 * a fixed stride. Each comma ends a number; the number is read from the 8 bytes that end at the
 * comma, so no number waits for the one before it (a loop that walks digit by digit has to find
 * where each number ends before it can start the next, and mispredicts that exit once per id).
 * Returns the count, -1 when the text is invalid, -2 when it is not compact (whitespace, other
 * bytes): then the general loop decides. */
static Py_ssize_t parse_compact(const unsigned char *buf, Py_ssize_t len, int32_t *ids) {
#if !(defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ && defined(__GNUC__))
    (void)buf; (void)len; (void)ids;
    return -2; /* the word tricks below assume little-endian loads and GCC/Clang builtins */
#else
    Py_ssize_t n = 0, start = 0, pos = 0;
    for (; pos + 8 <= len; pos += 8) {
        uint64_t word;
        memcpy(&word, buf + pos, 8);
        if (word & HIGH) return -2;
        uint64_t lanes = word ^ 0x3030303030303030ULL;
        /* high bit set in every lane >= 10, i.e. not a digit (exact per lane for ASCII) */
        uint64_t non_digit = (lanes + 0x7676767676767676ULL) & HIGH;
        uint64_t commas = word ^ 0x2C2C2C2C2C2C2C2CULL;
        commas = ~(((commas & 0x7F7F7F7F7F7F7F7FULL) + 0x7F7F7F7F7F7F7F7FULL) | commas) & HIGH;
        if (non_digit != commas) return -2;
        while (commas) {
            Py_ssize_t comma = pos + (__builtin_ctzll(commas) >> 3);
            commas &= commas - 1;
            Py_ssize_t length = comma - start;
            if (length >= 1 && length <= 7 && comma >= 8) {
                if (length > 1 && buf[start] == '0') return -1;
                uint64_t before;
                memcpy(&before, buf + comma - 8, 8);
                ids[n++] = swar_value(before ^ 0x3030303030303030ULL, (int)length);
            } else {
                int64_t value = number_value(buf + start, length);
                if (value < 0) return -1;
                ids[n++] = (int32_t)value;
            }
            start = comma + 1;
        }
    }
    for (; pos < len; pos++) {
        unsigned char c = buf[pos];
        if (c == ',') {
            int64_t value = number_value(buf + start, pos - start);
            if (value < 0) return -1;
            ids[n++] = (int32_t)value;
            start = pos + 1;
        } else if (c < '0' || c > '9') {
            return -2;
        }
    }
    int64_t value = number_value(buf + start, len - start); /* the last number: no comma after it */
    if (value < 0) return -1;
    ids[n++] = (int32_t)value;
    return n;
#endif
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
    Py_ssize_t n = view.len ? parse_compact(p, view.len, ids) : 0;
    int valid = n != -1;

    if (n == -2) { /* whitespace or stray bytes: the general loop, byte by byte */
        n = 0;
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
