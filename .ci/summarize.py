"""Sum the JUnit reports every nox test session wrote into one closing line for CI.

A test that ran in several sessions (the unit tier runs in `unit` and again in its package's
integration-<name>) counts once: failed if it failed anywhere, else passed if it passed anywhere,
else skipped.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

FAILED, PASSED, SKIPPED = 2, 1, 0  # the worst outcome of a test wins


def _outcome(case: ET.Element) -> int:
    if case.find("failure") is not None or case.find("error") is not None:
        return FAILED
    return SKIPPED if case.find("skipped") is not None else PASSED


def main(report_dir: str) -> int:
    outcomes: dict[tuple[str, str], int] = {}
    for report in sorted(Path(report_dir).glob("*.xml")):
        for case in ET.parse(report).getroot().iter("testcase"):
            key = (case.get("classname", ""), case.get("name", ""))
            outcomes[key] = max(outcomes.get(key, SKIPPED), _outcome(case))
    counts = list(outcomes.values())
    passed, failed, skipped = counts.count(PASSED), counts.count(FAILED), counts.count(SKIPPED)
    print(f"total: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ".nox-reports"))
