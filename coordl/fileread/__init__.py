"""Reading whole files: past the page cache with ``O_DIRECT`` where asked, and ahead of need in native
threads that never take the GIL (:mod:`.read`; the threads are the C extension built from
``readahead.c``)."""
