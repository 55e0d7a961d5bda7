"""Starting torch's loader workers (:mod:`.start`): forked with a frozen heap, shown the user's dataset,
and a worker stuck inside the fork replaced (:mod:`.stuck`). Which item each worker is on, for the report
of a worker's death, is written on the fetch path (:mod:`coordl.fetch.watch`)."""
