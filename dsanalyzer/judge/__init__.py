"""Judging a profile: the verdict (what binds, why, and the one change to make) and verify's comparison.

:func:`~dsanalyzer.judge.verdict.verdict` reads a report with the what-if model
(:mod:`dsanalyzer.model`) and says what binds the job, with the causes it measured and the change it
predicts will help; :func:`~dsanalyzer.judge.verify.verify_result` sets a changed job's measured rate
beside that prediction and names what moved when they disagree. Both read numbers only (a report and
run results, as dicts); running jobs is the orchestrators' (:mod:`dsanalyzer.profiler`,
:mod:`dsanalyzer.verify`) and writing the report is :mod:`dsanalyzer.report`'s.
"""

from __future__ import annotations

from dsanalyzer.judge.verdict import advice_sentence, verdict
from dsanalyzer.judge.verify import TARGET_ERROR, verify_result

__all__ = ["verdict", "advice_sentence", "verify_result", "TARGET_ERROR"]
