"""Slurm's metrics (slurmk8s/slurm/metrics.py): the pure core over records and
real sdiag text, the labels that must not grow with jobs or nodes, and the
server that serves them (slurmk8s/metricsserver.py)."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from slurmk8s import metricsserver
from slurmk8s.api.cluster import LENT_PREFIX
from slurmk8s.slurm.client import SlurmClient
from slurmk8s.slurm.metrics import (
    GPU_STATES,
    MAX_LABEL_VALUES,
    NODE_STATES,
    OTHER,
    Diagnostics,
    QueueWait,
    Reading,
    SlurmMetrics,
    families,
    parse_sdiag,
)
from slurmk8s.slurm.model import Job, Node, gres_gpus, tres_gpus

from .reach import reached, reaches

FIXTURES = Path(__file__).parent / "fixtures" / "slurm-json"


def node(name: str, state: str = "idle", partitions=("gpu",), gpus: int = 0, alloc: int = 0, flags=(),
         features=()) -> Node:
    return Node(name=name, state=state, flags=frozenset(flags), reason="", features=tuple(features),
                partitions=tuple(partitions), cpus=8, alloc_cpus=0, gres=f"gpu:h100:{gpus}(S:0-1)" if gpus else "",
                address="", gres_used=f"gpu:h100:{alloc}(IDX:0-{alloc - 1})" if alloc else "gpu:h100:0(IDX:N/A)")


def job(job_id: int, state: str = "RUNNING", partition: str = "gpu", account: str = "ml", gpus: int = 0,
        submit: int | None = 1000, start: int | None = 1060, reason: str = "None", user: str = "alice") -> Job:
    return Job(job_id=job_id, name=f"j{job_id}", user=user, state=state, partition=partition, nodes="",
               requeue=False, restart_count=0, reason=reason, account=account, submit_time=submit,
               start_time=start, gpus=gpus)


def samples(r: Reading, queue_wait: QueueWait | None = None) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value, through the text format Prometheus reads."""
    class One:
        def collect(self):
            yield from families(r)
            if queue_wait is not None:
                yield queue_wait.family()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(One())
    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


@pytest.mark.parametrize("text, want", [
    ("", 0), ("gpu:4", 4), ("gpu", 1), ("gpu:a100:2(S:0-1)", 2), ("gpu:0", 0), ("gpu:a100:0(IDX:N/A)", 0),
    ("gpu:a100:1(IDX:0),gpu:h100:2(IDX:1-2)", 3), ("gpu:a100:2(IDX:0,2)", 2), ("mps:100,gpu:2", 2), ("shard:8", 0),
])
def test_gpus_of_a_nodes_gres(text, want):
    assert gres_gpus(text) == want


@pytest.mark.parametrize("text, want", [
    ("cpu=2,mem=1G,node=1,billing=2", 0), ("cpu=2,gres/gpu=2,gres/gpu:a100=2", 2), ("gres/gpu:a100=2", 0), ("", 0),
])
def test_gpus_of_a_jobs_tres(text, want):
    assert tres_gpus(text) == want


def test_nodes_and_gpus_by_partition_and_state_with_lent_nodes_apart():
    r = Reading(nodes=(
        node("a", "mixed", gpus=4, alloc=1),
        node("b", "idle", gpus=4, flags={"DRAIN"}),
        node("c", "allocated", gpus=2, alloc=2, features=(f"{LENT_PREFIX}pool",)),
        node("d", "idle", partitions=("cpu", "gpu")),
        node("e", "down", partitions=("cpu",)),
        node("f", "mixed", partitions=("cpu",), flags={"DRAIN"}),
    ), jobs=(), diagnostics=Diagnostics())
    s = samples(r)
    draining = {dict(k)["partition"]: v for (n, k), v in s.items() if n == "slurmk8s_slurm_draining_nodes"}
    assert draining == {"cpu": 1, "gpu": 0}  # b is drained and idle: its drain has ended
    nodes = {(dict(k)["partition"], dict(k)["state"]): v for (n, k), v in s.items() if n == "slurmk8s_slurm_nodes"}
    assert {k: v for k, v in nodes.items() if v} == {
        ("gpu", "mixed"): 1, ("gpu", "drain"): 1, ("gpu", "allocated"): 1, ("gpu", "idle"): 1,
        ("cpu", "idle"): 1, ("cpu", "down"): 1, ("cpu", "drain"): 1}
    assert len(nodes) == 2 * len(NODE_STATES)  # every state of every partition, zeros too
    gpus = {(dict(k)["lent"], dict(k)["state"]): v for (n, k), v in s.items() if n == "slurmk8s_slurm_gpus"}
    assert gpus == {("false", "allocated"): 1, ("false", "idle"): 3, ("false", "unavailable"): 4,
                    ("true", "allocated"): 2, ("true", "idle"): 0, ("true", "unavailable"): 0}
    assert {st for _, st in gpus} == set(GPU_STATES)


