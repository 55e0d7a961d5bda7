"""``coordl pack``: converting a dataset into the packed formats that :mod:`coordl.packed` reads, resumable
and verified by reading back (:mod:`.pack`; the tar side in :mod:`.tar`, the LMDB side in :mod:`.lmdb`,
what is read from each source item and the progress line in :mod:`.items`)."""
