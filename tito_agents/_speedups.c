/* Optional C helper for the capture hot path: the integers of a JSON id array, in one pass, and
 * the logprobs of a body's logprob entries (chat and Responses: `chat_logprobs`) or completions
 * logprobs object (`completion_logprobs`) without building them (below).
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
#include <float.h>
#include <math.h>
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

/* ---- chat logprob entries: the `logprob` of each, without building the entries ----
 *
 * `chat_logprobs(data, start)` reads the entries of a chat `logprobs.content` array in `data`
 * from `start` (just after its opening bracket) to its closing bracket, and returns where that
 * bracket is and a bytearray of native float32 values, one per entry; or None when it cannot be
 * sure the full parse (orjson, then `float32(entry["logprob"])`) gives exactly these: then the
 * caller takes that parse, which also names any problem. Finding the end as it reads is what lets
 * the caller cut the array out of a body without searching the entries' bytes for it first. So the scan validates the whole text as JSON
 * (strict UTF-8, no control characters in strings, no leading zeros...) and refuses, rather than
 * decides, anything outside the plain shape vLLM writes: an entry that is no object, a `logprob`
 * that is missing, repeated, integer, infinite or not a number, a key spelled with an escape,
 * a lone surrogate escape, nesting deeper than MAX_DEPTH, any number infinite as a double. A
 * number is read correctly rounded (Clinger's fast path or PyOS_string_to_double, as a JSON
 * parser must), then rounded to float32 as numpy does. */

#define MAX_DEPTH 32
#define MAX_NUMBER 63

typedef struct {
    const unsigned char *p, *end;
} Scan;

static inline void skip_ws(Scan *s) {
    while (s->p < s->end && is_ws(*s->p)) s->p++;
}

static const unsigned char PLAIN[256] = {
#define R16(v) v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v
    R16(0), R16(0), 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, R16(1), R16(1),
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, R16(1), R16(1), R16(0), R16(0), R16(0),
    R16(0), R16(0), R16(0), R16(0), R16(0)
#undef R16
};

static inline int hex_value(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The length of the valid UTF-8 sequence starting at p (lead byte >= 0x80), or 0 (overlong,
 * surrogate, beyond U+10FFFF, truncated). */
static inline int utf8_length(const unsigned char *p, const unsigned char *end) {
    unsigned char c = p[0];
    if (c >= 0xC2 && c <= 0xDF) {
        return end - p >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        if (end - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && p[1] < 0xA0) return 0; /* overlong */
        if (c == 0xED && p[1] >= 0xA0) return 0; /* surrogate */
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (end - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 ||
            (p[3] & 0xC0) != 0x80)
            return 0;
        if (c == 0xF0 && p[1] < 0x90) return 0; /* overlong */
        if (c == 0xF4 && p[1] >= 0x90) return 0; /* beyond U+10FFFF */
        return 4;
    }
    return 0;
}

/* A string at s->p (its opening quote): 1 when valid and plain, 0 otherwise. `escaped` says
 * whether it held an escape (a key spelled with one is refused by the caller). */
static int scan_string(Scan *s, int *escaped) {
    const unsigned char *p = s->p + 1, *end = s->end;
    *escaped = 0;
    for (;;) {
        /* the plain ASCII run, the common case */
        while (p < end && PLAIN[*p]) p++;
        if (p >= end) return 0;
        unsigned char c = *p;
        if (c == '"') {
            s->p = p + 1;
            return 1;
        }
        if (c < 0x20) return 0;
        if (c == '\\') {
            *escaped = 1;
            if (p + 1 >= end) return 0;
            unsigned char e = p[1];
            if (e == 'u') {
                if (end - p < 6) return 0;
                int code = 0;
                for (int i = 2; i < 6; i++) {
                    int h = hex_value(p[i]);
                    if (h < 0) return 0;
                    code = code * 16 + h;
                }
                p += 6;
                if (code >= 0xDC00 && code <= 0xDFFF) return 0; /* a lone low surrogate */
                if (code >= 0xD800 && code <= 0xDBFF) { /* a high one: a low one must follow */
                    if (end - p < 6 || p[0] != '\\' || p[1] != 'u') return 0;
                    int low = 0;
                    for (int i = 2; i < 6; i++) {
                        int h = hex_value(p[i]);
                        if (h < 0) return 0;
                        low = low * 16 + h;
                    }
                    if (low < 0xDC00 || low > 0xDFFF) return 0;
                    p += 6;
                }
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' ||
                       e == 'r' || e == 't') {
                p += 2;
            } else {
                return 0;
            }
            continue;
        }
        int n = utf8_length(p, end);
        if (n == 0) return 0;
        p += n;
    }
}

#define FRACTION 1
#define EXPONENT 2

/* A JSON number at s->p: 1 when valid, 0 otherwise; `is_float` says whether it has a FRACTION
 * or an EXPONENT (a JSON integer parses to a Python int, not read here). */
static int scan_number(Scan *s, int *is_float) {
    const unsigned char *p = s->p, *end = s->end;
    *is_float = 0;
    if (p < end && *p == '-') p++;
    if (p >= end) return 0;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') p++;
    } else {
        return 0;
    }
    if (p < end && *p == '.') {
        *is_float = FRACTION;
        p++;
        if (p >= end || *p < '0' || *p > '9') return 0;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        *is_float |= EXPONENT;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return 0;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    s->p = p;
    return 1;
}

/* Whether the bytes at p (`left` of them there) begin with `text`, a literal (so the compare is
 * inlined). */
#define IS_AT(p, left, text) ((left) >= (Py_ssize_t)sizeof(text) - 1 && \
                              memcmp((p), (text), sizeof(text) - 1) == 0)

