"""The crop decoder's loader tests run on the packed-source tests' tiny ImageFolder."""

from tests.coordl.packed.conftest import image_root  # noqa: F401 (a fixture)
