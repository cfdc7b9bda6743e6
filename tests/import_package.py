"""Import every module of one entrepot package, so an import it did not declare fails in its own venv.

`nox -s integration-<name>` runs this in a venv that holds only the package's declared dependencies
(and its test extra): the unit tier, which runs in one venv with every package, cannot see an
undeclared import, and this does it in seconds without running the unit tier twice.

    python tests/import_package.py dock
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import traceback


def main(name: str) -> int:
    package = importlib.import_module(f"entrepot.{name}")
    failed: list[str] = []
    count = 1
    for module in pkgutil.walk_packages(package.__path__, prefix=f"entrepot.{name}."):
        count += 1
        try:
            importlib.import_module(module.name)
        except Exception:  # report every module that does not import, then fail once
            failed.append(f"{module.name}:\n{traceback.format_exc(limit=2)}")
    for line in failed:
        print(line, file=sys.stderr)
    print(f"entrepot.{name}: {count - len(failed)} of {count} modules import")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
