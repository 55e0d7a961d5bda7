"""The report: report.json's schema with its writer and reader, report.html, and the terminal's text.

:mod:`~dsanalyzer.report.schema` validates, writes and loads report.json (the fields other tools code
against; an old or foreign file is refused with an error naming it); :mod:`~dsanalyzer.report.html`
draws the self-contained report.html with the tables of :mod:`~dsanalyzer.report.html_tables`;
:mod:`~dsanalyzer.report.text` prints the summary and the verify result; :mod:`~dsanalyzer.report.files`
writes every file atomically. The report reads the model and the verdict; nothing below it (measure,
model, judge, jobs) imports it. report.html's module (matplotlib) is loaded only when a page is written.
"""

from __future__ import annotations

from dsanalyzer.report.schema import SCHEMA_VERSION, ReportError, load_report, write_report
from dsanalyzer.report.text import summary_text, verify_text

__all__ = ["SCHEMA_VERSION", "ReportError", "load_report", "write_report", "summary_text", "verify_text"]