/* An object key at s->p (its opening quote): 1 when valid, 0 otherwise. The keys of vLLM's
 * logprob entries are compared whole first (a plain ASCII key is valid as it stands), which spares
 * the byte loop for most; `escaped` as in scan_string, `is_logprob` when the key is "logprob". */
static inline int scan_key(Scan *s, int *escaped, int *is_logprob) {
    const unsigned char *p = s->p;
    Py_ssize_t left = s->end - p, length = 0;
    *escaped = 0;
    *is_logprob = 0;
    if (left > 1) {
        switch (p[1]) {
        case 'l':
            if (IS_AT(p, left, "\"logprob\"")) length = 9, *is_logprob = 1;
            break;
        case 't':
            if (IS_AT(p, left, "\"token\"")) length = 7;
            else if (IS_AT(p, left, "\"top_logprobs\"")) length = 14;
            break;
        case 'b':
            if (IS_AT(p, left, "\"bytes\"")) length = 7;
            break;
        }
    }
    if (length) {
        s->p += length;
        return 1;
    }
    const unsigned char *key = p + 1;
    if (!scan_string(s, escaped)) return 0;
    *is_logprob = s->p - 1 - key == 7 && memcmp(key, "logprob", 7) == 0;
    return 1;
}

static int scan_value(Scan *s, int depth);
static int read_double(const unsigned char *p, Py_ssize_t length, double *out);

/* An object or array at s->p (its opening bracket): 1 when valid, 0 otherwise. */
static int scan_container(Scan *s, int depth) {
    unsigned char close = *s->p == '{' ? '}' : ']';
    int object = close == '}';
    if (depth >= MAX_DEPTH) return 0;
    s->p++;
    skip_ws(s);
    if (s->p < s->end && *s->p == close) {
        s->p++;
        return 1;
    }
    for (;;) {
        if (object) {
            int escaped, is_logprob;
            if (s->p >= s->end || *s->p != '"' || !scan_key(s, &escaped, &is_logprob)) return 0;
            skip_ws(s);
            if (s->p >= s->end || *s->p != ':') return 0;
            s->p++;
            skip_ws(s);
        }
        if (!scan_value(s, depth + 1)) return 0;
        skip_ws(s);
        if (s->p >= s->end) return 0;
        if (*s->p == close) {
            s->p++;
            return 1;
        }
        if (*s->p != ',') return 0;
        s->p++;
        skip_ws(s);
    }
}

static inline int scan_literal(Scan *s, const char *word, Py_ssize_t length) {
    if (s->end - s->p < length || memcmp(s->p, word, (size_t)length) != 0) return 0;
    s->p += length;
    return 1;
}

/* Any JSON value at s->p (no whitespace before it): 1 when valid, 0 otherwise. */
static int scan_value(Scan *s, int depth) {
    if (s->p >= s->end) return 0;
    unsigned char c = *s->p;
    if (c == '"') {
        int escaped;
        return scan_string(s, &escaped);
    }
    if (c == '{' || c == '[') return scan_container(s, depth);
    if (c == '-' || (c >= '0' && c <= '9')) {
        const unsigned char *start = s->p;
        int is_float;
        if (!scan_number(s, &is_float)) return 0;
        Py_ssize_t length = s->p - start;
        /* a JSON parser refuses a number that is infinite as a double: read the ones that could
         * be (an exponent, or 300 digits and more) */
        if (length >= 300 || (is_float & EXPONENT)) {
            double value;
            return read_double(start, length, &value);
        }
        return 1;
    }
    if (c == 't') return scan_literal(s, "true", 4);
    if (c == 'f') return scan_literal(s, "false", 5);
    if (c == 'n') return scan_literal(s, "null", 4);
    return 0;
}

