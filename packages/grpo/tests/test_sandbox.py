"""The code sandbox and the code_tests verifier: planted hostile programs, each with its verdict in time.

The unit tests read verdicts, extract programs and map verdicts to rewards without a process; the
integration tests (marked) run real programs: one that loops, forks, allocates 10 GB, opens sockets,
writes outside its directory, reads the environment, prints 100 MB, exits mid-test, does not parse.
Each must end within its deadline + 1 s and leave no process and no file behind.
"""

from __future__ import annotations

import socket
import tempfile
import time
from pathlib import Path

import pytest

from entrepot.grpo.config import CodeRewardConfig
from entrepot.grpo.config.reward import CODE_VERDICTS
from entrepot.grpo.data import code_tests, rewards
from entrepot.grpo.errors import GRPOConfigError, SandboxError
from entrepot.grpo.sandbox import SandboxLimits, SandboxResult, Verdict, isolation, run_many
from entrepot.grpo.sandbox.verdicts import read_verdict

# A program's deadline includes starting its interpreter and the harness (about 0.2 s of CPU each): six
# at once on 2 shared cores beside a second test worker took over 2 s before the program's first line.
DEADLINE_S = 5.0
SECRET = "hunter2-do-not-leak"


# ---------------------------------------------------------------------------------------------- unit


def test_the_config_knows_every_verdict() -> None:
    assert tuple(v.value for v in Verdict) == CODE_VERDICTS


@pytest.mark.parametrize(
    ("report", "timed_out", "returncode", "expected"),
    [
        ("compiled\nloaded\npass 0\npass 1\ndone\n", False, 0, (Verdict.PASS, 2)),
        ("compiled\nloaded\npass 0\nfail 1\ndone\n", False, 0, (Verdict.FAIL, 1)),
        ("compiled\nloaded\npass 0\n", True, -9, (Verdict.TIMEOUT, 1)),
        ("compiled\nloaded\n", False, -24, (Verdict.TIMEOUT, 0)),  # SIGXCPU: the CPU-time limit
        ("compiled\nloaded\npass 0\n", False, 3, (Verdict.CRASH, 1)),
        ("compiled\nerror\n", False, 0, (Verdict.CRASH, 0)),
        ("compiled\nmemory\n", False, 0, (Verdict.MEMORY, 0)),
        ("compiled\nloaded\npass 0\nmemory 1\ndone\n", False, 0, (Verdict.MEMORY, 1)),
        ("syntax\n", False, 0, (Verdict.SYNTAX, 0)),
    ],
)
def test_read_verdict(report: str, timed_out: bool, returncode: int, expected: tuple[Verdict, int]) -> None:
    assert read_verdict(report, 2, timed_out=timed_out, returncode=returncode) == expected


def test_extract_program_takes_the_last_python_block_else_the_whole_response() -> None:
    two = "first\n```python\ndef f(): return 1\n```\nthen\n```python\ndef f(): return 2\n```\nbye"
    assert code_tests.extract_program(two) == "def f(): return 2\n"
    assert code_tests.extract_program("```py\nx = 1\n```") == "x = 1\n"
    assert code_tests.extract_program("```python\ncut = 'by the budget'") == "cut = 'by the budget'"
    assert code_tests.extract_program("def f():\n    return 3") == "def f():\n    return 3"
    assert code_tests.extract_program("```\nx = 1\n```") == "```\nx = 1\n```"  # no language: not python


def test_tests_must_be_a_json_list_of_sources_naming_the_row() -> None:
    assert code_tests.parse_tests('["assert f(1) == 2"]') == ["assert f(1) == 2"]
    for bad in ("assert f(1) == 2", "[]", "[1]", '{"a": 1}'):
        with pytest.raises(SandboxError, match="row 3's tests"):
            code_tests.parse_tests(bad, 3)
    with pytest.raises(SandboxError, match="row 1's tests"):  # before a run, as the math gold answers
        rewards.check_gold_answers(["code_tests"], ['["assert True"]', "42"])


def _result(verdict: Verdict, passed: int, total: int = 4) -> SandboxResult:
    return SandboxResult(verdict, passed, total, 0.1, 0, "", True)


