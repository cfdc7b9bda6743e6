"""The sandbox's test harness: runs the program, then each test, and reports each outcome as it ends.

Run as ``python -I -S -B _harness.py REPORT_FD PROGRAM TESTS_JSON`` by the launcher. Each line of the
report (an inherited file descriptor) is written unbuffered the moment it is known, so a program that
exits, crashes or is killed mid-test leaves the outcomes of the tests before it:

    compiled | syntax        the program parsed, or did not
    loaded | memory | error  its top level ran, ran out of memory, or raised
    pass I | fail I | memory I   test I (counting from 0)
    done                     every test ran

The program runs as module ``solution`` (an ``if __name__ == "__main__":`` block does not run); each
test is Python source executed in the program's namespace (an ``assert`` line, or several lines).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback


def main() -> None:
    fd = int(sys.argv[1])
    with open(sys.argv[2], encoding="utf-8") as f:
        source = f.read()
    with open(sys.argv[3], encoding="utf-8") as f:
        tests = json.load(f)

    def report(line: str, *, why: bool = False) -> None:
        os.write(fd, line.encode() + b"\n")
        if why:  # the reason into the program's output (which may be full: then it is lost)
            with contextlib.suppress(OSError):
                traceback.print_exc(limit=-1)

    try:
        code = compile(source, "solution.py", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # ValueError: a NUL byte
        report("syntax")
        return
    report("compiled")
    namespace: dict[str, object] = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(code, namespace)
    except MemoryError:
        report("memory")
        return
    except BaseException:  # a program that raises (or exits) at its top level
        report("error", why=True)
        return
    report("loaded")
    for i, test in enumerate(tests):
        try:
            exec(compile(test, f"test_{i}", "exec"), namespace)
        except MemoryError:
            report(f"memory {i}")
        except BaseException:  # a failed assert, an exception, a sys.exit in the code
            report(f"fail {i}", why=True)
        else:
            report(f"pass {i}")
    report("done")


if __name__ == "__main__":
    main()
