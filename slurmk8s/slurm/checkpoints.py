"""When a running job last wrote its checkpoint, read from the checkpoint layer.

Every task of a job gets ``SLURMK8S_CHECKPOINT_DIR=<root>/<user>/<job name>[_<array
task id>]`` from the slurmd image's TaskProlog (images/slurmd/task-prolog.sh), which
makes the job name one safe path component; :func:`job_dir` is that rule, and
tests/test_render.py holds the two to the same cases. A checkpoint is written into a
new entry of that directory and made current by a rename (examples/train.sh:
``step-N`` then ``LATEST``), which changes the directory's modification time, and a
writer that overwrites a file in place changes that file's: so the job's last
checkpoint is the newest modification time of the directory and of its entries.

The user's directory is found by its owner, the job's uid (:func:`user_dirs`): the
TaskProlog makes and uses only a directory of the job's own uid there, and the agent
that reads this need not know the cluster's users by name. The bridge's reclaim order
(``slurmk8s/bridge/choose.py``) counts a job's work at risk from its last checkpoint
rather than its start.

Only the agent's ``GET /v1/jobs?checkpoints=1`` reads them, for the bridge; the
facade's other reads of the jobs (metrics, its own waits) do not. Everything below
the root is the jobs', so it is read as an adversary's: each component opened
without following a link (``open_beneath``, non-blocking, so a FIFO there cannot
block the reader), entries stat'ed without following one, at
most :data:`MAX_ENTRIES` of them, and any error means "not known" (the order then
counts from the job's start, as without this). Only modification times are passed
on: no name, and no byte of the jobs' files.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat

from ..published_model import open_beneath
from .model import Job

__all__ = ["MAX_ENTRIES", "MAX_USERS", "job_dir", "last_write", "user_dir", "user_dirs", "with_checkpoint_times"]

#: Entries of a checkpoint directory looked at; a directory with more is judged on these.
MAX_ENTRIES = 256
#: Entries of the checkpoint root (one per user) looked at.
MAX_USERS = 65536
_UNSAFE = re.compile(rb"[^A-Za-z0-9._-]")


def job_dir(user: str, name: str, array_task_id: int | None = None) -> tuple[str, str]:
    """The two path components below the checkpoint root of a job's checkpoint
    directory: its user, and its name made safe byte by byte (the TaskProlog's rule)."""
    safe = _UNSAFE.sub(b"_", name.encode("utf-8", "surrogateescape"))
    safe = (b"_" + safe[1:] if safe.startswith(b".") else safe)[:128] or b"job"
    component = safe.decode("ascii")
    if array_task_id is not None:
        component = f"{component}_{int(array_task_id)}"
    return user, component


def user_dirs(root: str) -> dict[int, list[str]]:
    """The users' directories of the checkpoint root by owner: the TaskProlog only uses
    ``<root>/<user>`` when it is a directory (not a link) of the job's own uid, and the
    agent may not know users by name (slurmctld's users are not the agent's). Empty
    when the root cannot be read; at most :data:`MAX_USERS` entries are looked at."""
    owners: dict[int, list[str]] = {}
    try:
        with os.scandir(root) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_USERS:
                    break
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    owners.setdefault(st.st_uid, []).append(entry.name)
    except OSError:
        return {}
    return owners


def user_dir(owners: dict[int, list[str]], uid: int | None, name: str) -> str | None:
    """The directory of the user ``uid`` (named ``name`` where the reader knows it) in
    :func:`user_dirs`' map: the one of that name, else the only one that uid owns."""
    mine = owners.get(uid, []) if uid is not None else []
    if name and name in mine:
        return name
    return mine[0] if len(mine) == 1 else None


def last_write(root: str, parts: tuple[str, ...]) -> int | None:
    """The newest modification time (POSIX seconds) of ``root/parts...`` and its
    entries, opened without following any link (:func:`~slurmk8s.published_model.open_beneath`,
    the rule for what jobs write); None when it is not a directory reached that way,
    or cannot be read."""
    root_fd = None
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the administrator's path
        fd = open_beneath(root_fd, parts, directory=True)
    except (OSError, ValueError):
        return None
    finally:
        if root_fd is not None:
            os.close(root_fd)
    try:
        newest = os.fstat(fd).st_mtime
        with os.scandir(fd) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_ENTRIES:
                    break
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
                    newest = max(newest, st.st_mtime)
        return int(newest)
    except OSError:
        return None
    finally:
        os.close(fd)


def with_checkpoint_times(root: str, jobs: list[Job]) -> list[Job]:
    """``jobs`` with each running job's :func:`last_write` as its ``checkpoint_time``
    where one is known; the root's user directories are read once, if a job runs."""
    if not any(j.state == "RUNNING" for j in jobs):
        return jobs
    owners = user_dirs(root)
    out = []
    for job in jobs:
        user = user_dir(owners, job.user_id, job.user) if job.state == "RUNNING" else None
        written = last_write(root, job_dir(user, job.name, job.array_task_id)) if user is not None else None
        out.append(job if written is None else dataclasses.replace(job, checkpoint_time=written))
    return out
