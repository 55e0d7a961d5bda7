"""The what-if model: what a job's rate would be with more workers, a cache, or a faster link.

Pure functions and dataclasses over the numbers the differential runs measured (a report's fields):
no process, no file, no clock, so each piece is tested with numbers alone. :mod:`~dsanalyzer.model.whatif`
composes the stage rates (compute, prep, fetch: one pure function each in :mod:`~dsanalyzer.model.stages`,
over a job's measured parameters, :mod:`~dsanalyzer.model.params`) into a predicted samples/s; its
parts are the cache hit ratio of each policy (:mod:`~dsanalyzer.model.cache`: coordl's MinIO vs the
page cache's LRU), how prep scales with cores (:mod:`~dsanalyzer.model.scaling`) and the communication
cost of a distributed step (:mod:`~dsanalyzer.model.comm`). This folder imports nothing else of dsanalyzer.
"""

from __future__ import annotations

from dsanalyzer.model.rates import Prediction
from dsanalyzer.model.whatif import Model, format_bytes

__all__ = ["Model", "Prediction", "format_bytes"]