def test_verdict_to_reward_mapping() -> None:
    judge = code_tests.CodeTests()
    assert judge.reward(_result(Verdict.PASS, 4)) == 1.0
    assert judge.reward(_result(Verdict.TIMEOUT, 3)) == 0.75  # partial credit: the tests passed first
    judge.configure(CodeRewardConfig(partial_credit=False, verdict_scores={"syntax": -0.5}))
    assert judge.reward(_result(Verdict.FAIL, 3)) == 0.0
    assert judge.reward(_result(Verdict.PASS, 4)) == 1.0
    assert judge.reward(_result(Verdict.SYNTAX, 0)) == -0.5
    assert code_tests.verdict_metrics([_result(Verdict.PASS, 4), _result(Verdict.FAIL, 1)]) == {
        "reward/code_pass": 1.0, "reward/code_fail": 1.0, "reward/code_timeout": 0.0,
        "reward/code_crash": 0.0,
        "reward/code_memory": 0.0, "reward/code_syntax": 0.0, "reward/code_isolated": 2.0,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("key", "value"),
    [("timeout_s", 0.0), ("memory_mb", 8), ("output_kb", 0), ("max_workers", 0),
     ("verdict_scores", {"oops": 1.0}), ("verdict_scores", {"syntax": "low"})],
)  # fmt: skip
def test_bad_code_config_names_the_key(key: str, value: object) -> None:
    with pytest.raises(GRPOConfigError, match=rf"reward\.code\.{key}"):
        CodeRewardConfig(**{key: value})  # type: ignore[arg-type]


def test_limits_are_checked() -> None:
    with pytest.raises(SandboxError, match=r"memory_mb \(1\)"):
        SandboxLimits(memory_mb=1)


# ------------------------------------------------------------------------------- integration: planted

PLANTED = {  # name -> (program, tests, the verdict under isolation)
    "passes": ("def f(x):\n    return x + 1\n", ["assert f(1) == 2", "assert f(2) == 3"], Verdict.PASS),
    "loops_forever": ("def f():\n    return 1\n", ["assert f() == 1", "while True: pass"], Verdict.TIMEOUT),
    "fork_bomb": ("import os\n", ["for _ in range(100_000):\n    os.fork()"], Verdict.FAIL),
    "allocates_10gb": ("blob = bytearray(10 * 1024**3)\n", ["assert blob"], Verdict.MEMORY),
    "opens_sockets": (
        "import socket\n\ndef reach(host, port):\n    try:\n        socket.create_connection((host, port), "
        "timeout=1).close()\n        return True\n    except OSError:\n        return False\n",
        ["assert not reach('127.0.0.1', {port})", "assert not reach('1.1.1.1', 53)"],
        Verdict.PASS,
    ),
    "writes_outside": ("def f():\n    return 1\n", ["open({outside!r}, 'w').write('x')"], Verdict.FAIL),
    "reads_env": (
        "import os\nleaked = [k for k, v in os.environ.items() if {secret!r} in v]\n",
        ["assert not leaked", "assert os.environ['PATH']"],
        Verdict.PASS,
    ),
    "prints_100mb": (
        "import sys\n",
        ["sys.stdout.write('x' * 100_000_000)\nsys.stdout.flush()", "assert True"],
        Verdict.FAIL,
    ),
    "exits_mid_test": ("import os\n", ["assert True", "os._exit(3)", "assert True"], Verdict.CRASH),
    "syntax_error": ("def f(:\n    return 1\n", ["assert f() == 1"], Verdict.SYNTAX),
}


