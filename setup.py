"""Builds coordl's one optional C extension; everything else is in pyproject.toml.

``coordl.data._cropjpeg`` decodes only the region of a JPEG that a random crop keeps, against the system
libjpeg-turbo (Debian: libjpeg62-turbo-dev, in scripts/setup.sh's APT_PACKAGES). It is optional: without a
compiler or the headers the install succeeds and coordl falls back to full decodes (one warning at run time).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "coordl.data._cropjpeg",
            [f"coordl/data/_jpeg/{name}.c" for name in ("cropjpeg", "header", "jpegerr", "restarts", "window")],
            libraries=["jpeg"],
            extra_compile_args=["-O3", "-ffp-contract=off"],
            optional=True,
        )
    ]
)
