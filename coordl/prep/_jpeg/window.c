/*
 * Entropy-decode only the restart segments a crop box touches.
 *
 * Why: in a baseline JPEG the Huffman-coded data of every MCU before the box's last row must be
 * decoded to find where the box's own data start, and that entropy decoding is 70-80% of the decode
 * of a 500x375 quality-90 image. A restart marker (RSTn) ends a segment of a fixed number of MCUs,
 * resets the DC predictors and byte-aligns the data, so each segment decodes on its own. When the
 * restart interval divides the MCUs of a row (coordl.prep.cropindex writes such files losslessly),
 * the segments form a grid, and the segments of the rows and columns around a box, joined with
 * renumbered markers under a frame header of the window's size, are a valid JPEG whose pixels are
 * the original's: the same coefficients, the same IDCT. Nothing outside the window is entropy
 * decoded; the rows below it are not even scanned.
 *
 * Taken: 8-bit Huffman sequential frames (SOF0/SOF1) of 1, 3 or 4 components (4: CMYK, which the crop
 * decoder's caller never sends, but coordl crop-index asks has_restart_grid about), one scan holding every
 * component, a DRI whose interval divides the MCUs per row, RST markers in sequence. Anything else returns 0 and the caller
 * decodes the original (which judges corrupt data as before).
 */
#include "window.h"

#include <stdlib.h>
#include <string.h>

struct frame {
    size_t sof;      /* offset of the SOF marker */
    size_t head_end; /* first byte of entropy-coded data */
    unsigned height, width, mcu_h, mcu_w, interval;
};

static unsigned be16(const unsigned char *p) { return (unsigned)p[0] << 8 | p[1]; }

/* The markers up to the first scan: 1 when the file is one the window can be cut from. */
static int read_frame(const unsigned char *p, size_t n, struct frame *f)
{
    size_t i = 2;
    unsigned components = 0, hmax = 1, vmax = 1;
    memset(f, 0, sizeof *f);
    if (n < 4 || p[0] != 0xFF || p[1] != 0xD8)
        return 0;
    while (i + 4 <= n) {
        if (p[i] != 0xFF)
            return 0;
        unsigned m = p[i + 1];
        if (m == 0xFF) { /* fill byte */
            i++;
            continue;
        }
        size_t len = be16(p + i + 2);
        if (len < 2 || i + 2 + len > n)
            return 0;
        if (m == 0xC0 || m == 0xC1) {
            if (len < 8 || p[i + 4] != 8 || f->sof)
                return 0;
            components = p[i + 9];
            if ((components != 1 && components != 3 && components != 4) || len != 8 + 3 * components)
                return 0;
            f->sof = i;
            f->height = be16(p + i + 5);
            f->width = be16(p + i + 7);
            for (unsigned c = 0; c < components; c++) {
                unsigned hv = p[i + 11 + 3 * c], h = hv >> 4, v = hv & 15;
                if (h < 1 || h > 4 || v < 1 || v > 4)
                    return 0;
                hmax = h > hmax ? h : hmax;
                vmax = v > vmax ? v : vmax;
            }
        } else if (m >= 0xC2 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
            return 0; /* progressive, lossless, arithmetic or hierarchical */
        } else if (m == 0xDD) {
            if (len != 4)
                return 0;
            f->interval = be16(p + i + 4);
        } else if (m == 0xDA) {
            if (!f->sof || f->height == 0 || f->width == 0 || len < 6 || p[i + 4] != components)
                return 0; /* a scan without every component: more than one scan */
            f->head_end = i + 2 + len;
            break;
        } else if (m == 0xD8 || m == 0xD9 || (m >= 0xD0 && m <= 0xD7) || m == 0x01) {
            return 0;
        }
        i += 2 + len;
    }
    if (!f->head_end || f->interval == 0)
        return 0;
    /* One component: its scan is not interleaved, an MCU is one 8x8 block of it. */
    f->mcu_w = components == 1 ? 8 : 8 * hmax;
    f->mcu_h = components == 1 ? 8 : 8 * vmax;
    unsigned per_row = (f->width + f->mcu_w - 1) / f->mcu_w;
    return per_row % f->interval == 0;
}

