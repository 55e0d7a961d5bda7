/*
 * jpeg_size(data) (registered by cropjpeg.c's module): the frame header's size, for drawing a crop box
 * before decoding.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>

#include "header.h"

/* ---- The JPEG header's size, for drawing the crop box before decoding. ----
 *
 * jpeg_size(data) -> (height, width) or None
 *   None unless the data start with SOI, end with EOI (a truncated file does not), and have an 8-bit
 *   SOF0/1/2/9/10 frame (sequential or progressive, Huffman or arithmetic) with 1 or 3 components and a
 *   non-zero size before the first scan. Four components (CMYK, YCCK: libjpeg cannot give them as RGB),
 *   lossless and hierarchical frames, and anything malformed are None: the full decode takes them.
 * Why not simplejpeg.decode_jpeg_header: it sets up a whole libjpeg decompressor per call (~1.6 us in a
 * loop, ~5 us inside the recipe, where that memory is cold); this reads a few marker lengths.
 */
static int sof_marker(unsigned m)
{
    return m == 0xC0 || m == 0xC1 || m == 0xC2 || m == 0xC9 || m == 0xCA;
}

static int other_frame(unsigned m)
{
    return m >= 0xC3 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC && !sof_marker(m);
}

PyObject *jpeg_size(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *p = view.buf;
    size_t n = (size_t)view.len, i = 2;
    long height = 0, width = 0;
    if (n < 4 || p[0] != 0xFF || p[1] != 0xD8 || p[n - 2] != 0xFF || p[n - 1] != 0xD9)
        goto done;
    while (i + 4 <= n && p[i] == 0xFF) {
        unsigned m = p[i + 1];
        if (m == 0xFF) { /* fill byte */
            i++;
            continue;
        }
        if ((m >= 0xD0 && m <= 0xD7) || m == 0x01) { /* RSTn, TEM: no length */
            i += 2;
            continue;
        }
        if (m == 0xD8 || m == 0xD9 || m == 0xDA || other_frame(m))
            break; /* a scan (or the end) before any frame we take */
        size_t len = (size_t)p[i + 2] << 8 | p[i + 3];
        if (len < 2 || i + 2 + len > n)
            break;
        if (sof_marker(m)) {
            unsigned components = len >= 8 ? p[i + 9] : 0;
            if (len >= 8 && p[i + 4] == 8 && (components == 1 || components == 3)) {
                height = (long)p[i + 5] << 8 | p[i + 6];
                width = (long)p[i + 7] << 8 | p[i + 8];
            }
            break;
        }
        i += 2 + len;
    }
done:
    PyBuffer_Release(&view);
    if (height <= 0 || width <= 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(ll)", height, width);
}
