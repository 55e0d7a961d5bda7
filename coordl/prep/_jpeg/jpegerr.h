/* The libjpeg error manager of the extension (jpegerr.c): errors longjmp, warnings count as errors. */
#ifndef COORDL_JPEG_JPEGERR_H
#define COORDL_JPEG_JPEGERR_H

#include <setjmp.h>
#include <stdio.h>

#include <jpeglib.h>

struct error_mgr {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int warned;
    char message[JMSG_LENGTH_MAX];
};

/* Sets up err for cinfo (a decompress or compress struct; one err may serve both, one at a time). The
 * caller then setjmp(err->jump); an error or a warning leaves its text in err->message. */
void error_mgr_init(struct error_mgr *err, j_common_ptr cinfo);

#endif
