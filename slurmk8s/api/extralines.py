"""What ``spec.slurmConfig.extraLines`` may set in slurm.conf (decision record 12). Pure.

An allowlist: scheduling, limit and timing keys pass; a key slurmk8s writes
itself is refused with the typed field that sets it; a key that runs or loads
a program is refused with that reason; any other key needs a typed field in
the spec. The line's form (characters, length) is the model's check
(:data:`slurmk8s.api.fields.ExtraLine`); this is the check of its key.
"""

from __future__ import annotations

from collections.abc import Iterator

from .errors import FieldError
from .fields import quote

__all__ = ["KNOB_FOR_KEY", "OWNED_KEYS", "EXTRA_LINE_KEYS", "PROGRAM_KEYS", "extra_line_errors"]

#: slurm.conf keys that slurmk8s writes, mapped to the typed knob that sets
#: them (None: managed by slurmk8s, not settable). Lower-case: Slurm keys are
#: case-insensitive. A test checks that the template writes no key missing here.
KNOB_FOR_KEY: dict[str, str | None] = {
    "maxnodecount": "spec.slurmConfig.maxNodeCount",
    "selecttypeparameters": "spec.slurmConfig.selectTypeParameters",
    "defmempercpu": "spec.slurmConfig.defMemPerCPU",
    "killwait": "spec.slurmConfig.killWait",
    "returntoservice": "spec.slurmConfig.returnToService",
    "authinfo": "spec.slurmConfig.credentialLifetime",
    "schedulerparameters": "spec.slurmConfig.schedulerParameters",
    "slurmctlddebug": "spec.slurmConfig.slurmctldDebug",
    "slurmddebug": "spec.slurmConfig.slurmdDebug",
    "proctracktype": "spec.slurmConfig.cgroups",
    "taskplugin": "spec.slurmConfig.cgroups",
    "topologyplugin": "spec.topology",
    "preempttype": "spec.partitions[].preemption",
    "preemptmode": "spec.partitions[].preemption",
    "preemptparameters": "spec.partitions[].preemption",
    "grestypes": "spec.nodeSets[].gpus",
    "nodename": "spec.nodeSets",
    "nodeset": "spec.nodeSets",
    "partitionname": "spec.partitions",
    "clustername": "metadata.name",
    "authalttypes": "spec.restApi.enabled",
    "authaltparameters": "spec.restApi.enabled",
    "accountingstoragetype": "spec.accounting.enabled",
    "accountingstoragehost": "spec.accounting.enabled",
    "accountingstorageport": "spec.accounting.enabled",
    "accountingstorageenforce": "spec.accounting.enforce",
    "jobacctgathertype": "spec.accounting.enabled",
    "prioritytype": "spec.accounting.fairShare",
    "priorityweightfairshare": "spec.accounting.fairShare.weightFairshare",
    "priorityweightage": "spec.accounting.fairShare.weightAge",
    "priorityweightjobsize": "spec.accounting.fairShare.weightJobSize",
    "priorityweightpartition": "spec.accounting.fairShare.weightPartition",
    "priorityweightqos": "spec.accounting.fairShare.weightQos",
    "prioritydecayhalflife": "spec.accounting.fairShare.decayHalfLife",
    "srunportrange": "spec.slurmConfig.srunPortRange",
    "healthcheckprogram": "spec.healthCheck",
    "healthcheckinterval": "spec.healthCheck.intervalSeconds",
    "healthchecknodestate": "spec.healthCheck.nodeStates",
    **{
        k: None
        for k in (
            "slurmctldhost controlmachine controladdr backupcontroller slurmctldport slurmdport "
            "slurmuser slurmduser authtype credtype selecttype slurmctldparameters treewidth "
            "statesavelocation slurmdspooldir slurmctldpidfile slurmdpidfile slurmctldlogfile "
            "slurmdlogfile include schedulertype mpidefault taskprolog prolog epilog "
            "jobcomptype launchparameters mailprog jobsubmitplugins prologslurmctld"
        ).lower().split()
    },
}
OWNED_KEYS = frozenset(KNOB_FOR_KEY)