def test_jobs_pending_reasons_and_accounts():
    r = Reading(nodes=(), jobs=(
        job(1, gpus=2), job(2, gpus=1, account="physics"), job(3, "PENDING", reason="Resources", gpus=4, start=None),
        job(4, "PENDING", reason="Priority", account="physics", start=5000), job(5, "COMPLETED", gpus=8),
        job(6, "PENDING", partition="cpu", reason="Priority", account="physics"),
    ), diagnostics=Diagnostics(), accounting_up=False, accounts=frozenset({"ml", "physics", "chem"}))
    s = samples(r)
    assert s["slurmk8s_slurm_jobs", (("partition", "gpu"), ("state", "running"))] == 2
    assert s["slurmk8s_slurm_jobs", (("partition", "gpu"), ("state", "pending"))] == 2
    assert s["slurmk8s_slurm_jobs", (("partition", "gpu"), ("state", "completed"))] == 1
    assert s["slurmk8s_slurm_pending_jobs", (("partition", "gpu"), ("reason", "Resources"))] == 1
    assert s["slurmk8s_slurm_pending_jobs", (("partition", "cpu"), ("reason", "Priority"))] == 1
    assert s["slurmk8s_slurm_account_running_gpus", (("account", "ml"),)] == 2  # the completed job's GPUs are free
    assert s["slurmk8s_slurm_account_running_gpus", (("account", "physics"),)] == 1
    assert s["slurmk8s_slurm_account_pending_jobs", (("account", "physics"),)] == 2
    assert s["slurmk8s_slurm_accounting_up", ()] == 0
    assert ("slurmk8s_slurm_accounting_up", ()) not in samples(replace(r, accounting_up=None))


def test_accounts_are_labels_only_where_slurmdbd_knows_them():
    """Without accounting (the default), ``sbatch --account`` takes any word: no
    job's account becomes a label, every job counts under (other). With it,
    only the accounts slurmdbd knows do (sacctmgr stores them in lower case)."""
    typed = ("ml", "x" * 60, "job-4711", "Physics")
    r = Reading(nodes=(), jobs=tuple(job(i, gpus=1, account=a) for i, a in enumerate(typed)),
                diagnostics=Diagnostics())
    running = {dict(k)["account"]: v for (n, k), v in samples(r).items() if n == "slurmk8s_slurm_account_running_gpus"}
    assert running == {OTHER: 4}
    known = replace(r, accounting_up=True, accounts=frozenset({"ml", "physics"}))
    running = {dict(k)["account"]: v for (n, k), v in samples(known).items()
               if n == "slurmk8s_slurm_account_running_gpus"}
    assert running == {"ml": 1, "physics": 1, OTHER: 2}


def _series(r: Reading) -> dict[str, set]:
    out: dict[str, set] = {}
    for fam in families(r):
        for s in fam.samples:
            out.setdefault(fam.name, set()).add(tuple(sorted(s.labels.items())))
    return out


#: The most series each family may have, from the caps: labels' values multiplied.
CAP = MAX_LABEL_VALUES
BOUNDS = {"slurmk8s_slurm_nodes": CAP["partition"] * len(NODE_STATES),
          "slurmk8s_slurm_draining_nodes": CAP["partition"],
          "slurmk8s_slurm_gpus": CAP["partition"] * 2 * len(GPU_STATES),
          "slurmk8s_slurm_jobs": CAP["partition"] * CAP["state"],
          "slurmk8s_slurm_pending_jobs": CAP["partition"] * CAP["reason"],
          "slurmk8s_slurm_account_running_gpus": CAP["account"],
          "slurmk8s_slurm_account_pending_jobs": CAP["account"]}


