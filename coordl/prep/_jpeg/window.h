/* A smaller JPEG holding only the restart segments a box needs (see window.c). */
#ifndef COORDL_JPEG_WINDOW_H
#define COORDL_JPEG_WINDOW_H

#include <stddef.h>

struct window {
    unsigned char *data; /* malloc'd JPEG: the original's header with the window's size, its segments, EOI */
    size_t len;
    unsigned top, left;  /* the window's origin in the original image, in full-resolution pixels */
};

/* 1 and *out filled when the data are a restart-segmented baseline JPEG (see window.c) and a window
 * smaller than the image covers the box widened by margin pixels on each side; 0 otherwise (decode the
 * original). No Python calls: safe without the GIL. */
int restart_window(const unsigned char *p, size_t n, unsigned top, unsigned left, unsigned height,
                   unsigned width, unsigned margin, struct window *out);

/* 1 when the data are a JPEG the window can be cut from (a crop-indexed file), else 0. */
int restart_grid(const unsigned char *p, size_t n);

#endif
