"""Check built wheels: every Requires-Dist on an entrepot sibling is a version range, never a path/URL."""

from __future__ import annotations

import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement


def sibling_problems(requirements: list[str], owner: str) -> list[str]:
    """Return a message for each entrepot-* requirement that is not a plain version range."""
    problems = []
    for line in requirements:
        req = Requirement(line)
        if not req.name.startswith("entrepot-"):
            continue
        if req.url:
            problems.append(f"{owner}: {req.name} is pinned to a location ({req.url}), not a version range")
        elif not req.specifier or any(spec.operator in ("==", "===") for spec in req.specifier):
            problems.append(
                f"{owner}: {req.name} needs a version range like '>=0.1,<0.2', got '{req.specifier}'"
            )
    return problems


def wheel_requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(archive.read(name).decode())
    return meta.get_all("Requires-Dist") or []


def main(dist: str) -> int:
    wheels = sorted(Path(dist).glob("entrepot_*.whl"))
    problems = [p for wheel in wheels for p in sibling_problems(wheel_requirements(wheel), wheel.name)]
    for problem in problems:
        print(problem)
    print(f"checked {len(wheels)} wheels: {len(problems)} problems")
    return 1 if problems or not wheels else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