def test_series_are_bounded_whatever_the_jobs():
    """Jobs whose accounts, partitions, reasons and states are any words, in any
    number: each label keeps within its cap, each family within the product
    of its labels' caps, and without accounting no account a user typed is a
    label. The strategies reach past every cap (asserted at the end)."""
    reached: Counter = Counter()
    many = st.one_of(st.integers(0, 40), st.integers(1300, 2500))

    @settings(max_examples=40, deadline=None)
    @given(accounts=many, partitions=st.one_of(st.integers(1, 10), st.integers(130, 400)),
           reasons=st.one_of(st.integers(1, 5), st.integers(130, 300)), states=st.integers(1, 100),
           word=st.text(min_size=1, max_size=12), accounting=st.booleans(), seed=st.integers(0, 10**6))
    def check(accounts, partitions, reasons, states, word, accounting, seed):
        n = max(accounts, partitions, reasons, states, 1)
        jobs = tuple(job(i, ("PENDING", "RUNNING", f"{word}{i % states}")[i % 3], partition=f"{word}p{i % partitions}",
                         account=f"{word}{seed}a{i % max(accounts, 1)}", reason=f"{word}r{i % reasons}", gpus=i % 3)
                     for i in range(n))
        nodes = tuple(node(f"n{i}", partitions=(f"{word}p{i % partitions}", f"{word}p{(i + 1) % partitions}"), gpus=2,
                           features=(f"{LENT_PREFIX}x",) if i % 2 else ()) for i in range(min(n, 300)))
        known = frozenset(j.account.lower() for j in jobs if j.job_id % 7) if accounting else None
        r = Reading(nodes=nodes, jobs=jobs, diagnostics=Diagnostics(), accounting_up=accounting or None,
                    accounts=known)
        series = _series(r)
        for name, bound in BOUNDS.items():
            assert len(series.get(name, ())) <= bound, name
        for name, fam in series.items():
            for label, cap in CAP.items():
                assert len({v for labels in fam for k, v in labels if k == label}) <= cap, (name, label)
        shown = {v for labels in series["slurmk8s_slurm_account_running_gpus"] for _, v in labels}
        assert shown <= (known or frozenset()) | {OTHER}
        if not accounting:
            assert shown == {OTHER}
        for label, count in (("account", len(known or ())), ("partition", partitions), ("reason", reasons)):
            if count > CAP[label]:
                event(f"{label} past its cap")
                reached[label] += 1
        if not accounting and accounts > CAP["account"]:
            reached["typed accounts without accounting"] += 1

    check()
    assert min(reached[k] for k in ("account", "partition", "reason", "typed accounts without accounting")) >= 3, \
        reached


def test_the_queue_wait_histogram_keeps_its_cap_across_readings():
    qw = QueueWait()
    for r in range(3):
        qw.observe([job(r * 1000 + i, partition=f"p{r}-{i}") for i in range(100)])
    partitions = {dict(s.labels)["partition"] for s in qw.family([f"q{i}" for i in range(50)]).samples}
    assert len(partitions) == CAP["partition"] and OTHER in partitions


class _Accounting:
    def __init__(self):
        self.up = True

    def metrics_reading(self) -> Reading:
        return Reading((), (job(1, gpus=2, account="ml"), job(2, gpus=1, account="typed")), Diagnostics(),
                       accounting_up=self.up, accounts=frozenset({"ml"}) if self.up else None)


def test_while_slurmdbd_is_away_the_accounts_it_last_named_stay_labels():
    slurm = _Accounting()
    m = SlurmMetrics(slurm)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(m)
    m.read()
    slurm.up = False
    m.read()
    text = generate_latest(registry).decode()
    assert 'slurmk8s_slurm_account_running_gpus{account="ml"} 2.0' in text
    assert f'slurmk8s_slurm_account_running_gpus{{account="{OTHER}"}} 1.0' in text
    assert "slurmk8s_slurm_accounting_up 0.0" in text


def test_the_facade_reads_the_accounts_slurmdbd_knows(tmp_path):
    (tmp_path / "slurm.conf").write_text("AccountingStorageType=accounting_storage/slurmdbd\n")
    calls = []

    def runner(argv, stdin):
        calls.append(list(argv))
        out = {"sacctmgr": "ml\nphysics\n", "sdiag": "", "squeue": '{"jobs": []}'}.get(argv[0] if argv[0] != "timeout"
                                                                                   else argv[2], "")
        return subprocess.CompletedProcess(argv, 0, out, "")

    client = SlurmClient(runner, config_dir=tmp_path)
    client.nodes = list  # the node listing depends on the release; not what is tested here
    client.jobs = list
    r = client.metrics_reading()
    assert r.accounting_up is True and r.accounts == frozenset({"ml", "physics"})
    assert ["timeout", "5", "sacctmgr", "-n", "-P", "show", "account", "format=account"] in calls


