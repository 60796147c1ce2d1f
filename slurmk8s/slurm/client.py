"""The one facade that talks to Slurm.

:class:`SlurmClient` is the narrow interface the operator, the bridge and the
sandbox use. Its only backend drives the Slurm commands (``scontrol``,
``sinfo --json``, ``squeue --json``, ``sbatch``, ``scancel``) through a
:data:`Runner`, so the same code works on a slurmctld host, inside a pod, or
in a test namespace. pyslurm is not used: PyPI has no build for Slurm 22.05.
The commands are those of the cluster's own release (the agent runs in the
controller image built for it); the client learns the release from their
JSON and reads nodes the way the version table says.

Rules that keep jobs safe live here, once:
- every drain slurmk8s sets carries the ``slurmk8s:`` prefix, and
  :meth:`SlurmClient.undrain` refuses to clear any other drain;
- node names and reasons are checked before they reach a command line.
"""

from __future__ import annotations

import calendar
import json
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from .. import log, versions
from ..api.fields import SLURM_NODE_NAME_RE, SLURM_SIGNALS
from .accounting import STATE_QUERIES, Associations, commands, parse_state, with_members
from .checkpoints import with_checkpoint_times
from .directory import GROUPS_FILE, VERDICT_FILE, Verdict, read_groups, read_verdict
from .errors import InvalidArgument
from .hostlist import expand
from .model import DRAIN_PREFIX, Job, JsonItems, Node, config_hash, job_from_json, node_from_json, release_of
from .reservations import HOLD_RESERVATION_PREFIX, Reservation, lend_reservation_name, reservations_from_text

if TYPE_CHECKING:
    from .metrics import Reading

__all__ = ["Runner", "LocalRunner", "local_runner", "SlurmClient", "SlurmError", "NotOurDrain", "DRAIN_PREFIX"]

#: Runs argv (stdin text or None) and returns the finished process. It must
#: not raise on a non-zero exit; the client reads the return code.
Runner = Callable[[Sequence[str], "str | None"], subprocess.CompletedProcess]

NODE_NAME = re.compile(SLURM_NODE_NAME_RE)
SIGNALS = SLURM_SIGNALS
#: How many names one ``getent passwd`` is given: at most 66 KiB of argv, far below ARG_MAX.
GETENT_BATCH = 2048
#: How long :meth:`SlurmClient.requeue` waits, after the job left COMPLETING, before
#: making it eligible: slurmd refuses a credential of the second it revoked the old one.
REISSUE_SECONDS = 1.0


class LocalRunner:
    """Runs the Slurm commands of this host (or container): a :data:`Runner`, and
    :meth:`stream` for output too large to hold whole (``squeue --json``)."""

    def __init__(self, timeout: float = 60):
        self.timeout = timeout

    def __call__(self, argv: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=self.timeout)

    def stream(self, argv: Sequence[str], chunk: int = 1 << 16) -> Iterator[str]:
        """The standard output of ``argv``, in chunks as it is written; killed after
        ``timeout`` seconds in all. Raises :class:`SlurmError` (with its stderr) at the end
        of the output when the command failed, so a failure is never read as a short answer."""
        with tempfile.TemporaryFile() as err, subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                text=True, encoding="utf-8", errors="replace") as proc:
            timer = threading.Timer(self.timeout, proc.kill)
            timer.start()
            assert proc.stdout is not None  # stdout=PIPE
            try:
                while text := proc.stdout.read(chunk):
                    yield text
                code = proc.wait()
            finally:
                timer.cancel()
                if proc.poll() is None:  # the reader stopped early
                    proc.kill()
            if code != 0:
                err.seek(0)
                raise SlurmError(argv, code, err.read(64 * 1024).decode("utf-8", errors="replace"))


#: The runner of this host (or container).
local_runner = LocalRunner()


class SlurmError(RuntimeError):
    """A Slurm command failed; carries its stderr."""

    def __init__(self, argv: Sequence[str], returncode: int, stderr: str):
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr.strip()
        super().__init__(f"`{' '.join(argv)}` failed (exit {returncode}): {self.stderr}")

    @property
    def unreachable(self) -> bool:
        """slurmctld did not answer: worth retrying, never a verdict on a node."""
        return "Unable to contact slurm controller" in self.stderr or "Connection refused" in self.stderr


class NotOurDrain(RuntimeError):
    """The node's drain was set by someone else; slurmk8s leaves it alone."""


