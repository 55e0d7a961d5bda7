"""Prep shared by concurrent jobs on one server: a job reading the group's batches (:mod:`.job`), the
group's options and joining it (:mod:`.group`), joining from ``coordl.DataLoader`` (:mod:`.loader`), the
producer process (:mod:`.producer`), the group's control block (:mod:`.control`) and the encoding of a
batch in shared memory (:mod:`.batchcodec`)."""
