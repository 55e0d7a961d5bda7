/*
 * The libjpeg error manager shared by decode_crop (cropjpeg.c) and add_restarts (restarts.c).
 * An error formats its message and longjmps to the caller. A warning (corrupt data, premature end of
 * data) is kept as the message and counted: the caller treats it as an error, so that a damaged file
 * is judged by the full decode and never rewritten into a silently damaged copy.
 */
#include "jpegerr.h"

static void on_error(j_common_ptr cinfo)
{
    struct error_mgr *err = (struct error_mgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level)
{
    struct error_mgr *err = (struct error_mgr *)cinfo->err;
    if (level < 0 && !err->warned) {
        err->warned = 1;
        (*cinfo->err->format_message)(cinfo, err->message);
    }
}

void error_mgr_init(struct error_mgr *err, j_common_ptr cinfo)
{
    cinfo->err = jpeg_std_error(&err->pub);
    err->pub.error_exit = on_error;
    err->pub.emit_message = on_message;
    err->warned = 0;
    err->message[0] = '\0';
}
