/*
 * add_restarts(data, segment_px) -> bytes: the same JPEG, losslessly, as a baseline file with a
 * restart marker every `interval` MCUs, where interval is the largest divisor of the MCUs per row whose
 * segment is at most segment_px pixels wide (at least one MCU).
 *
 * Why: window.c cuts the restart segments a crop box needs out of such a file, so the crop decoder
 * entropy-decodes only those. The DCT coefficients are read and written as they are (libjpeg's
 * jpeg_read_coefficients / jpeg_write_coefficients, as jpegtran does): every decoder gives the same
 * pixels as from the original. Progressive and arithmetic-coded input comes out as baseline Huffman
 * (optimized tables); APPn and COM markers (EXIF, ICC profiles) are kept, except the JFIF and Adobe
 * markers libjpeg writes itself.
 * Any libjpeg error or warning (corrupt or truncated data) raises _cropjpeg.Error: the caller keeps the
 * original file.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "jpegerr.h"
#include "restarts.h"

static int is_written_by_libjpeg(const struct jpeg_marker_struct *m, const struct jpeg_compress_struct *c)
{
    if (c->write_JFIF_header && m->marker == JPEG_APP0 && m->data_length >= 5 &&
        memcmp(m->data, "JFIF", 5) == 0)
        return 1;
    if (c->write_Adobe_marker && m->marker == JPEG_APP0 + 14 && m->data_length >= 5 &&
        memcmp(m->data, "Adobe", 5) == 0)
        return 1;
    return 0;
}

static unsigned restart_interval(unsigned per_row, unsigned mcu_w, unsigned segment_px)
{
    unsigned target = segment_px / mcu_w, best = 1;
    for (unsigned k = 1; k <= target && k <= per_row; k++)
        if (per_row % k == 0)
            best = k;
    return best;
}

PyObject *add_restarts(PyObject *self, PyObject *args)
{
    Py_buffer view;
    unsigned int segment_px;
    if (!PyArg_ParseTuple(args, "y*I", &view, &segment_px))
        return NULL;

    struct jpeg_decompress_struct d;
    struct jpeg_compress_struct c;
    struct error_mgr err; /* shared by both structs, as they are used one at a time */
    unsigned char *volatile buf = NULL;
    unsigned long size = 0;
    PyThreadState *volatile ts = NULL;

    error_mgr_init(&err, (j_common_ptr)&d);
    c.err = d.err;
    jpeg_create_decompress(&d);
    jpeg_create_compress(&c);
    if (setjmp(err.jump)) {
        if (ts != NULL)
            PyEval_RestoreThread(ts);
        const char *why = err.message;
        jpeg_destroy_compress(&c);
        jpeg_destroy_decompress(&d);
        free(buf);
        PyBuffer_Release(&view);
        PyErr_SetString(CropJpegError, why);
        return NULL;
    }

    ts = PyEval_SaveThread();
    jpeg_mem_src(&d, (const unsigned char *)view.buf, (unsigned long)view.len);
    jpeg_save_markers(&d, JPEG_COM, 0xFFFF);
    for (int m = 0; m < 16; m++)
        jpeg_save_markers(&d, JPEG_APP0 + m, 0xFFFF);
    jpeg_read_header(&d, TRUE);
    jvirt_barray_ptr *coefs = jpeg_read_coefficients(&d);
    if (err.warned)
        longjmp(err.jump, 1);

    jpeg_mem_dest(&c, (unsigned char **)&buf, &size);
    jpeg_copy_critical_parameters(&d, &c);
    c.optimize_coding = TRUE;
    unsigned mcu_w = c.num_components == 1 ? 8 : 8 * (unsigned)d.max_h_samp_factor;
    unsigned per_row = (c.image_width + mcu_w - 1) / mcu_w;
    c.restart_interval = restart_interval(per_row, mcu_w, segment_px);
    jpeg_write_coefficients(&c, coefs);
    for (jpeg_saved_marker_ptr m = d.marker_list; m != NULL; m = m->next)
        if (!is_written_by_libjpeg(m, &c))
            jpeg_write_marker(&c, m->marker, m->data, m->data_length);
    jpeg_finish_compress(&c);
    jpeg_finish_decompress(&d);
    if (err.warned)
        longjmp(err.jump, 1);
    PyEval_RestoreThread(ts);
    ts = NULL;

    jpeg_destroy_compress(&c);
    jpeg_destroy_decompress(&d);
    PyBuffer_Release(&view);
    PyObject *out = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)size);
    free(buf);
    return out;
}
