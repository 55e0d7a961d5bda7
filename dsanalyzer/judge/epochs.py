"""What starting each epoch costs the job, judged: its share of an epoch, and what keeps it small.

The profile measures the excess wait of each epoch's first batch (``report["epoch_start"]``, from
``iter(loader)`` on); the model charges it once an epoch. Said only where it is worth saying: at least
:data:`NOTABLE_SHARE` of an epoch's time.
"""

from __future__ import annotations

from dsanalyzer.model.rates import Prediction
from dsanalyzer.model.whatif import Model

__all__ = ["NOTABLE_SHARE", "epoch_start_note"]

NOTABLE_SHARE = 0.05


def epoch_start_note(report: dict, model: Model, measured: Prediction) -> dict | None:
    """``{s_per_epoch, share, text}`` when an epoch's start is at least 5% of the ``measured`` prediction's
    epoch (the profiled operating point, where the start is the one measured), else None."""
    start = model.epoch_start_s
    items = model.epoch_items or model.dataset_items
    if start <= 0 or items <= 0 or not measured.epoch_s > 0:
        return None
    share = start / measured.epoch_s
    if share < NOTABLE_SHARE:
        return None
    loader = report.get("loader") or {}
    text = (
        f"each epoch's first batch waits {start * 1e3:,.0f} ms longer than the others ({share:.0%} of an epoch "
        f"of {items:,} samples), and the prediction counts it"
    )
    if int(loader.get("num_workers") or 0) > 0 and loader.get("persistent_workers") is False:
        text += "; persistent_workers=True keeps the workers between epochs instead of starting new ones"
    return {"s_per_epoch": start, "share": share, "text": text}
