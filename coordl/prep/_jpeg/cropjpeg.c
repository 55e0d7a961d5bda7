/*
 * coordl.prep._cropjpeg: decode only a rectangle of a JPEG, optionally at a reduced DCT scale.
 *
 * Why this exists: a random-resized crop keeps about half of an image's pixels on average, yet a
 * full decode pays entropy decoding, IDCT, upsampling and colour conversion for all of them.
 * libjpeg-turbo's libjpeg API (>= 1.5) can skip the work outside a region:
 *   - scale_num / scale_denom decode at 1/2, 1/4 or 1/8 size in the DCT domain (smaller IDCTs);
 *   - jpeg_crop_scanline() limits IDCT, upsampling and colour conversion to the columns of a
 *     region (widened to the iMCU boundary on the left);
 *   - jpeg_skip_scanlines() skips the rows above the region (entropy decoding still runs for
 *     them, the rest does not), and nothing below the region is decoded at all.
 * simplejpeg and Pillow expose none of these, and the TurboJPEG API only gained cropped
 * decompression in 3.0 (Debian 12 ships 2.1.5), so this is a small extension against the libjpeg
 * API of Debian's libjpeg62-turbo.
 *
 * jpeg_size(data) -> (height, width) or None: the frame header's size (header.c).
 * decode_crop(data, top, left, height, width, denom, fastdct) -> (bytearray, rows, cols)
 *   The box (top, left, height, width) is in full-resolution pixels; the result is the box's pixels
 *   at scale 1/denom (HWC RGB uint8), the box edges rounded outwards to whole scaled pixels.
 *   Any libjpeg error or warning (corrupt or truncated data, CMYK, unsupported
 *   conversion) raises _cropjpeg.Error: the caller falls back to its full decode, which decides
 *   whether the file is corrupt.
 *   A restart-segmented file (coordl.prep.cropindex) is first cut down to the segments around the box
 *   (window.c), so that only they are entropy decoded; the pixels are the same.
 * add_restarts(data, segment_px) -> bytes: the lossless rewrite that makes such files (restarts.c).
 * The GIL is released while libjpeg works.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "header.h"
#include "jpegerr.h"
#include "restarts.h"
#include "window.h"

PyObject *CropJpegError;

#define READ_ROWS 16 /* rows asked of jpeg_read_scanlines at a time */

