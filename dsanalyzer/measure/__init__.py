"""Getting numbers out of a running job: the differential runs and what times them.

:mod:`~dsanalyzer.measure.plan` names the runs and what one is asked to do;
:mod:`~dsanalyzer.measure.launch` starts the job under the import hook with a
:class:`~dsanalyzer.measure.hookconfig.HookConfig`; :mod:`~dsanalyzer.measure.runs` holds the tools
every run uses whatever the job's kind (a replayed batch, the loader timed alone, a cold page cache:
what a run changes in a loader is the job kind's, :mod:`dsanalyzer.jobs`);
:mod:`~dsanalyzer.measure.recorder` records each batch's wait and step on a
:mod:`~dsanalyzer.measure.timeline` inside the job, and :mod:`~dsanalyzer.measure.stalls` turns runs
into stalls; :mod:`~dsanalyzer.measure.fetchrate`, :mod:`~dsanalyzer.measure.itemsize`,
:mod:`~dsanalyzer.measure.membw` and :mod:`~dsanalyzer.measure.sysmon` measure storage, item sizes,
memory bandwidth and the rest of the machine. This package never imports the model's verdict, the
report or the command line, and imports nothing here on purpose: the import hook loads its modules
one at a time into every profiled process.
"""
