"""Loader worker processes: starting them (:mod:`.start`) and reporting a worker's death with the item it
was on (:mod:`.watch`)."""
