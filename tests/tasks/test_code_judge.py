"""Code tasks judged with the solution in a process of its own: known reward hacks fail, real tests still pass.

The hacks are the ones an agent found against the in-process harness (a forged report on an
inherited pipe, reading the hidden tests) and the classic ones (an object equal to everything,
monkeypatching the test machinery, exiting 0 early or from atexit, a conftest.py, killing the
judge). Each solution can pass only by cheating, so each must score 0. The second half checks
that ordinary tests of ordinary solutions (classes, generators, expected exceptions, in-place
changes, Counter results, names the solution imported) still pass: a judge that refuses them
would turn right answers into zeros.
"""

from __future__ import annotations

import pytest

from shared.tasks import get_kind, load_task_modules

from .conftest import MakeCtx, rollout

load_task_modules()
pytestmark = pytest.mark.usefixtures("require_bwrap")

# 48213 and 90517 appear nowhere but in the hidden tests: only reading them finds these numbers.
SECRET_TESTS = {
    "tests": [{"code": "assert answer() == 48213"}],
    "test_code": "from solution import answer\n\n\ndef test_secret():\n    assert answer() + 1 == 90517 + 1\n",
}


def judge(make_ctx: MakeCtx, solution: str, **task: object) -> dict:
    full = {"kind": "code", "prompt": "p", "timeout_s": 5, "memory_mb": 256, **SECRET_TESTS, **task}
    get_kind("code").validate(full)
    return get_kind("code").evaluate(make_ctx(full, outputs=rollout(solution=solution)))


FORGE_REPORT_PIPE = (
    "import os\n"
    "for fd in range(3, 64):\n"
    "    try:\n"
    "        os.write(fd, b'returned')\n"
    "    except OSError:\n"
    "        pass\n"
    "os._exit(0)\n"
)
READ_HIDDEN_TESTS = (
    "import os, re, stat\n"
    "found = []\n"
    "def scan(path):\n"
    "    try:\n"
    "        if not stat.S_ISREG(os.stat(path).st_mode):\n"
    "            return\n"
    "        data = open(path, 'rb').read(1 << 20).decode('utf-8', 'replace')\n"
    "    except Exception:\n"
    "        return\n"
    "    found.extend(int(n) for n in re.findall(r'== (\\d{5})', data))\n"
    "for top in (os.getcwd(), '/tmp'):\n"
    "    for root, dirs, files in os.walk(top):\n"
    "        for name in files:\n"
    "            scan(os.path.join(root, name))\n"
    "for pid in os.listdir('/proc'):\n"
    "    for leaf in ('cmdline', 'environ'):\n"
    "        scan('/proc/%s/%s' % (pid, leaf))\n"
    "    try:\n"
    "        for fd in os.listdir('/proc/%s/fd' % pid):\n"
    "            scan('/proc/%s/fd/%s' % (pid, fd))\n"
    "    except OSError:\n"
    "        pass\n"
    "calls = iter(found * 4)\n"
    "def answer():\n"
    "    return next(calls, 0)\n"
)
EQUAL_TO_EVERYTHING = (
    "class Anything(int):\n"
    "    def __eq__(self, other):\n        return True\n"
    "    __hash__ = int.__hash__\n"
    "class Whatever:\n"
    "    def __eq__(self, other):\n        return True\n"
    "    def __add__(self, other):\n        return self\n"
    "def answer():\n    return Anything(0) if False else Whatever()\n"
)
MONKEYPATCH_THE_MACHINERY = (
    "import builtins, sys, os, traceback\n"
    "class Harmless(Exception):\n    pass\n"
    "builtins.AssertionError = Harmless\n"
    "sys.excepthook = lambda *a: os._exit(0)\n"
    "traceback.print_exc = lambda *a, **k: None\n"
    "def answer():\n    raise SystemExit(0)\n"
)
EXIT_ZERO_FROM_ATEXIT = "import atexit, os, sys\natexit.register(lambda: os._exit(0))\ndef answer():\n    sys.exit(0)\n"
CONFTEST_HOOK = (
    "open('conftest.py', 'w').write(\n"
    "    'import pytest\\n'\n"
    "    '@pytest.hookimpl(hookwrapper=True)\\n'\n"
    "    'def pytest_runtest_makereport(item, call):\\n'\n"
    "    '    outcome = yield\\n'\n"
    "    '    outcome.get_result().outcome = \"passed\"\\n'\n"
    ")\n"
    "def answer():\n    return 0\n"
)
KILL_THE_JUDGE = (
    "import os, signal, sys\n"
    "sys.stdout.write('\\nPASS\\n')\n"
    "sys.stdout.flush()\n"
    "os.kill(os.getppid(), signal.SIGKILL)\n"
    "def answer():\n    return 0\n"
)