static unsigned min_u(unsigned a, unsigned b) { return a < b ? a : b; }

int restart_grid(const unsigned char *p, size_t n)
{
    struct frame f;
    return read_frame(p, n, &f);
}

int restart_window(const unsigned char *p, size_t n, unsigned top, unsigned left, unsigned height,
                   unsigned width, unsigned margin, struct window *out)
{
    struct frame f;
    if (!read_frame(p, n, &f) || top > f.height || height > f.height - top || left > f.width ||
        width > f.width - left)
        return 0;
    unsigned seg_w = f.interval * f.mcu_w;
    unsigned mcu_rows = (f.height + f.mcu_h - 1) / f.mcu_h;
    unsigned segs_per_row = (f.width + f.mcu_w - 1) / f.mcu_w / f.interval;
    unsigned r0 = (top > margin ? top - margin : 0) / f.mcu_h;
    unsigned r1 = min_u((top + height + margin + f.mcu_h - 1) / f.mcu_h, mcu_rows);
    unsigned c0 = (left > margin ? left - margin : 0) / seg_w;
    unsigned c1 = min_u((left + width + margin + seg_w - 1) / seg_w, segs_per_row);
    if (r0 == 0 && r1 == mcu_rows && c0 == 0 && c1 == segs_per_row)
        return 0; /* the whole image: nothing to cut */

    /* Where each segment starts, up to the end of the window's last row (the markers in sequence). */
    size_t last = (size_t)r1 * segs_per_row, count = 0;
    size_t *start = malloc((last + 1) * sizeof *start);
    if (start == NULL)
        return 0;
    start[0] = f.head_end;
    const unsigned char *q = p + f.head_end, *end = p + n;
    while (count + 1 < last + 1) {
        q = memchr(q, 0xFF, (size_t)(end - q));
        if (q == NULL || q + 1 >= end)
            goto fail;
        unsigned m = q[1];
        if (m == 0x00 || m == 0xFF) { /* a stuffed 0xFF byte, or fill */
            q += m == 0x00 ? 2 : 1;
            continue;
        }
        if (m == 0xD9 && count + 1 == last && last == (size_t)mcu_rows * segs_per_row) {
            start[++count] = (size_t)(q - p) + 2; /* the last segment ends at EOI */
            break;
        }
        if (m != 0xD0 + (count & 7))
            goto fail; /* another marker, or RSTs out of sequence: leave it to libjpeg */
        q += 2;
        start[++count] = (size_t)(q - p);
    }
    /* start[i + 1] - 2 is where segment i's data end (its RST or the EOI marker). */
    size_t size = f.head_end + 2, rows = r1 - r0, cols = c1 - c0;
    for (size_t r = r0; r < r1; r++)
        size += start[r * segs_per_row + c1] - start[r * segs_per_row + c0];
    unsigned char *w = malloc(size);
    if (w == NULL)
        goto fail;
    memcpy(w, p, f.head_end);
    unsigned win_h = min_u(r1 * f.mcu_h, f.height) - r0 * f.mcu_h;
    unsigned win_w = min_u(c1 * seg_w, f.width) - c0 * seg_w;
    w[f.sof + 5] = (unsigned char)(win_h >> 8), w[f.sof + 6] = (unsigned char)win_h;
    w[f.sof + 7] = (unsigned char)(win_w >> 8), w[f.sof + 8] = (unsigned char)win_w;
    size_t o = f.head_end, k = 0;
    for (size_t r = r0; r < r1; r++) {
        for (size_t c = c0; c < c1; c++, k++) {
            size_t i = r * segs_per_row + c, len = start[i + 1] - 2 - start[i];
            memcpy(w + o, p + start[i], len);
            o += len;
            if (k + 1 < rows * cols) {
                w[o++] = 0xFF;
                w[o++] = (unsigned char)(0xD0 + (k & 7));
            }
        }
    }
    w[o++] = 0xFF;
    w[o++] = 0xD9;
    free(start);
    out->data = w;
    out->len = o;
    out->top = r0 * f.mcu_h;
    out->left = c0 * seg_w;
    return 1;
fail:
    free(start);
    return 0;
}
