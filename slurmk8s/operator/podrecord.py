"""The evacuation rule's record (:class:`slurmk8s.evacuation.Record`) as pod annotations. Pure.

The operator keeps the record of a worker's evacuation on the worker's pod,
so a restarted operator resumes the grace period instead of starting it
again or forgetting it; the bridge keeps the same record on the Node
(``slurmk8s/bridge/nodestate.py``). This is only the codec: times as RFC 3339
(:mod:`slurmk8s.times`), job ids as a comma-separated list.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from slurmk8s import evacuation
from slurmk8s.evacuation import format_job_ids, parse_job_ids
from slurmk8s.render import names
from slurmk8s.times import format_time, parse_time

__all__ = ["ANNOTATIONS", "read_record", "record_annotations"]

#: Every annotation of the record.
ANNOTATIONS = (names.DRAIN_STARTED, names.DRAIN_PURPOSE, names.JOBS_SIGNALLED, names.SIGNALLED_JOBS,
               names.JOBS_FORCED)


def read_record(annotations: Mapping[str, str]) -> evacuation.Record:
    return evacuation.Record(
        purpose=annotations.get(names.DRAIN_PURPOSE),
        started=parse_time(annotations.get(names.DRAIN_STARTED)),
        signalled=parse_time(annotations.get(names.JOBS_SIGNALLED)),
        jobs=parse_job_ids(annotations.get(names.SIGNALLED_JOBS)),
        forced=parse_time(annotations.get(names.JOBS_FORCED)),
    )


def record_annotations(record: evacuation.Record) -> dict[str, str | None]:
    """Every annotation of the record; None removes one."""
    def t(value: datetime | None) -> str | None:
        return None if value is None else format_time(value)

    return {
        names.DRAIN_STARTED: t(record.started),
        names.DRAIN_PURPOSE: record.purpose,
        names.JOBS_SIGNALLED: t(record.signalled),
        names.SIGNALLED_JOBS: format_job_ids(record.jobs) or None,
        names.JOBS_FORCED: t(record.forced),
    }
