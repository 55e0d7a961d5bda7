"""shmem: the leaf package every other package of this project stands on.

One primitive per idea, none of which imports anything else of the project:

* :mod:`shmem.segment`: named shared-memory segments owned by a process, reclaimed after the owner dies
  (even after ``kill -9``), with pages reserved before they are written;
* :mod:`shmem.members`: tables of member processes ``(pid, start ticks)`` for state shared by many
  processes, swept when a member dies;
* :mod:`shmem.table`: the never-evicting table of byte values (MinIO cache, sample store), read without
  locks and published safely on any CPU;
* :mod:`shmem.codec`: the one frame format for values crossing processes, caches and sockets (a tree of
  arrays, bytes and scalars behind a checked header, CRC-32s, a key tag; never pickle);
* :mod:`shmem.counters`: integer counters shared by a process and its workers;
* :mod:`shmem.strings`: many strings as one blob and one offsets array, read by forked workers without
  copying pages (a dataset's file list);
* :mod:`shmem.lazy`: lazy package exports, so ``import pkg`` stays cheap.
"""
