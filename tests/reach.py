"""Property tests that show they reach their point.

A property whose examples seldom reach the case it is about passes whatever the
code does there. ``@reaches`` names the cases (branches) a property test is
about and the least share of its examples that must reach each; the test body
calls ``reached(name)`` when an example gets there (also a hypothesis
``event``, so ``--hypothesis-show-statistics`` lists it). At the end of the
test the shares are printed (``reached lends: 212/300 (71%), at least 40%``),
kept for the run's closing summary (``conftest.py``), and a share under its
minimum fails the test::

    @reaches(lends=0.4)
    @settings(max_examples=300)
    @given(worlds())
    def test_x(world):
        ...
        if lending:
            reached("lends")

Every example that runs the body counts, those ``assume`` rejects included, so
a strategy that mostly draws what the test discards shows as a low share.
"""

from __future__ import annotations

import functools
from collections import Counter
from contextvars import ContextVar

from hypothesis import event

__all__ = ["reaches", "reached", "LINES"]

#: ``test: share`` lines of every test run so far, for the run's summary.
LINES: list[str] = []

_example: ContextVar[tuple[set[str], set[str]] | None] = ContextVar("reach_example", default=None)


def reached(branch: str) -> None:
    """This example reached ``branch``, one of the names its test's ``@reaches`` gives."""
    current = _example.get()
    if current is None:
        raise RuntimeError(f"reached({branch!r}) outside a test decorated with @reaches")
    names, seen = current
    if branch not in names:
        raise ValueError(f"reached({branch!r}): the test's @reaches names only {sorted(names)}")
    if branch not in seen:
        seen.add(branch)
        event(f"reached {branch}")


def reaches(**minimum: float):
    """Fail the hypothesis test below unless at least ``minimum[name]`` of its
    examples call ``reached(name)``, for each name; put it above ``@given``
    (and ``@settings``)."""
    if not minimum or not all(0 < share <= 1 for share in minimum.values()):
        raise ValueError("name each branch with its least share, a number in (0, 1]")
    names = set(minimum)

    def decorate(test):
        if not getattr(test, "is_hypothesis_test", False):
            raise TypeError(f"@reaches goes above @given, not on {test.__qualname__}")
        inner = test.hypothesis.inner_test
        counts: Counter[str] = Counter()

        @functools.wraps(inner)
        def example(*args, **kwargs):
            seen: set[str] = set()
            token = _example.set((names, seen))
            counts["examples"] += 1  # before the body: an example assume() rejects counts too
            try:
                return inner(*args, **kwargs)
            finally:
                _example.reset(token)
                counts.update(seen)

        test.hypothesis.inner_test = example

        @functools.wraps(test)
        def run(*args, **kwargs):
            counts.clear()
            test(*args, **kwargs)
            total = counts["examples"]
            lines, short = [], []
            for name, least in minimum.items():
                got = counts[name]
                share = got / total if total else 0.0
                lines.append(f"reached {name}: {got}/{total} ({share:.0%}), at least {least:.0%}")
                if share < least:
                    short.append(lines[-1])
            print("\n".join(lines))
            LINES.extend(f"{test.__module__.rsplit('.', 1)[-1]}::{test.__name__}: {line}" for line in lines)
            assert not short, ("too few examples reach the case this property is about, so it proves little "
                               "there; draw more that do: " + "; ".join(short))

        return run

    return decorate
