/* jpeg_size (header.c), registered by cropjpeg.c's module. */
#ifndef COORDL_JPEG_HEADER_H
#define COORDL_JPEG_HEADER_H

#include <Python.h>

PyObject *jpeg_size(PyObject *self, PyObject *arg);

#endif
