"""Builds coordl's two optional C extensions; everything else is in pyproject.toml.

``coordl.prep._cropjpeg`` decodes only the region of a JPEG that a random crop keeps, against the system
libjpeg-turbo (Debian: libjpeg62-turbo-dev, in scripts/setup.sh's APT_PACKAGES). It is optional: without a
compiler or the headers the install succeeds and coordl falls back to full decodes (one warning at run time).

``coordl.fileread._readahead`` reads whole files in native threads, for a loader worker's read-ahead (see
coordl/fileread/read.py); without it the read-ahead uses Python threads.

scripts/wheel.sh builds the wheel users install (manylinux, libjpeg vendored by auditwheel). The wheel is per
Python version, not abi3: both extensions take buffers (``y*``/``w*``: zero-copy from cache rows and into output
tensors), and ``Py_buffer`` joined the limited API only in 3.11, while coordl supports 3.10.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "coordl.prep._cropjpeg",
            [
                f"coordl/prep/_jpeg/{name}.c"
                for name in ("cropjpeg", "header", "jpegerr", "restarts", "window")
            ],
            # The headers too, so that the sdist carries them (a wheel built from it otherwise lacks the decoder)
            # and a changed header rebuilds.
            depends=[f"coordl/prep/_jpeg/{name}.h" for name in ("header", "jpegerr", "restarts", "window")],
            libraries=["jpeg"],
            extra_compile_args=["-O3", "-ffp-contract=off"],
            optional=True,
        ),
        Extension(
            "coordl.fileread._readahead",
            ["coordl/fileread/readahead.c"],
            extra_compile_args=["-O2", "-pthread"],
            extra_link_args=["-pthread"],
            optional=True,
        ),
    ]
)
