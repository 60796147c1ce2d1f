"""hack/test_summary.py, the end of hack/test.sh's lanes: the slowest
tests of all and the closing line, read from the JUnit XML pytest writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = ROOT / "hack/test_summary.py"


def _lane(tmp_path: Path, name: str, body: str) -> Path:
    """Run pytest on a module of ``body`` as a lane does; its JUnit XML."""
    module = tmp_path / name / f"test_{name}.py"
    module.parent.mkdir()
    module.write_text(body)
    xml = tmp_path / f"{name}.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                    "-o", "addopts=", str(module)], cwd=module.parent, capture_output=True, timeout=120)
    return xml


def test_both_lanes_are_counted_and_the_slowest_come_first(tmp_path):
    a = _lane(tmp_path, "a", "import time, pytest\n"
              "def test_slow():\n    time.sleep(0.3)\n"
              "def test_fails():\n    assert False\n"
              "@pytest.mark.skip(reason='x')\ndef test_skipped():\n    pass\n")
    b = _lane(tmp_path, "b", "import time\ndef test_slower():\n    time.sleep(0.6)\ndef test_quick():\n    pass\n")
    out = subprocess.run([sys.executable, str(SUMMARY), "--seconds", "125", str(a), str(b)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "suite: 3 passed, 1 failed, 1 skipped"
    assert lines[-2].startswith("5 tests, ") and lines[-2].endswith("in 2 min 5 s of wall-clock time")
    ranked = [line.split()[-1] for line in lines if line.strip().endswith(("slow", "slower", "quick", "fails",
                                                                            "skipped"))]
    assert ranked[:2] == ["test_b.py::test_slower", "test_a.py::test_slow"], lines
    # Modules by their tests' summed time: b's two (0.6 s) before a's three (0.3 s).
    modules = [line.split()[1:] for line in lines if "tests)" in line]
    assert [m[0].rsplit("/", 1)[-1] for m in modules] == ["test_b.py", "test_a.py"], lines
    assert [m[1:] for m in modules] == [["(2", "tests)"], ["(3", "tests)"]], lines


def test_a_lane_that_wrote_nothing_fails_the_summary(tmp_path):
    out = subprocess.run([sys.executable, str(SUMMARY), str(tmp_path / "missing.xml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "no JUnit XML" in out.stderr
