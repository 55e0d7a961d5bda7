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
        "the step (the compute run); waiting for workers and waiting for a core cost none; "
        "job_cpu_s_per_sample: the real run's CPU (main process and workers, its reads included) over its "
        "samples (job_cpu_run: the in-memory run's when the real run has none)",
    }
    for mode in ("prep", "real"):  # the real run last: the job as it runs, reading its files, wins
        run = results.get(mode) or {}
        job = run.get("job_cpu") or {}
        if job.get("cpu_s_per_sample"):  # workers and main process together, as they ran side by side
            out["job_cpu_s_per_sample"] = job["cpu_s_per_sample"]
            out["job_cpu_run"] = "in-memory" if mode == "prep" else "real"
            out["job_main_cpu_s_per_batch"] = job.get("main_cpu_s_per_batch")
            out["job_cpu_share"] = job.get("cpu_share")
            out["job_idle_cores"] = job.get("idle_cores")
            out["job_main_preempts_per_batch"] = job.get("main_preempts_per_batch")
            if mode == "prep":
                out["in_memory_job_cpu_s_per_sample"] = job["cpu_s_per_sample"]
        for key in ("torch_threads", "threads_follow_cores", "threads_fixed_by", "step_device"):
            if key in run:
                out[key] = run[key]
    if workers > 0 and prep:
        out["receive_cpu_s_per_batch"] = prep["receive_s"]
    else:
        receive = [r for r in scaling.get("receive_cpu_s_per_batch") or [] if r is not None]
        if receive:
            out["receive_cpu_s_per_batch"] = receive[-1]
            out["method"] += (
                "; receive from the loader-alone run with workers (the job loads in its main process)"
            )
    return out
