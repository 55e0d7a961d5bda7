/* add_restarts (restarts.c), registered by cropjpeg.c's module. */
#ifndef COORDL_JPEG_RESTARTS_H
#define COORDL_JPEG_RESTARTS_H

#include <Python.h>

extern PyObject *CropJpegError;
PyObject *add_restarts(PyObject *self, PyObject *args);

#endif