def _check_node(name: str) -> str:
    if not NODE_NAME.fullmatch(name):
        raise InvalidArgument(f"{name!r} is not a Slurm node name")
    return name


def _check_reason(reason: str) -> str:
    if not reason or any(ord(c) < 32 for c in reason) or len(reason) > 200:
        raise InvalidArgument(f"{reason!r} is not a usable drain reason (one printable line, at most 200 characters)")
    return reason


_reads = retry(
    retry=retry_if_exception(lambda e: isinstance(e, SlurmError) and e.unreachable),
    stop=stop_after_attempt(3),
    wait=wait_exponential(multiplier=0.5, max=4),
    reraise=True,
)


#: Where the Slurm config is mounted in the slurmctld pod (and its agent).
CONFIG_DIR = Path("/etc/slurm")


def _utc_seconds(text: str) -> int | None:
    """``2026-11-27T07:35:40`` as printed by scontrol under TZ=UTC, in POSIX seconds; None if not a time."""
    try:
        return calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def check_signal(signal: str) -> str:
    if signal not in SIGNALS:
        raise InvalidArgument(f"{signal!r} is not a signal slurmk8s sends; use one of {', '.join(sorted(SIGNALS))}")
    return signal


class SlurmClient:
    """Reads and changes one Slurm cluster through its commands.

    ``config_dir`` is the directory of the config files slurmctld reads (as
    this process sees it); :meth:`config_hash` digests it. ``checkpoint_root``
    is the cluster's checkpoint directory as this process sees it (the agent's
    ``--checkpoint-root``): :meth:`published` reads below it only, and
    :meth:`jobs` gives each running job the time it last wrote there when asked
    (:mod:`.checkpoints`).
    """

    def __init__(self, runner: Runner = local_runner, config_dir: Path = CONFIG_DIR,
                 release: versions.Release | None = None, checkpoint_root: str | None = None,
                 directory_verdict: str = VERDICT_FILE, directory_groups: str = GROUPS_FILE):
        self._runner = runner
        self._config_dir = Path(config_dir)
        self._release = release
        self._checkpoint_root = checkpoint_root
        self._directory_verdict = directory_verdict
        self._directory_groups = directory_groups

    def _run(self, *argv: str, stdin: str | None = None) -> str:
        proc = self._runner(list(argv), stdin)
        if proc.returncode != 0:
            raise SlurmError(argv, proc.returncode, proc.stderr or proc.stdout)
        return proc.stdout

    def _stream(self, *argv: str) -> Iterator[str]:
        """The output of ``argv`` in chunks, never whole, where the runner can stream
        (:class:`LocalRunner`); from a plain :data:`Runner`, its output as one chunk."""
        stream = getattr(self._runner, "stream", None)
        if stream is not None:
            return stream(list(argv))
        return iter([self._run(*argv)])

    # Reads: idempotent, retried briefly when slurmctld does not answer.

    def ping(self) -> bool:
        proc = self._runner(["scontrol", "ping"], None)
        return proc.returncode == 0 and "UP" in proc.stdout

    def release(self) -> versions.Release:
        """The release of the Slurm commands this client runs (from their JSON's meta), which
        decides how nodes are read (the version table's ``nodes_command``)."""
        if self._release is None:
            self._release = versions.release(release_of(json.loads(self._run("sinfo", "--json"))))
        return self._release

    @_reads
    def nodes(self) -> list[Node]:
        data = json.loads(self._run(*self.release().nodes_command))
        return sorted((node_from_json(n) for n in data.get("nodes", [])), key=lambda n: n.name)

    def node(self, name: str) -> Node | None:
        """The node, or None if Slurm has no such node. Raises if Slurm cannot be asked."""
        return next((n for n in self.nodes() if n.name == _check_node(name)), None)

    @_reads
    def jobs(self, nodes: Sequence[str] = (), *, checkpoints: bool = False) -> list[Job]:
        """Jobs Slurm still tracks; with ``nodes``, only those allocated there; with
        ``checkpoints``, each running job with the time it last wrote below the
        checkpoint root (:mod:`.checkpoints`; none without a root).

        ``squeue --json`` ignores every filtering option (its man page says so),
        so the node filter is applied here, on each job's host list. Its output
        is read one job at a time as it arrives (:class:`~.model.JsonItems`):
        whole, at Slurm's MaxJobCount of 10,000 jobs, it took more memory than
        the agent's container has (hack/bench_agent_memory.py measures it).
        """
        wanted = {_check_node(n) for n in nodes}
        jobs = (job_from_json(j) for j in JsonItems(self._stream("squeue", "--json"), "jobs"))
        if wanted:
            jobs = (j for j in jobs if j.nodes and wanted.intersection(expand(j.nodes)))
        found = sorted(jobs, key=lambda j: j.job_id)
        if checkpoints and self._checkpoint_root is not None:
            return with_checkpoint_times(self._checkpoint_root, found)
        return found

    # Changes.

    def drain(self, name: str, reason: str) -> None:
        """Drain a node with a ``slurmk8s:``-prefixed reason (idempotent)."""
        self._run("scontrol", "update", f"nodename={_check_node(name)}", "state=drain",
                  f"reason={DRAIN_PREFIX} {_check_reason(reason)}")

    def set_down(self, name: str, reason: str) -> None:
        """Mark a node DOWN with a ``slurmk8s:``-prefixed reason: for a node whose
        slurmd is gone. slurmctld ends its jobs at once (requeueing those that
        may be) instead of waiting for SlurmdTimeout."""
        self._run("scontrol", "update", f"nodename={_check_node(name)}", "state=down",
                  f"reason={DRAIN_PREFIX} {_check_reason(reason)}")

    def undrain(self, name: str) -> None:
        """Clear a drain slurmk8s set. Raises NotOurDrain for anyone else's drain."""
        node = self.node(name)
        if node is None or not node.drain_set:
            return
        if not node.drain_is_ours:
            raise NotOurDrain(f"node {name} was drained by someone else ({node.reason!r}); leaving it drained")
        self._run("scontrol", "update", f"nodename={name}", "state=resume")

    def delete_node(self, name: str) -> None:
        """Remove a dynamic node record. A node that is already gone is fine."""
        try:
            self._run("scontrol", "delete", f"nodename={_check_node(name)}")
        except SlurmError as exc:
            if "Invalid node name" in exc.stderr or "not found" in exc.stderr.lower():
                return
            raise

    # Lending reservations (decision record 40). scontrol prints and reads
    # times in its time zone: it runs in UTC here, whatever the container says.

    @_reads
    def reservations(self) -> list[Reservation]:
        return reservations_from_text(self._run("env", "TZ=UTC", "scontrol", "-o", "show", "reservation"),
                                      _utc_seconds)

    def reserve(self, name: str, start: int) -> None:
        """Create the node's lending reservation from ``start`` on, or move it
        there: ``Flags=MAINT,IGNORE_JOBS`` (running jobs go on; no job starts
        whose time limit reaches past ``start``), for root only, without end.

        Slurm does not move a reservation that has begun ("Reservation
        already started"): that one is made again, while a short reservation
        of its own (``slurmk8s-hold-<node>``, two minutes, so that a bridge
        killed meanwhile leaves nothing that lasts) holds the node, so that
        no job starts there in between."""
        res = lend_reservation_name(_check_node(name))
        when = "StartTime=" + time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(start)))
        try:
            self._run("env", "TZ=UTC", "scontrol", "update", f"ReservationName={res}", when)
            return
        except SlurmError as exc:
            if exc.unreachable:
                raise
            if "already started" in exc.stderr:
                self._remake_started(name, res, when)
                return
            if "Requested reservation is invalid" not in exc.stderr:
                raise
        self._create_reservation(name, res, when)

    def _create_reservation(self, node: str, res: str, when: str, duration: str = "UNLIMITED") -> None:
        self._run("env", "TZ=UTC", "scontrol", "create", "reservation", f"ReservationName={res}",
                  f"Nodes={node}", when, f"Duration={duration}", "Flags=MAINT,IGNORE_JOBS", "Users=root")

    def _remake_started(self, node: str, res: str, when: str) -> None:
        hold = HOLD_RESERVATION_PREFIX + node
        try:
            self._create_reservation(node, hold, "StartTime=now", duration="2")
        except SlurmError as exc:
            if exc.unreachable or "Duplicate reservation name" not in exc.stderr:
                raise  # nothing held the node: the started reservation stays, as it was
        self._run("scontrol", "delete", f"ReservationName={res}")
        self._create_reservation(node, res, when)
        self._delete_reservation(hold)

    def _delete_reservation(self, res: str) -> None:
        """Delete reservation ``res``; none of that name is fine."""
        try:
            self._run("scontrol", "delete", f"ReservationName={res}")
        except SlurmError as exc:
            if exc.unreachable or "Requested reservation is invalid" not in exc.stderr:
                raise

    def unreserve(self, name: str) -> None:
        self._delete_reservation(lend_reservation_name(_check_node(name)))

    def signal(self, job_id: int, signal: str, *, batch_only: bool = True) -> None:
        """Send ``signal`` to a job: by default to its batch shell, as ``--signal=B:`` does."""
        check_signal(signal)
        argv = ["scancel", f"--signal={signal}"]
        if batch_only:
            argv.append("--batch")
        self._run(*argv, str(int(job_id)))

    def signal_node_jobs(self, name: str, signal: str) -> list[int]:
        """Send ``signal`` to the batch shell of every running job on node ``name``.

        Returns the ids of the jobs signalled. Jobs that are already ending
        (COMPLETING) are left alone.
        """
        check_signal(signal)
        running = [j.job_id for j in self.jobs(nodes=[_check_node(name)]) if j.state == "RUNNING"]
        for job_id in running:
            self.signal(job_id, signal)
        return running

    def requeue(self, job_id: int, *, start_now: bool = True, timeout: float = 30) -> None:
        """Requeue a job. ``start_now``: make it eligible a second after it left
        COMPLETING (:data:`REISSUE_SECONDS`) instead of after Slurm's requeue
        delay (about two minutes with the defaults)."""
        self._run("scontrol", "requeue", str(int(job_id)))
        if not start_now:
            return
        # The new begin time is set once the job has left COMPLETING; moving it
        # earlier before then has no effect.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = next((j for j in self.jobs() if j.job_id == job_id), None)
            if job is None or job.state != "COMPLETING":
                break
            time.sleep(0.2)
        # A slurmd that ended the job revoked its credential at the kill's time, to
        # the second, and refuses a credential made in that same second ("already
        # killed, do not launch"): a job started again at once on one of its old
        # nodes would fail instead of running. The kill came before the job left
        # COMPLETING, so a second after that any new credential is later than it.
        time.sleep(REISSUE_SECONDS)
        self.start_now(job_id)

    def start_now(self, job_id: int) -> None:
        """Make a pending job eligible now (clears a requeue's begin-time delay)."""
        self._run("scontrol", "update", f"jobid={int(job_id)}", "StartTime=now")

    def cancel(self, job_id: int) -> None:
        self._run("scancel", str(int(job_id)))

    def submit(self, script: str, args: Sequence[str] = ()) -> int:
        """sbatch ``script`` (its text); returns the job id."""
        out = self._run("sbatch", "--parsable", *args, stdin=script)
        return int(out.strip().split(";")[0])

    def published(self, model_dir: str) -> str:
        """``<model_dir>/LATEST`` read as the agent reads it for ``GET /v1/published``
        (:func:`.published.published`: only below the checkpoint root, never through
        a link, as nobody when this process is root). FileNotFoundError when nothing
        is published there or this client was given no checkpoint root;
        PermissionError for a directory outside the root or a file that is a link."""
        from .published import Fail, published

        try:
            return str(published(self._checkpoint_root, {"dir": [model_dir]})["latest"])
        except Fail as exc:
            if exc.status == 404:
                raise FileNotFoundError(f"{model_dir}/LATEST: {exc.message}") from None
            if exc.status in (400, 403):
                raise PermissionError(f"{model_dir}/LATEST: {exc.message}") from None
            raise OSError(f"{model_dir}/LATEST: {exc.message}") from None

    def apply_accounting(self, want: Associations) -> list[str]:
        """Give slurmdbd the accounts, user associations and QOS of ``want`` with
        ``sacctmgr``; only what is missing or differs is changed (nothing is
        removed; in an account that follows directory groups, the association of
        someone who left them is closed to new jobs). Returns the commands run.

        A command that fails does not stop the others (one bad association
        must not keep every later user from submitting): all are tried, and
        then the first failure is raised, saying how many failed."""
        outputs = {name: self._run("sacctmgr", "-n", "-P", *(a.format(cluster=want.cluster) for a in argv))
                   for name, argv in STATE_QUERIES.items()}
        have = parse_state(outputs)
        managed = None
        if want.groups:  # the directory's members (the sssd container lists them beside its sockets)
            want, managed = with_members(want, *self.group_members(
                sorted({g for _, groups in want.groups for g in groups})))
        done: list[str] = []
        failed: list[SlurmError] = []
        todo = commands(want, have, managed)
        for argv in todo:
            try:
                self._run(*argv)
            except SlurmError as exc:
                failed.append(exc)
                continue
            done.append(" ".join(argv))
        if failed:
            first = failed[0]
            raise SlurmError(first.argv, first.returncode,
                             f"{first.stderr} ({len(failed)} of {len(todo)} sacctmgr commands failed; "
                             f"the other {len(todo) - len(failed)} were applied)")
        return done

    def directory(self) -> Verdict:
        """The sssd container's last verdict on the directory (slurm/directory.py)."""
        return read_verdict(self._directory_verdict)

    def group_members(self, groups: Sequence[str]) -> tuple[dict[str, list[str] | None], set[str]]:
        """Each group's members, None for a group whose members are unknown (not in the
        directory, or the list the sssd container reads from it is missing, old or too long);
        and which members resolve to users through NSS (sssd: its filters and id range apply).
        A member whose name is no user name is left out of its group, which still counts, and
        logged; the others are asked of ``getent`` after ``--``, GETENT_BATCH at a time."""
        listed = read_groups(self._directory_groups)
        members = {g: None if listed is None else listed.members.get(g) for g in groups}
        if listed is not None and any(g in listed.invalid for g in groups):
            log.get("slurmk8s.agent").warning(
                "directory group members that are no user name were left out",
                groups={g: listed.invalid[g][:10] for g in groups if g in listed.invalid})
        names = sorted({m for found in members.values() if found for m in found})
        users: set[str] = set()
        for i in range(0, len(names), GETENT_BATCH):
            batch = names[i:i + GETENT_BATCH]
            done = self._runner(["getent", "passwd", "--", *batch], None)
            if done.returncode not in (0, 2):  # 2: one was not found; the others are still printed
                log.get("slurmk8s.agent").warning("getent passwd failed: these members stay unresolved",
                                                  code=done.returncode, members=len(batch),
                                                  stderr=(done.stderr or "")[:200])
                continue
            users |= {line.split(":", 1)[0] for line in done.stdout.splitlines()} & set(batch)
        return members, users

    def reconfigure(self) -> None:
        """Make slurmctld (and every slurmd) re-read the config files."""
        self._run("scontrol", "reconfigure")

    def metrics_reading(self) -> Reading:
        """What the Slurm metrics show (:mod:`.metrics`): the nodes, the jobs, ``sdiag``,
        and, where slurm.conf sends accounting to slurmdbd, whether it answers and the
        accounts it knows (``sacctmgr show account``, which asks slurmdbd itself): the
        metrics name only those. Three or four commands, each one RPC to slurmctld or
        slurmdbd."""
        from .metrics import Reading, parse_sdiag

        accounting_up, accounts = None, None
        if re.search(r"^AccountingStorageType=accounting_storage/slurmdbd\s*$", self._slurm_conf(), re.M):
            # sacctmgr waits long for a slurmdbd that does not answer; 5 s is plenty for one that does.
            done = self._runner(["timeout", "5", "sacctmgr", "-n", "-P", "show", "account", "format=account"], None)
            accounting_up = done.returncode == 0
            if accounting_up:
                accounts = frozenset(a.strip() for a in done.stdout.splitlines() if a.strip())
        return Reading(nodes=tuple(self.nodes()), jobs=tuple(self.jobs()),
                       diagnostics=parse_sdiag(self._run("sdiag")), accounting_up=accounting_up, accounts=accounts)

    def _slurm_conf(self) -> str:
        try:
            return (self._config_dir / "slurm.conf").read_text()
        except OSError:
            return ""

    def config_hash(self) -> str:
        """The hash of the config files in ``config_dir``, as the renderer computes it.

        Equal to the rendered ``status.configHash`` once the kubelet has synced
        the ConfigMap into the pod: then a reconfigure reads the new files.
        Hidden entries (the kubelet's ``..data`` links) are skipped.
        """
        files = {}
        for path in sorted(self._config_dir.iterdir()):
            if path.name.startswith(".") or not path.is_file():
                continue
            files[path.name] = path.read_text()
        return config_hash(files)
