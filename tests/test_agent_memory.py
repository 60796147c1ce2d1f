"""The agent reads ``squeue --json`` one job at a time (issue 24, item 4).

Whole, the output of Slurm's default MaxJobCount (10,000 jobs) and its parse
tree took more memory than the agent's container has, and any researcher can
submit that many jobs. The streaming parser must give exactly what
``json.loads`` gives, over every release's real output cut anywhere; the
local runner must stream and still report a failed command as a failure; and
the agent answering ``GET /v1/jobs`` over 10,000 jobs must stay far below
its container's limit (measured by hack/bench_agent_memory.py, the same code
path, with a fake ``squeue`` of the real shape).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmk8s import versions
from slurmk8s.slurm.client import LocalRunner, SlurmClient, SlurmError
from slurmk8s.slurm.model import JsonItems, job_from_json

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests/fixtures/slurm-json"


def _cut(text: str, sizes: list[int]) -> list[str]:
    chunks, pos, i = [], 0, 0
    while pos < len(text):
        size = sizes[i % len(sizes)] if sizes else len(text)
        chunks.append(text[pos:pos + size])
        pos, i = pos + size, i + 1
    return chunks


@pytest.mark.parametrize("version", versions.SUPPORTED)
@pytest.mark.parametrize("sizes", [[1], [3, 17], [4096], []])
def test_streamed_jobs_are_what_json_loads_gives_on_every_release(version, sizes):
    data = json.loads((FIXTURES / version / "squeue.json").read_text())
    data["jobs"] = data["jobs"] * 5
    for text in (json.dumps(data), json.dumps(data, indent=2)):
        items = JsonItems(_cut(text, sizes), "jobs")
        assert list(items) == data["jobs"]
        assert items.others == {k: v for k, v in data.items() if k != "jobs"}


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
                     max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(doc=st.dictionaries(st.text(max_size=6), _json, max_size=4), jobs=st.lists(_json, max_size=6),
       sizes=st.lists(st.integers(1, 40), min_size=1, max_size=5), indent=st.sampled_from([None, 1]))
def test_streamed_items_equal_json_loads_for_any_object_cut_anywhere(doc, jobs, sizes, indent):
    doc = {**doc, "jobs": jobs}
    items = JsonItems(_cut(json.dumps(doc, indent=indent), sizes), "jobs")
    assert list(items) == jobs
    assert items.others == {k: v for k, v in doc.items() if k != "jobs"}


@pytest.mark.parametrize("text", ["", "{", '{"jobs": [{"job_id": 1},', '{"jobs": 5}', "[]",
                                  '{"jobs": []} {"jobs": []}', '{"jobs": [1 2]}', '{"jobs": [1]'])
def test_what_is_not_one_json_object_is_refused_not_read_short(text):
    with pytest.raises(ValueError):
        list(JsonItems(_cut(text, [2]), "jobs"))


def _fake_squeue(tmp_path: Path, script: str) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "squeue").write_text(f"#!{sys.executable}\n{script}")
    (bin_dir / "squeue").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_the_local_runner_streams_and_a_failure_is_never_a_short_answer(tmp_path, monkeypatch):
    template = json.loads((FIXTURES / "24.11" / "squeue.json").read_text())
    job = template["jobs"][0]
    ok = _fake_squeue(tmp_path, f"""
import json, sys
jobs = [dict({json.dumps(job)!r} and json.loads({json.dumps(json.dumps(job))}), job_id=i) for i in range(1, 301)]
sys.stdout.write(json.dumps({{"jobs": jobs, "meta": {json.dumps(template["meta"])!r} and None}}))
""")
    monkeypatch.setenv("PATH", ok["PATH"])
    client = SlurmClient(LocalRunner(), release=versions.release("24.11"))
    assert [j.job_id for j in client.jobs()] == list(range(1, 301))
    assert [j.job_id for j in client.jobs(nodes=["node-1"])] == list(range(1, 301))
    assert client.jobs(nodes=["node-2"]) == []
    # Half the output, then a failure: an error, not 150 jobs.
    (tmp_path / "bin" / "squeue").write_text(f"""#!{sys.executable}
import sys
sys.stdout.write('{{"jobs": [' + ','.join('{{"job_id": %d}}' % i for i in range(150)) + ',')
sys.stdout.flush()
sys.stderr.write("squeue: error: Unable to contact slurm controller (connect failure)\\n")
sys.exit(1)
""")
    with pytest.raises(SlurmError, match="Unable to contact slurm controller") as info:
        SlurmClient(LocalRunner(), release=versions.release("24.11")).jobs.__wrapped__(client)
    assert info.value.unreachable and info.value.returncode == 1


def test_a_plain_runner_still_works(tmp_path):
    """Runners without streaming (the tests' namespaces, remote shells) give the output whole."""
    text = (FIXTURES / "22.05" / "squeue.json").read_text()
    client = SlurmClient(lambda argv, stdin: subprocess.CompletedProcess(argv, 0, text, ""))
    [job] = client.jobs()
    assert job == job_from_json(json.loads(text)["jobs"][0])


def test_the_agent_answers_10000_jobs_well_within_its_container(monkeypatch):
    """The agent's own peak memory (VmHWM) answering GET /v1/jobs over 10,000 jobs of
    the largest release's shape: measured by the benchmark, in a fresh process."""
    from slurmk8s.render.controller import AGENT_MEMORY_LIMIT_MIB

    out = subprocess.run([sys.executable, str(ROOT / "hack/bench_agent_memory.py"), "--jobs", "10000",
                          "--modes", "after"], capture_output=True, text=True, timeout=300, check=True).stdout
    [row] = [line.split() for line in out.splitlines() if re.match(r"\s*10000\s+after\s", line)]
    idle, peak = float(row[3]), float(row[4])
    # The read itself may take at most a quarter of the limit: squeue runs in the same container.
    assert peak - idle < AGENT_MEMORY_LIMIT_MIB / 4, out
    assert peak < AGENT_MEMORY_LIMIT_MIB / 2, out
