"""The main process's own CPU per batch, read from the differential runs' CPU clocks (report.json's ``main_process``).

The model needs what the main process itself costs a core per batch, apart from waiting for its
workers and from waiting for a core they hold: the main thread's CPU inside ``__next__`` (receiving,
unpickling, collating) and the process's CPU during the step (:class:`~dsanalyzer.measure.timeline.Timeline`
records both clocks per iteration). Wall time would count both waits, and a prep-bound job on a small
machine would read as a main process too slow to ever go faster.
"""

from __future__ import annotations

from dsanalyzer.measure.timeline import summarize_cpu

__all__ = ["main_process_section"]


def main_process_section(results: dict[str, dict], warmup: int, workers: int, scaling: dict) -> dict:
    """The main process's own CPU per batch: receiving (the in-memory run) and the step (the compute run).

    With ``num_workers=0`` the main thread preps inside ``__next__``, so its receive cost is read from
    the loader-alone run with workers (at the most workers measured) instead.
    """
    def cpu(mode: str) -> dict | None:
        r = results.get(mode) or {}
        return summarize_cpu(r.get("wait_cpu_s") or [], r.get("step_cpu_s") or [], warmup)

    compute, prep = cpu("compute"), cpu("prep")
    out: dict = {
        "receive_cpu_s_per_batch": None,
        "step_cpu_s_per_batch": compute["step_s"] if compute else None,
        "method": "CPU time: the main thread's inside __next__ (the in-memory run), the process's during "
        "the step (the compute run); waiting for workers and waiting for a core cost none",
    }
    if workers > 0 and prep:
        out["receive_cpu_s_per_batch"] = prep["receive_s"]
    else:
        receive = [r for r in scaling.get("receive_cpu_s_per_batch") or [] if r is not None]
        if receive:
            out["receive_cpu_s_per_batch"] = receive[-1]
            out["method"] += "; receive from the loader-alone run with workers (the job loads in its main process)"
    return out
