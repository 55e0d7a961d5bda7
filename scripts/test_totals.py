"""Print one closing line for scripts/test.sh's two pytest phases: their JUnit XML files summed.

``N passed, N failed, N skipped`` (errors counted as failed), alone on the last line, so a reader of the CI log sees
the whole suite's outcome where the runner's own summary would be.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def totals(paths: list[Path]) -> dict[str, int]:
    out = {"tests": 0, "failed": 0, "skipped": 0}
    for path in paths:
        if not path.exists():
            continue
        root = ET.parse(path).getroot()
        for suite in root.iter("testsuite"):
            out["tests"] += int(suite.get("tests", 0))
            out["failed"] += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            out["skipped"] += int(suite.get("skipped", 0))
    return out


def main(argv: list[str]) -> int:
    t = totals([Path(p) for p in argv])
    passed = t["tests"] - t["failed"] - t["skipped"]
    print(f"suite: {passed} passed, {t['failed']} failed, {t['skipped']} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