@pytest.mark.parametrize(
    "solution",
    [
        FORGE_REPORT_PIPE,
        READ_HIDDEN_TESTS,
        EQUAL_TO_EVERYTHING,
        MONKEYPATCH_THE_MACHINERY,
        EXIT_ZERO_FROM_ATEXIT,
        CONFTEST_HOOK,
        KILL_THE_JUDGE,
    ],
    ids=["report_pipe", "read_hidden_tests", "equal_to_everything", "monkeypatch", "atexit", "conftest", "kill_judge"],
)
def test_a_reward_hack_scores_nothing(make_ctx: MakeCtx, solution: str) -> None:
    result = judge(make_ctx, solution)
    assert result["passed"] == 0 and result["reward"] == 0.0, result["tests"]


def test_the_hidden_test_would_pass_with_the_right_answer(make_ctx: MakeCtx) -> None:
    """The control for the hacks above: the same tests pass for a solution that knows the answers."""
    honest = "def answer():\n    return 48213\n"
    same_answer = "from solution import answer\n\n\ndef test_secret():\n    assert answer() + 1 == 48213 + 1\n"
    assert judge(make_ctx, honest, test_code=same_answer)["reward"] == 1.0


# --- ordinary tests of ordinary solutions still pass ----------------------------------------------
ORDINARY = (
    "import math\n"
    "from collections import Counter\n\n"
    "LIMIT = 10\n\n\n"
    "class Stack:\n"
    "    def __init__(self):\n        self.items = []\n"
    "    def push(self, item):\n        self.items.append(item)\n"
    "    def pop(self):\n        return self.items.pop()\n"
    "    def __len__(self):\n        return len(self.items)\n\n\n"
    "def count(text):\n    return Counter(text)\n\n\n"
    "def squares(n):\n    for i in range(n):\n        yield i * i\n\n\n"
    "def divide(a, b):\n    if b == 0:\n        raise ValueError('b is zero')\n    return a / b\n\n\n"
    "def sort_in_place(items):\n    items.sort()\n\n\n"
    "def pair():\n    return (1, [2.5, None], {'k': {3, 4}}, b'x', 2**70)\n\n\n"
    "def area(r):\n    return math.pi * r * r\n\n\n"
    "def apply_twice(f, x):\n    return f(f(x))\n"
)
ORDINARY_TESTS = {
    "tests": [
        {"code": "assert LIMIT == 10 and math.sqrt(16) == 4"},
        {"code": "s = Stack()\ns.push(1)\ns.push(2)\nassert s.pop() == 2 and len(s) == 1"},
        {"code": "assert count('aab') == {'a': 2, 'b': 1} and count('aab') == Counter('aba')"},
        {"code": "assert list(squares(4)) == [0, 1, 4, 9] and sum(squares(3)) == 5"},
        {"code": "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]"},
        {"code": "assert pair() == (1, [2.5, None], {'k': {3, 4}}, b'x', 2**70)"},
        {"code": "assert pair() != [1, [2.5, None], {'k': {3, 4}}, b'x', 2**70]"},
    ],
    "test_code": (
        "import math\n\nimport pytest\n\nfrom solution import area, divide\n\n\n"
        "def test_raises():\n    with pytest.raises(ValueError, match='zero'):\n        divide(1, 0)\n\n\n"
        "def test_float():\n    assert math.isclose(area(2), 12.566, rel_tol=1e-3)\n"
        "    assert divide(1, 4) == pytest.approx(0.25)\n"
    ),
}


def test_ordinary_tests_of_a_right_solution_all_pass(make_ctx: MakeCtx) -> None:
    result = judge(make_ctx, ORDINARY, **ORDINARY_TESTS)
    assert result["passed"] == result["total"] == 9, [t for t in result["tests"] if not t["passed"]]


def test_a_wrong_answer_fails_with_the_assertion_in_the_detail(make_ctx: MakeCtx) -> None:
    wrong = ORDINARY.replace("items.sort()", "items.reverse()")
    result = judge(make_ctx, wrong, **ORDINARY_TESTS)
    failed = [t for t in result["tests"] if not t["passed"]]
    assert [t["name"] for t in failed] == ["test_4"] and "AssertionError" in failed[0]["detail"]


def test_a_solution_that_does_not_import_is_an_error_naming_why(make_ctx: MakeCtx) -> None:
    result = judge(make_ctx, "def answer(:\n")
    assert result["reward"] == 0.0
    assert all(t["status"] == "error" and "SyntaxError" in t["detail"] for t in result["tests"])