class _Partitions:
    def __init__(self, qw: QueueWait, partitions: list[str]):
        self.qw, self.partitions = qw, partitions

    def family(self):
        return self.qw.family(self.partitions)


def test_queue_wait_counts_each_start_once_and_a_requeued_start_again():
    qw = QueueWait()
    running = job(1, submit=1000, start=1045)
    pending = job(2, "PENDING", submit=1000, start=9000)  # a pending job's start time is an estimate
    qw.observe([running, pending])
    qw.observe([running, pending])
    s = samples(Reading((), (), Diagnostics()), qw)
    count = s["slurmk8s_slurm_queue_wait_seconds_count", (("partition", "gpu"),)]
    assert count == 1 and s["slurmk8s_slurm_queue_wait_seconds_sum", (("partition", "gpu"),)] == 45
    assert s["slurmk8s_slurm_queue_wait_seconds_bucket", (("le", "30.0"), ("partition", "gpu"))] == 0
    assert s["slurmk8s_slurm_queue_wait_seconds_bucket", (("le", "60.0"), ("partition", "gpu"))] == 1
    zeros = {k: v for k, v in samples(Reading((), (), Diagnostics()), _Partitions(qw, ["cpu", "gpu"])).items()
             if dict(k[1]).get("partition") == "cpu"}
    assert zeros and set(zeros.values()) == {0}  # born at 0, so the first start in cpu shows in increase()
    qw.observe([replace(running, start_time=2000)])  # requeued and started again
    s = samples(Reading((), (), Diagnostics()), qw)
    assert s["slurmk8s_slurm_queue_wait_seconds_count", (("partition", "gpu"),)] == 2
    assert s["slurmk8s_slurm_queue_wait_seconds_bucket", (("le", "+Inf"), ("partition", "gpu"))] == 2


def test_real_sdiag_of_slurmctld():
    d = parse_sdiag((FIXTURES / "22.05" / "sdiag.txt").read_text())
    assert (d.server_threads, d.agent_queue, d.dbd_queue) == (3, 0, 0)
    assert d.cycles == {"main": 1, "backfill": 0}
    assert d.last_cycle_us == {"main": 436, "backfill": 0} and d.mean_cycle_us == {"main": 436}
    assert (d.queue_length, d.backfilled_jobs) == (1, 0)
    assert d.rpcs == 2 + 2 + 1 + 1 + 1 + 1  # by message type, not by user again
    s = samples(Reading((), (), d))
    assert s["slurmk8s_slurm_scheduler_last_cycle_seconds", (("scheduler", "main"),)] == pytest.approx(436e-6)
    assert s["slurmk8s_slurm_rpcs_total", ()] == 8


def test_sdiag_that_says_nothing_gives_no_invented_figures():
    d = parse_sdiag("sdiag: error: Unable to contact slurm controller\n")
    assert d == Diagnostics()
    names = {n for n, _ in samples(Reading((), (), d))}
    assert not names & {"slurmk8s_slurm_rpcs_total", "slurmk8s_slurm_server_threads", "slurmk8s_slurm_accounting_queue"}


LABELS = {"partition", "state", "lent", "reason", "account", "scheduler", "le"}


@reaches(hundreds=0.1)
@settings(max_examples=50, deadline=None)
@given(users=st.lists(st.text("abcdefgh", min_size=3, max_size=8), min_size=1, max_size=5),
       count=st.integers(1, 300), seed=st.integers(0, 1000))