static const double POWERS_OF_TEN[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                       1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                       1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The double of a valid JSON number's `length` bytes at p, correctly rounded: 1, or 0 when it
 * is infinite (a JSON parser refuses it) or the text is longer than MAX_NUMBER.
 *
 * When the digits make an integer m <= 2**53 and the decimal exponent e is within +-22, m and
 * 10**|e| are exact doubles and one multiply or divide rounds correctly (Clinger's fast path;
 * it needs double evaluation, FLT_EVAL_METHOD 0, as on x86-64 and arm64): most logprobs. Other
 * numbers take PyOS_string_to_double, Python's own correctly rounded reader. */
static int read_double(const unsigned char *p, Py_ssize_t length, double *out) {
#if FLT_EVAL_METHOD == 0
    const unsigned char *q = p, *end = p + length;
    int negative = q < end && *q == '-';
    q += negative;
    uint64_t m = 0;
    int exact = 1, fraction = 0;
    for (; q < end && *q >= '0' && *q <= '9'; q++) {
        m = m * 10 + (uint64_t)(*q - '0');
        if (m > (1ULL << 53)) exact = 0;
        if (!exact) break;
    }
    if (exact && q < end && *q == '.') {
        for (q++; q < end && *q >= '0' && *q <= '9'; q++, fraction++) {
            m = m * 10 + (uint64_t)(*q - '0');
            if (m > (1ULL << 53)) {
                exact = 0;
                break;
            }
        }
    }
    long exponent = 0;
    if (exact && q < end && (*q == 'e' || *q == 'E')) {
        q++;
        int minus = q < end && *q == '-';
        if (q < end && (*q == '-' || *q == '+')) q++;
        for (; q < end && exponent < 1000; q++) exponent = exponent * 10 + (*q - '0');
        if (q < end) exact = 0; /* a huge exponent: the general reader */
        if (minus) exponent = -exponent;
    }
    exponent -= fraction;
    if (exact && exponent >= -22 && exponent <= 22) {
        double value = (double)m;
        value = exponent < 0 ? value / POWERS_OF_TEN[-exponent] : value * POWERS_OF_TEN[exponent];
        if (!isinf(value)) {
            *out = negative ? -value : value;
            return 1;
        }
    }
#endif
    if (length > MAX_NUMBER) return 0;
    char text[MAX_NUMBER + 1];
    memcpy(text, p, (size_t)length);
    text[length] = '\0';
    char *stop;
    double value = PyOS_string_to_double(text, &stop, NULL);
    if (value == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (stop != text + length || isinf(value) || isnan(value)) return 0;
    *out = value;
    return 1;
}

/* A float `logprob` value at s->p: 1 when sure of its float32, 0 otherwise (not a float, or
 * infinite as a double or a float32, where the full parse refuses or numpy warns). */
static int scan_logprob(Scan *s, float *logprob) {
    const unsigned char *start = s->p;
    int is_float;
    if (s->p >= s->end || !scan_number(s, &is_float) || !is_float) return 0;
    double value;
    if (!read_double(start, s->p - start, &value)) return 0;
    if (fabs(value) > FLT_MAX) return 0;
    *logprob = (float)value;
    return 1;
}

/* The float32 `logprob` of one entry at s->p (its opening brace): 1 when sure, 0 otherwise. */
static int scan_entry(Scan *s, float *logprob) {
    int found = 0;
    if (s->p >= s->end || *s->p != '{') return 0;
    s->p++;
    skip_ws(s);
    if (s->p < s->end && *s->p == '}') return 0; /* no logprob */
    for (;;) {
        int escaped, is_logprob;
        if (s->p >= s->end || *s->p != '"' || !scan_key(s, &escaped, &is_logprob) || escaped)
            return 0;
        skip_ws(s);
        if (s->p >= s->end || *s->p != ':') return 0;
        s->p++;
        skip_ws(s);
        if (is_logprob) {
            if (found || !scan_logprob(s, logprob)) return 0;
            found = 1;
        } else if (!scan_value(s, 1)) {
            return 0;
        }
        skip_ws(s);
        if (s->p >= s->end) return 0;
        if (*s->p == '}') {
            s->p++;
            return found;
        }
        if (*s->p != ',') return 0;
        s->p++;
        skip_ws(s);
    }
}

/* The entries of a chat `logprobs.content` array, from s->p (just after its '[') to its ']':
 * the count, or -1 when not sure. s->p is then at the ']'. */
static Py_ssize_t scan_chat(Scan *s, float *values, Py_ssize_t capacity) {
    Py_ssize_t n = 0;
    skip_ws(s);
    if (s->p < s->end && *s->p == ']') return 0;
    while (n < capacity && scan_entry(s, &values[n])) {
        n++;
        skip_ws(s);
        if (s->p >= s->end) return -1;
        if (*s->p == ']') return n;
        if (*s->p != ',') return -1;
        s->p++;
        skip_ws(s);
    }
    return -1;
}

/* The members of a completions `logprobs` object, from s->p (just after its '{') to its '}':
 * the count of its `token_logprobs`, a list of floats, or -1 when not sure (a null among them,
 * as for an echoed first token, an integer, the key missing, repeated or spelled with an
 * escape...). Every other member is validated, not read. s->p is then at the '}'. */
static Py_ssize_t scan_completion(Scan *s, float *values, Py_ssize_t capacity) {
    Py_ssize_t n = -1;
    skip_ws(s);
    for (;;) {
        const unsigned char *key = s->p + 1;
        int escaped;
        if (s->p >= s->end || *s->p != '"' || !scan_string(s, &escaped) || escaped) return -1;
        int is_values = s->p - 1 - key == 14 && memcmp(key, "token_logprobs", 14) == 0;
        skip_ws(s);
        if (s->p >= s->end || *s->p != ':') return -1;
        s->p++;
        skip_ws(s);
        if (is_values) {
            if (n >= 0 || s->p >= s->end || *s->p != '[') return -1;
            s->p++;
            skip_ws(s);
            n = 0;
            if (s->p < s->end && *s->p == ']') {
                s->p++;
            } else {
                for (;;) {
                    if (n >= capacity || !scan_logprob(s, &values[n])) return -1;
                    n++;
                    skip_ws(s);
                    if (s->p >= s->end) return -1;
                    if (*s->p == ']') {
                        s->p++;
                        break;
                    }
                    if (*s->p != ',') return -1;
                    s->p++;
                    skip_ws(s);
                }
            }
        } else if (!scan_value(s, 1)) {
            return -1;
        }
        skip_ws(s);
        if (s->p >= s->end) return -1;
        if (*s->p == '}') return n;
        if (*s->p != ',') return -1;
        s->p++;
        skip_ws(s);
    }
}

typedef Py_ssize_t (*Reader)(Scan *s, float *values, Py_ssize_t capacity);

/* `reader` over `data` from `start`: (where it stopped, float32 values), or None when not sure.
 * `per_value`: the fewest bytes one value takes, which bounds the count. */
static PyObject *read_logprobs(PyObject *const *args, Py_ssize_t nargs, Reader reader,
                               Py_ssize_t per_value) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "takes 2 arguments (data, start)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) != 0) {
        return NULL;
    }
    if (start < 0 || start > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "start is outside the data");
        return NULL;
    }
    const unsigned char *base = (const unsigned char *)view.buf;
    Scan s = {base + start, base + view.len};
    Py_ssize_t capacity = (view.len - start) / per_value + 1;
    PyObject *out = PyByteArray_FromStringAndSize(NULL, capacity * (Py_ssize_t)sizeof(float));
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t n = reader(&s, (float *)PyByteArray_AS_STRING(out), capacity);
    Py_ssize_t end = s.p - base;
    PyBuffer_Release(&view);
    if (n < 0) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    if (PyByteArray_Resize(out, n * (Py_ssize_t)sizeof(float)) != 0) {
        Py_DECREF(out);
        return NULL;
    }
    return Py_BuildValue("(nN)", end, out);
}

static PyObject *chat_logprobs(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return read_logprobs(args, nargs, scan_chat, 14); /* {"logprob":0.0} */
}

static PyObject *completion_logprobs(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return read_logprobs(args, nargs, scan_completion, 4); /* 0.0, */
}

static PyMethodDef methods[] = {
    {"parse_ids", parse_ids, METH_O,
     "parse_ids(data) -> bytearray | None: native int32 ids of a JSON id list's inner text."},
    {"chat_logprobs", (PyCFunction)(void (*)(void))chat_logprobs, METH_FASTCALL,
     "chat_logprobs(data, start) -> (end, bytearray) | None: the float32 logprobs of the chat\n"
     "entries from `start` (just after the array's '[') and where the array closes."},
    {"completion_logprobs", (PyCFunction)(void (*)(void))completion_logprobs, METH_FASTCALL,
     "completion_logprobs(data, start) -> (end, bytearray) | None: the float32 token_logprobs\n"
     "of the completions logprobs object from `start` (just after its '{') and where it closes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "tito_agents._speedups",
    "Optional C helper for reading token-id and logprob arrays (see _speedups.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }
