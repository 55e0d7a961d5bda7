"""The packer's tests run on the packed-source tests' tiny ImageFolder and its LMDB pack."""

from tests.coordl.packed.conftest import image_root, lmdb_path  # noqa: F401 (fixtures)