def test_no_job_id_user_or_node_name_becomes_a_label(users, count, seed):
    """The series are the same for 1 job or 300, on 2 nodes or 200: the labels
    are partitions, accounts and Slurm's own words."""
    if count >= 100:
        reached("hundreds")  # a label per job or node would be a hundred series more
    def reading(n_jobs: int, n_nodes: int) -> Reading:
        states = ("RUNNING", "PENDING", "COMPLETED")
        return Reading(
            nodes=tuple(node(f"node-{seed}-{i}", ("idle", "mixed")[i % 2], gpus=4, alloc=i % 4) for i in range(n_nodes)),
            jobs=tuple(job(seed * 1000 + i, states[i % 3], account=("ml", "physics")[i % 2], user=users[i % len(users)],
                           reason=("Priority", "Resources")[i % 2], gpus=i % 3) for i in range(n_jobs)),
            diagnostics=Diagnostics())
    small, large = samples(reading(6, 2)), samples(reading(6 + count, 2 + count))
    assert set(small) == set(large)
    for _, labels in large:
        assert {k for k, _ in labels} <= LABELS
        values = {v for _, v in labels}
        assert not values & set(users) and not any(v.startswith(("node-", "j")) or v.isdigit() for v in values)


class FakeSlurm:
    def __init__(self):
        self.reads = 0
        self.fail = False

    def metrics_reading(self) -> Reading:
        self.reads += 1
        if self.fail:
            raise OSError("slurmctld is away")
        return Reading((node("a", gpus=2),), (job(1),), Diagnostics(rpcs=5))


def test_scrapes_serve_the_last_reading_and_a_failed_read_says_so():
    slurm = FakeSlurm()
    m = SlurmMetrics(slurm, interval=1)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(m)
    text = generate_latest(registry).decode()
    assert "slurmk8s_slurm_up 0.0" in text and "slurmk8s_slurm_nodes" not in text and slurm.reads == 0
    m.read()
    for _ in range(3):
        text = generate_latest(registry).decode()
    assert slurm.reads == 1  # scrapes never read Slurm themselves
    assert "slurmk8s_slurm_up 1.0" in text and "slurmk8s_slurm_rpcs_total 5.0" in text
    slurm.fail = True
    m.read()
    text = generate_latest(registry).decode()
    assert "slurmk8s_slurm_up 0.0" in text and "slurmk8s_slurm_rpcs_total 5.0" in text  # the last good reading
    stop = threading.Event()
    read = m.read

    def read_then_stop():
        read()
        stop.set()  # the first read of run() is done: it stops instead of waiting its interval

    m.read = read_then_stop
    thread = threading.Thread(target=m.run, args=(stop,))
    thread.start()
    thread.join(5)
    assert not thread.is_alive() and slurm.reads == 3


@pytest.fixture
def server():
    registry = CollectorRegistry(auto_describe=False)
    m = SlurmMetrics(FakeSlurm())
    m.read()
    registry.register(m)
    srv = metricsserver.serve_metrics(0, "127.0.0.1", registry)
    yield srv
    srv.shutdown()
    srv.server_close()


def test_the_server_serves_metrics_alone_with_no_token(server):
    port = server.server_address[1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200 and b"slurmk8s_slurm_up 1.0" in resp.read()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                 headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        assert resp.read().rstrip().endswith(b"# EOF")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/nodes", timeout=5)
    assert err.value.code == 404


def test_a_request_sent_slowly_is_cut_off_at_its_deadline():
    registry = CollectorRegistry(auto_describe=False)
    server = metricsserver.metrics_server(0, "127.0.0.1", registry, replace(metricsserver.LIMITS, deadline=1.0))
    server.start()
    port = server.server_address[1]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            started = time.monotonic()
            answer = b""
            sock.settimeout(0.2)
            for ch in b"GET /metrics HTTP/1.0\r\n":  # a byte every 0.2 s: never 10 s of silence
                try:
                    sock.sendall(bytes([ch]))
                    answer += sock.recv(1000)
                except TimeoutError:
                    continue
                except OSError:
                    break
                if answer:
                    break
            assert answer.startswith(b"HTTP/1.1 408") and b'"kind": "timeout"' in answer
            assert time.monotonic() - started < 3  # cut at the 1 s deadline, not after 4.6 s of bytes
    finally:
        server.stop()


def test_idle_connections_over_the_cap_never_keep_a_scrape_out(server):
    """Issue 41: eight idle connections used to close every scrape; now idle ones are closed for it."""
    port = server.server_address[1]
    held = [socket.create_connection(("127.0.0.1", port), timeout=5)
            for _ in range(metricsserver.LIMITS.max_connections + 20)]
    try:
        for _ in range(3):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                assert resp.status == 200 and b"slurmk8s_slurm_up 1.0" in resp.read()
    finally:
        for sock in held:
            sock.close()