def _sandbox_processes(marker: str) -> list[int]:
    """Pids whose command line names `marker` (the test's own temporary directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue  # ended while we looked
    return found


@pytest.mark.integration
def test_planted_programs_get_their_verdicts_in_time_and_leave_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All ten run at once: the batch ends in about one deadline, each within deadline + 1 s."""
    isolated = isolation().available
    listener = socket.create_server(("127.0.0.1", 0))
    outside = tmp_path / "owned_by_the_test" / "written_by_the_program"
    outside.parent.mkdir()
    runs = tmp_path / "runs"
    runs.mkdir()
    monkeypatch.setenv("ENTREPOT_TEST_SECRET", SECRET)
    monkeypatch.setattr(tempfile, "tempdir", str(runs))  # the runs' directories, and their pids' argv
    fill = {"port": listener.getsockname()[1], "outside": str(outside), "secret": SECRET}
    names = list(PLANTED)
    programs = [PLANTED[n][0].format(**fill) for n in names]
    tests = [[t.format(**fill) for t in PLANTED[n][1]] for n in names]
    limits = SandboxLimits(timeout_s=DEADLINE_S, memory_mb=256)
    started = time.monotonic()
    results = run_many(programs, tests, limits, max_workers=len(names))
    elapsed = time.monotonic() - started
    listener.close()
    table = "\n".join(f"{n:16} {r.verdict.value:8} {r.passed}/{r.total} {r.seconds:.2f}s" for n, r in
                      zip(names, results, strict=True))  # fmt: skip
    print(f"\nisolated: {isolated}\n{table}")
    for name, result in zip(names, results, strict=True):
        assert result.seconds <= DEADLINE_S + 1.0, (name, result)
        assert result.isolated == isolated
        if isolated or name not in ("fork_bomb", "opens_sockets", "writes_outside"):
            assert result.verdict is PLANTED[name][2], (name, result)
    assert elapsed <= DEADLINE_S + 3.0, table  # about one deadline, not ten
    by_name = dict(zip(names, results, strict=True))
    assert by_name["loops_forever"].passed == 1 and by_name["exits_mid_test"].passed == 1
    assert by_name["exits_mid_test"].returncode == 3
    assert len(by_name["prints_100mb"].output) <= 4096 and by_name["prints_100mb"].passed == 1
    assert not outside.exists()
    assert list(runs.iterdir()) == []  # every run's directory removed
    assert _sandbox_processes(str(runs)) == []  # the fork bomb's and the loop's processes are gone


@pytest.mark.integration
def test_code_tests_verifier_scores_a_batch_from_responses() -> None:
    """The registered verifier, as `rewards.score` calls it: the last python block against the row's tests."""
    code_tests.configure(CodeRewardConfig(timeout_s=DEADLINE_S))
    tests = '["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]'
    responses = [
        "Here:\n```python\ndef add(a, b):\n    return a + b\n```",
        "```python\ndef add(a, b):\n    return a * b\n```",  # add(2, 3) fails, add(-1, 1) fails
        "def add(a, b):\n    return a + b if a > 0 else 7",  # no block: the whole response; half right
        "```python\ndef add(a, b) return\n```",
    ]
    scores = rewards.score(responses, [tests] * 4, {"code_tests": 1.0})
    assert scores == [1.0, 0.0, 0.5, 0.0]


@pytest.mark.integration
def test_require_isolation_refuses_where_it_is_missing() -> None:
    if isolation().available:
        isolation().require()  # nothing raised
    else:
        with pytest.raises(SandboxError, match="cannot isolate programs on this machine"):
            isolation().require()


@pytest.mark.integration
def test_without_isolation_the_limits_still_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback where namespaces are refused: deadline, memory, output, env and clean-up, flagged."""
    monkeypatch.setenv("ENTREPOT_TEST_SECRET", SECRET)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    names = ["loops_forever", "allocates_10gb", "reads_env", "prints_100mb", "exits_mid_test", "syntax_error"]
    fill = {"secret": SECRET}
    programs = [PLANTED[n][0].format(**fill) for n in names]
    tests = [PLANTED[n][1] for n in names]
    results = run_many(programs, tests, SandboxLimits(timeout_s=DEADLINE_S), max_workers=6, isolate=False)
    for name, result in zip(names, results, strict=True):
        assert (result.verdict, result.isolated) == (PLANTED[name][2], False), (name, result)
        assert result.seconds <= DEADLINE_S + 1.0
    assert list(tmp_path.iterdir()) == [] and _sandbox_processes(str(tmp_path)) == []
