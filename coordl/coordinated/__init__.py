"""Prep shared by concurrent jobs on one server: a job joining and reading the group's batches
(:mod:`.job`), joining from ``coordl.DataLoader`` (:mod:`.loader`), the producer process (:mod:`.producer`), the group's control block (:mod:`.control`) and
the encoding of a batch in shared memory (:mod:`.batchcodec`)."""