#: The slurm.conf keys extraLines may set, lower-case: scheduling, limits and
#: timing knobs only (decision record 12). None of them names a program, a
#: plugin, a file or a directory, or changes who runs what; any other key
#: needs a typed field in the spec. Values are further limited by the model
#: (letters, digits and _ . , : / = + * @ % -).
EXTRA_LINE_KEYS = frozenset(
    k.lower()
    for k in (
        # scheduling
        "SchedulerTimeSlice DefCpuPerGPU DefMemPerGPU DefMemPerNode MaxMemPerCPU MaxMemPerNode "
        "EnforcePartLimits JobRequeue DisableRootJobs OverTimeLimit VSizeFactor "
        "PriorityWeightTRES PriorityWeightAssoc PriorityMaxAge PriorityFavorSmall PriorityUsageResetPeriod "
        "PriorityCalcPeriod PriorityFlags FairShareDampeningFactor "
        # limits
        "MaxJobCount MaxArraySize MaxStepCount MaxTasksPerNode MaxJobId FirstJobId MaxBatchRequeue "
        # timing
        "Waittime MessageTimeout SlurmctldTimeout SlurmdTimeout InactiveLimit MinJobAge "
        "BatchStartTimeout CompleteWait EpilogMsgTime PrologEpilogTimeout "
        "UnkillableStepTimeout TCPTimeout KeepAliveTime ResumeTimeout SuspendTimeout"
    ).split()
)
#: The keys that run or load something: the reason for an allowlist. Each is
#: refused with its own reason; the corpus test checks none reaches slurm.conf.
PROGRAM_KEYS = frozenset(
    k.lower()
    for k in (
        "HealthCheckProgram RebootProgram UnkillableStepProgram PlugStackConfig PluginDir "
        "PrologSlurmctld EpilogSlurmctld ResumeProgram SuspendProgram ResumeFailProgram "
        "SlurmctldPrimaryOnProg SlurmctldPrimaryOffProg ResvProlog ResvEpilog TaskProlog TaskEpilog "
        "SrunProlog SrunEpilog Prolog Epilog MailProg JobCompLoc JobCredentialPrivateKey "
        "JobCredentialPublicCertificate JobSubmitPlugins JobCompType AccountingStorageType "
        "BurstBufferType Include SlurmctldLogFile SlurmdLogFile SlurmSchedLogFile"
    ).split()
)


def extra_line_errors(i: int, line: str, seen: dict[str, int]) -> Iterator[FieldError]:
    """Keys slurmk8s owns, and keys set twice (the line's form was checked by the model)."""
    path = f"spec.slurmConfig.extraLines[{i}]"
    key = line.split("=", 1)[0]
    lower = key.lower()
    if lower in KNOB_FOR_KEY:
        knob = KNOB_FOR_KEY[lower]
        hint = f"use {knob} instead" if knob else "it cannot be overridden"
        runs = ", a program Slurm runs as root," if lower in PROGRAM_KEYS else ","
        yield FieldError(path, f"{quote(line)} sets {key}{runs} which slurmk8s writes itself; {hint}")
    elif lower in PROGRAM_KEYS:
        yield FieldError(
            path,
            f"{quote(line)} sets {key}, which makes Slurm run or load a program or file; extraLines "
            "may only set scheduling, limit and timing keys",
        )
    elif lower not in EXTRA_LINE_KEYS:
        yield FieldError(
            path,
            f"{quote(line)} sets {key}, which extraLines may not set: only scheduling, limit and "
            "timing keys pass through (see docs/decisions/0012-extra-lines-allowlist.md); other "
            "settings need a typed field in the spec",
        )
    elif lower in seen:
        yield FieldError(
            path, f"{quote(line)} sets {key} again; it is already set by extraLines[{seen[lower]}]"
        )
    else:
        seen[lower] = i