static PyObject *decode_crop(PyObject *self, PyObject *args)
{
    Py_buffer view;
    int top, left, height, width, denom, fastdct;
    if (!PyArg_ParseTuple(args, "y*iiiiip", &view, &top, &left, &height, &width, &denom, &fastdct))
        return NULL;
    if (denom != 1 && denom != 2 && denom != 4 && denom != 8) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "decode_crop: denom must be 1, 2, 4 or 8, got %d", denom);
        return NULL;
    }
    if (top < 0 || left < 0 || height <= 0 || width <= 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "decode_crop: the box needs top, left >= 0 and a positive size");
        return NULL;
    }

    struct jpeg_decompress_struct cinfo;
    struct error_mgr jerr;
    PyObject *volatile out = NULL;
    unsigned char *volatile row = NULL;
    PyThreadState *volatile ts = NULL;
    JDIMENSION rows = 0, cols = 0;
    struct window win = {NULL, 0, 0, 0};

    error_mgr_init(&jerr, (j_common_ptr)&cinfo);
    jpeg_create_decompress(&cinfo);

    if (setjmp(jerr.jump)) {
        if (ts != NULL)
            PyEval_RestoreThread(ts);
        jpeg_destroy_decompress(&cinfo);
        free(row);
        free(win.data);
        Py_XDECREF(out);
        PyBuffer_Release(&view);
        PyErr_SetString(CropJpegError, jerr.message);
        return NULL;
    }

    ts = PyEval_SaveThread();
    /* Fancy upsampling reads one chroma sample beyond a window's edge: keep 2 chroma samples (at the
     * decoded scale) between the box and the window's cut edges, so the box's pixels are the original's. */
    if (restart_window((const unsigned char *)view.buf, (size_t)view.len, (unsigned)top, (unsigned)left,
                       (unsigned)height, (unsigned)width, 8 * (unsigned)denom, &win)) {
        top -= (int)win.top;
        left -= (int)win.left;
        jpeg_mem_src(&cinfo, win.data, (unsigned long)win.len);
    } else {
        jpeg_mem_src(&cinfo, (const unsigned char *)view.buf, (unsigned long)view.len);
    }
    jpeg_read_header(&cinfo, TRUE);
    cinfo.out_color_space = JCS_RGB;
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)denom;
    cinfo.dct_method = fastdct ? JDCT_IFAST : JDCT_ISLOW;
    jpeg_start_decompress(&cinfo);
    if (cinfo.output_components != 3) {
        snprintf(jerr.message, sizeof jerr.message, "decode_crop: %d output components", cinfo.output_components);
        longjmp(jerr.jump, 1);
    }
    /* The box in scaled pixels, rounded outwards; clamped to the scaled image. */
    JDIMENSION full_w = cinfo.image_width, full_h = cinfo.image_height;
    JDIMENSION out_w = cinfo.output_width, out_h = cinfo.output_height;
    if ((JDIMENSION)left + (JDIMENSION)width > full_w || (JDIMENSION)top + (JDIMENSION)height > full_h) {
        snprintf(jerr.message, sizeof jerr.message, "decode_crop: box %dx%d+%d+%d outside the %ux%u image",
                 width, height, left, top, full_w, full_h);
        longjmp(jerr.jump, 1);
    }
    JDIMENSION x0 = (JDIMENSION)left / denom, y0 = (JDIMENSION)top / denom;
    JDIMENSION x1 = ((JDIMENSION)left + width + denom - 1) / denom;
    JDIMENSION y1 = ((JDIMENSION)top + height + denom - 1) / denom;
    if (x1 > out_w) x1 = out_w;
    if (y1 > out_h) y1 = out_h;
    if (x1 <= x0) x1 = x0 + 1;
    if (y1 <= y0) y1 = y0 + 1;
    rows = y1 - y0;
    cols = x1 - x0;
    /* Fancy upsampling of subsampled chroma reads one chroma sample beyond each edge of the decoded
     * columns (and replicates the edge one where there is none): decode a margin of two chroma samples
     * on both sides so the box's own pixels equal a full decode's. */
    JDIMENSION margin = 2 * (JDIMENSION)cinfo.max_h_samp_factor;
    JDIMENSION xoff = x0 > margin ? x0 - margin : 0;
    JDIMENSION cw = (x1 + margin < out_w ? x1 + margin : out_w) - xoff;
    if (cw < out_w)
        jpeg_crop_scanline(&cinfo, &xoff, &cw); /* widens to the iMCU boundary: xoff <= x0 */
    else
        xoff = 0, cw = out_w;
    row = malloc((size_t)cw * 3 * READ_ROWS);
    PyEval_RestoreThread(ts);
    ts = NULL;

    out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)rows * cols * 3);
    if (out == NULL || row == NULL) {
        jpeg_destroy_decompress(&cinfo);
        free(row);
        free(win.data);
        Py_XDECREF(out);
        PyBuffer_Release(&view);
        return out == NULL ? NULL : PyErr_NoMemory();
    }
    unsigned char *dst = (unsigned char *)PyByteArray_AsString(out);
    size_t shift = (size_t)(x0 - xoff) * 3, line = (size_t)cols * 3;

    ts = PyEval_SaveThread();
    if (y0 > 0 && jpeg_skip_scanlines(&cinfo, y0) != y0) {
        snprintf(jerr.message, sizeof jerr.message, "decode_crop: could not skip %u rows", y0);
        longjmp(jerr.jump, 1);
    }
    /* Several rows per call (libjpeg returns at most a row group's worth: fewer calls through its
     * controllers); straight into the output when the decoded columns are the box's. */
    int direct = shift == 0 && cw == cols;
    for (JDIMENSION r = 0; r < rows;) {
        JSAMPROW targets[READ_ROWS];
        JDIMENSION want = rows - r < READ_ROWS ? rows - r : READ_ROWS;
        for (JDIMENSION i = 0; i < want; i++)
            targets[i] = direct ? dst + (r + i) * line : row + (size_t)i * cw * 3;
        JDIMENSION got = jpeg_read_scanlines(&cinfo, targets, want);
        if (got == 0) {
            snprintf(jerr.message, sizeof jerr.message, "decode_crop: no data for row %u", y0 + r);
            longjmp(jerr.jump, 1);
        }
        for (JDIMENSION i = 0; !direct && i < got; i++)
            memcpy(dst + (r + i) * line, targets[i] + shift, line);
        if (jerr.warned)
            longjmp(jerr.jump, 1);
        r += got;
    }
    jpeg_abort_decompress(&cinfo); /* the rows below the box are never decoded */
    PyEval_RestoreThread(ts);
    ts = NULL;

    jpeg_destroy_decompress(&cinfo);
    free(row);
    free(win.data);
    PyBuffer_Release(&view);
    return Py_BuildValue("(NII)", out, (unsigned int)rows, (unsigned int)cols);
}

/* ---- The last stages of the training recipe: [flip +] ToTensor + Normalize in one pass. ----
 *
 * to_chw_float(src, height, width, out, scale0, scale1, scale2, shift0, shift1, shift2, flip) -> None
 *   src: C-contiguous HWC uint8 RGB (height x width x 3); out: writable float32 buffer of 3 x height x
 *   width (CHW). out[c][y][x] = src[y][x'][c] * scale[c] + shift[c], x' = width - 1 - x when flip.
 * Why: torch does this as a strided uint8 -> float copy of the permuted HWC view, then a multiply and an
 * add over the 600 KB float tensor (three passes, the first with 3-byte strides: ~0.06 ms for 224x224
 * here); this is one pass. The multiply and the add round separately (the module is compiled with
 * -ffp-contract=off), so the result is bit-identical to torch's mul_ then add_ on the float32 values.
 */
