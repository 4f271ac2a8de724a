"""The mutation harness (tests/mutation_check.py) is too slow for CI, so its rows can go stale unseen when the code
they break is renamed: here, quickly, every row still names text that occurs exactly once in its file and a test
that exists, so the harness runs every row when someone runs it."""
import pathlib
import re

from mutation_check import M

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_row_breaks_code_that_exists_and_names_a_real_test():
    stale = []
    for path, old, new, test in M:
        n = (ROOT / path).read_text().count(old)
        if n != 1:
            stale.append(f"{path}: {old[:60]!r} occurs {n} times")
        if old == new:
            stale.append(f"{path}: {old[:60]!r} is replaced by itself")
        file, _, name = test.partition("::")
        if not re.search(rf"^def {re.escape(name)}\(", (ROOT / file).read_text(), re.M):
            stale.append(f"{test}: no such test")
    assert not stale, "update tests/mutation_check.py:\n" + "\n".join(stale)
