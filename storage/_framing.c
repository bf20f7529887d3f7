/* storage._framing: the record-framing walk of storage.records.check_record_framing in C.
 *
 * A leader walks every record's length prefix before it appends a batch (so that a
 * well-checksummed batch of garbage cannot reach consumers). In Python that walk costs about
 * 450 ns per record, the largest single cost of a produce request; here it is a few ns.
 * storage/records.py keeps the Python walk as the reference and the fallback when this
 * module is not built; tests/storage/test_framing_native.py checks that both agree.
 *
 * record_count(section) -> int: the number of records whose zigzag-varint length prefixes
 * tile ``section`` (a bytes-like records section, already decompressed) exactly, or -1 when
 * they do not: a prefix that overflows 32 bits, is longer than 5 bytes or runs past the end,
 * a body shorter than the smallest possible record (6 bytes), or a last body that runs past
 * the end.
 *
 * checked_header(buf, pos, crc32c, walk_max) -> the 13 fields of the v2 batch header at ``pos``
 * (storage.batch.BatchHeader's order) when storage.batch.validate_batch would accept the
 * batch: the header fits and has magic 2, the declared length fits ``buf`` and covers the
 * header, the CRC-32C (``crc32c``, the crc32c package's function, called on a view of the
 * covered bytes) matches, base offset, last offset delta and record count are not negative
 * and the codec id is known. With ``walk_max`` at least 0, an uncompressed batch must also
 * have a records section of at most ``walk_max`` bytes that passes record_count's walk with
 * exactly its declared record count (storage.records.check_record_framing's test; -1: no
 * walk). None otherwise: the caller runs the Python reference, which says what is wrong. A
 * produce request's batch costs one call here instead of about a dozen Python calls
 * (storage/log.py, Log._validate). ``crc32c`` must not keep its argument: the view is over
 * ``buf``'s memory, which is only held for the duration of the call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define MIN_RECORD_BODY_BYTES 6
#define VARINT_MAX_BYTES 5

static Py_ssize_t walk(const unsigned char *data, Py_ssize_t end)
{
    Py_ssize_t at = 0, count = 0;
    while (at < end) {
        uint64_t raw = 0;
        int shift = 0, done = 0;
        Py_ssize_t limit = at + VARINT_MAX_BYTES < end ? at + VARINT_MAX_BYTES : end;
        while (at < limit) {
            unsigned char byte = data[at++];
            raw |= (uint64_t)(byte & 0x7F) << shift;
            if (byte < 0x80) {
                done = 1;
                break;
            }
            shift += 7;
        }
        if (!done || (raw >> 32) != 0)
            return -1;
        int64_t length = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
        if (length < MIN_RECORD_BODY_BYTES)
            return -1;
        if (length > end - at)
            return -1;
        at += (Py_ssize_t)length;
        count += 1;
    }
    return count;
}

static PyObject *record_count(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    /* The GIL stays held: a walk takes microseconds, less than handing the GIL over. */
    Py_ssize_t count = walk((const unsigned char *)view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(count);
}

#define HEADER_SIZE 61
#define LOG_OVERHEAD 12
#define CRC_START 21
#define MAGIC_V2 2
#define CODEC_MASK 0x07
#define MAX_CODEC_ID 4

static uint64_t be(const unsigned char *p, int bytes)
{
    uint64_t value = 0;
    for (int i = 0; i < bytes; i++)
        value = (value << 8) | p[i];
    return value;
}

static PyObject *checked_fields(const unsigned char *data, Py_ssize_t size, Py_ssize_t pos,
                                PyObject *crc, Py_ssize_t walk_max)
{
    if (pos < 0 || pos > size || size - pos < HEADER_SIZE)
        Py_RETURN_NONE;
    const unsigned char *h = data + pos;
    int64_t base_offset = (int64_t)be(h, 8);
    int32_t length = (int32_t)be(h + 8, 4);
    int32_t epoch = (int32_t)be(h + 12, 4);
    int8_t magic = (int8_t)h[16];
    uint32_t crc_field = (uint32_t)be(h + 17, 4);
    int16_t attributes = (int16_t)be(h + 21, 2);
    int32_t last_offset_delta = (int32_t)be(h + 23, 4);
    int64_t base_timestamp = (int64_t)be(h + 27, 8);
    int64_t max_timestamp = (int64_t)be(h + 35, 8);
    int64_t producer_id = (int64_t)be(h + 43, 8);
    int16_t producer_epoch = (int16_t)be(h + 51, 2);
    int32_t base_sequence = (int32_t)be(h + 53, 4);
    int32_t record_count_field = (int32_t)be(h + 57, 4);
    if (magic != MAGIC_V2 || length < HEADER_SIZE - LOG_OVERHEAD ||
        (Py_ssize_t)length + LOG_OVERHEAD > size - pos)
        Py_RETURN_NONE;
    if (base_offset < 0 || last_offset_delta < 0 || record_count_field < 0 ||
        (attributes & CODEC_MASK) > MAX_CODEC_ID)
        Py_RETURN_NONE;
    Py_ssize_t end = (Py_ssize_t)length + LOG_OVERHEAD;
    PyObject *covered =
        PyMemoryView_FromMemory((char *)h + CRC_START, end - CRC_START, PyBUF_READ);
    if (covered == NULL)
        return NULL;
    PyObject *computed = PyObject_CallOneArg(crc, covered);
    Py_DECREF(covered);
    if (computed == NULL)
        return NULL;
    unsigned long actual = PyLong_AsUnsignedLong(computed);
    Py_DECREF(computed);
    if (actual == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    if (actual != crc_field)
        Py_RETURN_NONE;
    if (walk_max >= 0 && (attributes & CODEC_MASK) == 0 &&
        (end - HEADER_SIZE > walk_max ||
         walk(h + HEADER_SIZE, end - HEADER_SIZE) != record_count_field))
        Py_RETURN_NONE;
    return Py_BuildValue("(LiibkhiLLLhii)", (long long)base_offset, (int)length, (int)epoch,
                         (int)magic, (unsigned long)crc_field, (short)attributes,
                         (int)last_offset_delta, (long long)base_timestamp,
                         (long long)max_timestamp, (long long)producer_id,
                         (short)producer_epoch, (int)base_sequence, (int)record_count_field);
}

static PyObject *checked_header(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "checked_header(buf, pos, crc32c, walk_max)");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t walk_max = PyLong_AsSsize_t(args[3]);
    if (walk_max == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result = checked_fields((const unsigned char *)view.buf, view.len, pos, args[2],
                                      walk_max);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"checked_header", (PyCFunction)(void (*)(void))checked_header, METH_FASTCALL,
     "checked_header(buf, pos, crc32c, walk_max) -> the batch header's 13 fields, or None"},
    {"record_count", record_count, METH_O,
     "record_count(section) -> number of records whose length prefixes tile section, or -1"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "storage._framing",
    "The record-framing walk and the batch header check, compiled (see the source).", -1, methods,
};

PyMODINIT_FUNC PyInit__framing(void) { return PyModule_Create(&module); }