#if defined(__GNUC__) && defined(__x86_64__) && defined(__GLIBC__) && !defined(__clang__) /* ifunc */
#define CHW_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CHW_CLONES
#endif

/* One row, left to right (vectorized by gcc: the grouped 3-byte loads become shuffles). */
CHW_CLONES
static void chw_float_row(const unsigned char *restrict s, float *restrict r0, float *restrict r1,
                          float *restrict r2, size_t w, const float *restrict k, const float *restrict b)
{
    const float k0 = k[0], k1 = k[1], k2 = k[2], b0 = b[0], b1 = b[1], b2 = b[2];
    for (size_t x = 0; x < w; x++) {
        r0[x] = (float)s[3 * x] * k0 + b0;
        r1[x] = (float)s[3 * x + 1] * k1 + b1;
        r2[x] = (float)s[3 * x + 2] * k2 + b2;
    }
}

/* dst = src mirrored (a reversed contiguous load: vectorized, unlike a grouped reversed store). */
CHW_CLONES
static void reverse_floats(const float *restrict src, float *restrict dst, size_t w)
{
    for (size_t x = 0; x < w; x++)
        dst[x] = src[w - 1 - x];
}

/* tmp: 3 * w floats of scratch, used only when flip. */
static void chw_float_rows(const unsigned char *src, float *out, float *tmp, size_t h, size_t w,
                           const float *k, const float *b, int flip)
{
    for (size_t y = 0; y < h; y++) {
        const unsigned char *s = src + y * w * 3;
        float *r0 = out + y * w, *r1 = r0 + h * w, *r2 = r1 + h * w;
        if (!flip) {
            chw_float_row(s, r0, r1, r2, w, k, b);
            continue;
        }
        chw_float_row(s, tmp, tmp + w, tmp + 2 * w, w, k, b);
        reverse_floats(tmp, r0, w);
        reverse_floats(tmp + w, r1, w);
        reverse_floats(tmp + 2 * w, r2, w);
    }
}

static PyObject *to_chw_float(PyObject *self, PyObject *args)
{
    Py_buffer src, out;
    Py_ssize_t h, w;
    float k[3], b[3];
    int flip;
    if (!PyArg_ParseTuple(args, "y*nnw*ffffffp", &src, &h, &w, &out, &k[0], &k[1], &k[2], &b[0], &b[1],
                          &b[2], &flip))
        return NULL;
    if (h <= 0 || w <= 0 || src.len != h * w * 3 || out.len != h * w * 3 * (Py_ssize_t)sizeof(float)) {
        PyErr_Format(PyExc_ValueError,
                     "to_chw_float: %zd source bytes and %zd output bytes do not fit a %zdx%zd RGB image",
                     src.len, out.len, h, w);
        PyBuffer_Release(&src);
        PyBuffer_Release(&out);
        return NULL;
    }
    float *tmp = flip ? malloc((size_t)w * 3 * sizeof(float)) : NULL;
    if (flip && tmp == NULL) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&out);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    chw_float_rows((const unsigned char *)src.buf, (float *)out.buf, tmp, (size_t)h, (size_t)w, k, b, flip);
    Py_END_ALLOW_THREADS
    free(tmp);
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

static PyObject *has_restart_grid(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int yes = restart_grid((const unsigned char *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyBool_FromLong(yes);
}

static PyMethodDef methods[] = {
    {"jpeg_size", jpeg_size, METH_O,
     "jpeg_size(data) -> (height, width) or None\n\n"
     "The size in a JPEG's frame header, or None where the crop decoder does not take the file."},
    {"decode_crop", decode_crop, METH_VARARGS,
     "decode_crop(data, top, left, height, width, denom, fastdct) -> (bytearray, rows, cols)\n\n"
     "The RGB pixels of a box of a JPEG (full-resolution coordinates) at scale 1/denom."},
    {"add_restarts", add_restarts, METH_VARARGS,
     "add_restarts(data, segment_px) -> bytes\n\n"
     "The same JPEG, losslessly, as a baseline file whose restart segments form a grid of at most\n"
     "segment_px-wide cells (what decode_crop cuts a box's segments from)."},
    {"has_restart_grid", has_restart_grid, METH_O,
     "has_restart_grid(data) -> bool\n\n"
     "Whether decode_crop can cut a box's restart segments out of this JPEG (a crop-indexed file)."},
    {"to_chw_float", to_chw_float, METH_VARARGS,
     "to_chw_float(src, height, width, out, scale0, scale1, scale2, shift0, shift1, shift2, flip) -> None\n\n"
     "HWC uint8 RGB -> CHW float32 x * scale + shift per channel, mirrored left-right when flip."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cropjpeg", "Decode a rectangle of a JPEG with libjpeg-turbo.", -1, methods,
};

PyMODINIT_FUNC PyInit__cropjpeg(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    CropJpegError = PyErr_NewException("_cropjpeg.Error", PyExc_ValueError, NULL);
    if (CropJpegError == NULL || PyModule_AddObject(m, "Error", CropJpegError) < 0) {
        Py_XDECREF(CropJpegError);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "LIBJPEG_TURBO", 1);
    return m;
}
