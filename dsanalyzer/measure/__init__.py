"""Getting numbers out of a running job: the differential runs and what times them.

:mod:`~dsanalyzer.measure.modes` and :mod:`~dsanalyzer.measure.runs` say what each differential run
changes in a loader (one batch replayed, items from memory, a cold page cache);
:mod:`~dsanalyzer.measure.launch` starts the job under the import hook with a
:class:`~dsanalyzer.measure.hookconfig.HookConfig`; :mod:`~dsanalyzer.measure.timeline` records each
batch's wait and step at the iterator boundary and :mod:`~dsanalyzer.measure.stalls` turns runs into
stalls; :mod:`~dsanalyzer.measure.fetchrate`, :mod:`~dsanalyzer.measure.itemsize`,
:mod:`~dsanalyzer.measure.membw` and :mod:`~dsanalyzer.measure.sysmon` measure storage, item sizes,
memory bandwidth and the rest of the machine. This package never imports the model's verdict, the
report or the command line, and imports nothing here on purpose: the import hook loads its modules
one at a time into every profiled process.
"""
