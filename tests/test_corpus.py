"""The hostile-input corpus (issue 13, item 10): every case is refused with a
field path or accepted and safe; none is accepted and unsafe, none crashes.

Over 500 lines because the large generated cases are built here, beside the one loop
that checks every case.

The cases: ``tests/corpus/slurmcluster.yaml`` and ``nodelendingpolicy.yaml``
(hand-written, each a ``merge`` onto the matching ``base-*.yaml`` or a whole
``manifest``), the large ones built by :func:`generated_cases` (they do not
fit a file), the examples, the injection sweep (LF, CR, NUL, U+2028 and U+0085
put into every string of each base, map keys included) and pairs of clusters
in one namespace whose names used to collide.

Each case gets exactly one class; the definitions are mechanical:

refused-with-path
    The loader raises InvalidSpec; every error has a path that starts with
    ``apiVersion``, ``kind``, ``metadata``, ``spec``, ``status``,
    ``(document)`` or ``(file)`` (or is an unknown top-level key, escaped)
    and a non-empty reason, and the printed
    error is one line per problem with no unprintable character (control,
    zero-width, line separator) in it.
crashed
    Any other exception while loading or rendering, or a refusal that
    breaks the rules above.
accepted-and-unsafe
    Loaded and rendered, and one of these holds (U1-U22; a policy renders
    nothing alone, so U10-U12 and U20 apply to it, and the rules of objects
    to the lent pod it would start for the base cluster):

    U1  a rendered config file has an unprintable character other than the
        LF ending its lines, or a line ending in a backslash;
    U2  a slurm.conf line that is not blank, a comment, or
        ``Key=Value( Key=Value)*``;
    U3  a slurm.conf key neither written by slurmk8s (OWNED_KEYS) nor set by
        the spec's extraLines and in the allowlist (EXTRA_LINE_KEYS); or a key
        that runs or loads a program (PROGRAM_KEYS) with a value slurmk8s does
        not write itself;
    U4  a PartitionName or NodeSet line naming DEFAULT or ALL, or a count of
        them that differs from the spec's partitions and node sets (plus the
        lent node sets);
    U5  a rendered object whose name is invalid for its kind (Service: a
        DNS-1035 label; StatefulSet: a DNS-1123 label of at most 52, so its
        pods' names and hash labels fit; others: a DNS-1123 subdomain), or
        one kubernetes_validate refuses;
    U6  two rendered objects with one kind and name (for the cluster pairs:
        across the two clusters);
    U7  a ConfigMap whose data is over 1 MiB;
    U8  a container request of memory or cpu that is not positive, or a
        node's RealMemory below 1 MiB;
    U9  a shared volume mounted at, inside or over a directory the images
        use (IMAGE_PATHS) or another mount of the same container;
    U10 an unprintable character in any string of a rendered object (Secrets'
        base64 data aside) or of an accepted policy (its annotations' values
        aside: free text, read by nothing);
    U11 an accepted policy whose partition is not a Slurm partition name;
    U12 an accepted policy whose nodeSelector matches a node with no labels
        (it would select every node that lacks some label);
    U13 a slurmd container without a memory limit of at least its request,
        or a memory-backed emptyDir (/dev/shm) without a sizeLimit;
    U14 a job_submit.lua or prolog-slurmctld whose code (its lines that are
        not comments) differs from the template's: only its comments may name
        the cluster;
    U15 for the cluster pairs: two objects of one kind and name across the
        two clusters, counting beside what is rendered the pods and claims
        their StatefulSets make and the lent pods of the nodes in LENT_NODES;
    U16 a Slurm token that names more than one source: two NodeSet lines of
        one name or feature (letter case aside), a node set whose nodes
        register a feature that selects another node set, or two SwitchName
        lines of one name in topology.conf;
    U17 a pod volume of a Secret slurmk8s generates for another cluster (a
        name ``<x>-munge-key`` ... with ``<x>`` not this cluster), or of a
        user's Secret readable by anyone but its owner (mode & 0o077);
    U18 a toleration Kubernetes' PodSpec validation refuses (Exists with a
        value, an empty key without Exists, tolerationSeconds without
        NoExecute);
    U19 a StorageHost that inet_aton reads as a loopback, link-local,
        unspecified or multicast address; a DefMemPerCPU over 2^63 - 1 or a
        time limit over 2^31 - 1 seconds in slurm.conf;
    U20 an accepted policy whose reclaim deadline is not an integer from 30
        to 86400 s, or with the grace period over two days: the owner must
        get its nodes back in a bounded time (issue 24, item 2).
    U21 with a directory: sssd.conf's filter_users lacks a login user or a
        system account, or filter_groups a login user's group or a system
        group; its min_id-max_id holds a login user's uid or gid or an id of
        SYSTEM_ID_BLOCK (SlurmUser, nobody); or, with egress rules, a rule
        other than DNS's opens ports to any address (issue 41, items 5, 6, 8).
    U22 a pod (a workload's, or the lent slurmd pod an accepted policy's
        bridge would start for the base cluster) with a hostPath volume or
        a host namespace; a container that adds a capability beyond its
        daemons' and RDMA's (ROOT_CAPABILITIES, podtemplate.CAPABILITIES);
        a privileged container other than slurmd with slurmConfig.cgroups;
        two volumes of one name, or two mounts of one path in a container;
        a slurmd container whose image, command or args are not those
        rendered without the spec's pod template (issue 44, item 2).
accepted-and-safe
    Loaded, rendered, and none of U1-U22.
"""

from __future__ import annotations

import copy
import ipaddress
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from slurmk8s.api import InvalidSpec, load_cluster, load_policy
from slurmk8s.api.fields import (
    RESERVED_USERS,
    SLURM_NAME_RE,
    SYSTEM_GROUPS,
    SYSTEM_ID_BLOCK,
    duration_seconds,
    quantity_value,
    unprintable,
)
from slurmk8s.api.podtemplate import CAPABILITIES, mount_conflicts
from slurmk8s.api.secrets import OWNED_SECRET_SUFFIXES
from slurmk8s.api.validate import EXTRA_LINE_KEYS, OWNED_KEYS, PROGRAM_KEYS
from slurmk8s.render import ClusterKeys, TopologyNode, config_files, render
from slurmk8s.render import names as object_names
from slurmk8s.render.config import (
    HEALTH_CHECK_PROGRAM,
    PROLOG,
    PROLOG_SLURMCTLD,
    PROLOG_SLURMCTLD_FILE,
    STATE_DIR,
    TASK_PROLOG,
    render_template,
    sssd_conf,
)
from slurmk8s.render.manifests import lent_slurmd_pod
from slurmk8s.render.pods import ROOT_CAPABILITIES
from slurmk8s.render.slurmd import node_conf

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).resolve().parent / "corpus"
KEYS = ClusterKeys.generate()
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop"

#: The characters of the injection sweep.
SWEEP = {"LF": "\n", "CR": "\r", "NUL": "\0", "U+2028": "\u2028", "U+0085": "\x85"}
#: Directories the images use (images/*/): shared storage must not cover them.
IMAGE_PATHS = (
    "/bin", "/dev", "/etc", "/etc/munge", "/etc/slurm", "/etc/ssh", "/lib", "/lib64", "/opt/slurmk8s",
    "/proc", "/root", "/run", "/run/munge", "/sbin", "/sys", "/usr/bin", "/usr/lib", "/usr/local/lib/slurmk8s",
    "/usr/sbin", "/var/lib/slurm", "/var/log", "/var/run", "/var/spool/slurmctld", "/var/spool/slurmd",
)
#: What slurmk8s itself writes for the program keys it owns.
OWN_PROGRAMS = {"taskprolog": TASK_PROLOG, "healthcheckprogram": HEALTH_CHECK_PROGRAM, "mailprog": "/bin/true",
                "prolog": PROLOG,  # with a directory: each job node looks the job's user up
                "prologslurmctld": PROLOG_SLURMCTLD,
                "jobsubmitplugins": "lua",
                "accountingstoragetype": "accounting_storage/slurmdbd"}
ROOTS = re.compile(r"(apiVersion|kind|metadata|spec|status)([.\[]|$)|\(document\)$|\(file\)$")
SETTING = re.compile(r"[A-Za-z]+=[^\s#\\]+( [A-Za-z]+=[^\s#\\]+)*")
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
CLASSES = ("refused-with-path", "accepted-and-safe", "accepted-and-unsafe", "crashed")


@dataclass
class Case:
    id: str
    kind: str  # SlurmCluster, NodeLendingPolicy, or Pair (two SlurmClusters)
    doc: Any
    why: str = ""
    #: Whether the document can be sent as JSON (50,000 nested lists cannot).
    sendable: bool = True
    docs: list = field(default_factory=list)  # for a Pair


# -- building the corpus ----------------------------------------------------------------------

DELETE = "$delete"


def merge(base: Any, patch: Any) -> Any:
    """``patch`` over ``base``: mappings merge, anything else replaces; "$delete" removes a key."""
    if not (isinstance(base, dict) and isinstance(patch, dict)):
        return copy.deepcopy(patch)
    out = copy.deepcopy(base)
    for k, v in patch.items():
        if v == DELETE:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v) if k in out else copy.deepcopy(v)
    return out


def base(kind: str) -> dict:
    return yaml.safe_load((CORPUS / f"base-{kind.lower()}.yaml").read_text())


def file_cases(kind: str) -> Iterator[Case]:
    for entry in yaml.safe_load((CORPUS / f"{kind.lower()}.yaml").read_text()):
        doc = entry["manifest"] if "manifest" in entry else merge(base(kind), entry["merge"])
        yield Case(f"{kind}/{entry['case']}", kind, doc, entry["why"])


def _strings(node: Any, loc: tuple = ()) -> Iterator[tuple[tuple, bool]]:
    """Every string of a document: (location, is-a-map-key)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*loc, k), True
            if isinstance(v, str):
                yield (*loc, k), False
            else:
                yield from _strings(v, (*loc, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            if isinstance(v, str):
                yield (*loc, i), False
            else:
                yield from _strings(v, (*loc, i))


def _inject(doc: Any, loc: tuple, is_key: bool, char: str) -> Any:
    out = copy.deepcopy(doc)
    parent = out
    for part in loc[:-1]:
        parent = parent[part]
    last = loc[-1]
    if is_key:
        parent[last + char + "x"] = parent.pop(last)
    else:
        parent[last] = parent[last] + char + "PrologSlurmctld=/tmp/x"
    return out


def sweep_cases(kind: str) -> Iterator[Case]:
    doc = base(kind)
    for loc, is_key in _strings(doc):
        where = ".".join(str(p) for p in loc) + (" (key)" if is_key else "")
        for name, char in SWEEP.items():
            yield Case(f"{kind}/sweep/{where}/{name}", kind, _inject(doc, loc, is_key, char), "10: injection sweep")


def _deep(n: int) -> list:
    out: list = []
    for _ in range(n):
        out = [out]
    return out


def generated_cases() -> Iterator[Case]:
    c, p = base("SlurmCluster"), base("NodeLendingPolicy")
    big_key = "ssh-ed25519 " + "A" * 100_000
    yield Case("SlurmCluster/ssh-key-100kB", "SlurmCluster", merge(c, {"spec": {"login": {"users": [
        {"name": "alice", "uid": 3000, "sshPublicKeys": [big_key]}]}}}), "2: over the CRD's maxLength")
    yield Case("SlurmCluster/extra-line-5MB", "SlurmCluster", merge(c, {"spec": {"slurmConfig": {
        "extraLines": ["Waittime=" + "5" * 5_000_000]}}}), "2: over the CRD's maxLength")
    users = [{"name": f"u{i}", "uid": 1000 + i % 59_000, "sshPublicKeys": [KEY]} for i in range(20_000)]
    yield Case("SlurmCluster/users-20000", "SlurmCluster", merge(c, {"spec": {"login": {"users": users}}}),
               "2: a users ConfigMap over 1 MiB")
    fat = [{"name": f"u{i}", "uid": 2000 + i, "sshPublicKeys": ["ssh-rsa " + "A" * 16_000] * 8} for i in range(10)]
    yield Case("SlurmCluster/users-fat-keys", "SlurmCluster", merge(c, {"spec": {"login": {"users": fat}}}),
               "2: inline keys over 1 MiB")
    sets = [{"name": f"n{i}", "replicas": 0} for i in range(65)]
    yield Case("SlurmCluster/node-sets-65", "SlurmCluster",
               merge(c, {"spec": {"nodeSets": sets, "partitions": [{"name": "p", "nodeSets": ["n0"]}]}}),
               "2: too many node sets")
    lines = [f"{k}=1" for k in sorted(EXTRA_LINE_KEYS)]
    yield Case("SlurmCluster/extra-lines-every-allowed-key", "SlurmCluster",
               merge(c, {"spec": {"slurmConfig": {"extraLines": lines}}}), "1: the whole allowlist")
    for kind, doc in (("SlurmCluster", c), ("NodeLendingPolicy", p)):
        for part, why in (("spec", "3: RecursionError"), ("metadata", "3: accepted, then no one could dump it")):
            deep = copy.deepcopy(doc)
            deep[part]["x"] = _deep(50_000)  # not through merge(): deepcopy would recurse
            yield Case(f"{kind}/nested-50000-{part}", kind, deep, why, sendable=False)
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if isinstance(doc, dict) and doc.get("kind") in ("SlurmCluster", "NodeLendingPolicy"):
                yield Case(f"{doc['kind']}/example/{path.name}[{i}]", doc["kind"], doc, "examples stay valid")


def _cluster(name: str, **spec) -> dict:
    return {"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "SlurmCluster",
            "metadata": {"name": name, "namespace": "hpc"}, "spec": spec}


def _vol(name: str) -> dict:
    return {"sharedStorage": {"volumes": [{"name": name, "mountPath": "/shared", "size": "1Gi"}]}}


PAIRS = {
    "nodeset-b-controller-vs-cluster-a-b": (_cluster("a", nodeSets=[{"name": "b-controller"}]), _cluster("a-b")),
    "nodeset-b-x-vs-cluster-a-b-nodeset-x": (_cluster("a", nodeSets=[{"name": "b-x"}]),
                                             _cluster("a-b", nodeSets=[{"name": "x"}])),
    "nodeset-bx-vs-cluster-a-b-nodeset-x": (_cluster("a", nodeSets=[{"name": "bx"}]),
                                            _cluster("a-b", nodeSets=[{"name": "x"}])),
    "volume-b-x-vs-cluster-a-b-volume-x": (_cluster("a", **_vol("b-x")), _cluster("a-b", **_vol("x"))),
    "volume-0-vs-controller-claim": (_cluster("state-a-controller", **_vol("0")), _cluster("a")),
    "nodeset-controller": (_cluster("a", nodeSets=[{"name": "controller"}]), _cluster("b")),
    "nodeset-login-vs-cluster-a-login": (_cluster("a", nodeSets=[{"name": "login"}]), _cluster("a-login")),
    "lent-pod-a-gpu-0-vs-cluster-a-lent-nodeset-gpu": (
        _cluster("a", partitions=[{"name": "gpu", "acceptLentNodes": True}]),
        _cluster("a-lent", nodeSets=[{"name": "gpu"}])),
    "lent-pod-a-b-controller-0-vs-cluster-a-lent-b": (
        _cluster("a", partitions=[{"name": "gpu", "acceptLentNodes": True}]), _cluster("a-lent-b")),
    "nodeset-config-vs-cluster-a-slurm": (_cluster("a"), _cluster("a-slurm", nodeSets=[{"name": "config"}])),
}

#: Kubernetes nodes the pairs' clusters lend pods to (U15): named like the
#: other cluster's pods.
LENT_NODES = ("gpu-0", "gpu-1", "b-controller-0", "controller-0", "0", "lent-gpu-0")


def _everything(cluster, objs: list[dict]) -> Iterator[tuple[str, str]]:
    """(kind, name) of the objects, the pods and claims their StatefulSets
    make (a few ordinals past the replicas), and the lent pods of LENT_NODES."""
    for o in objs:
        name = o["metadata"]["name"]
        yield o["kind"], name
        if o["kind"] == "StatefulSet":
            for i in range(o["spec"]["replicas"] + 3):
                yield "Pod", f"{name}-{i}"
                for claim in o["spec"].get("volumeClaimTemplates", []):
                    yield "PersistentVolumeClaim", f"{claim['metadata']['name']}-{name}-{i}"
    for node in LENT_NODES:
        yield "Pod", object_names.lent_slurmd(cluster, node)


def pair_cases() -> Iterator[Case]:
    for name, docs in PAIRS.items():
        yield Case(f"Pair/{name}", "Pair", None, "4: two clusters in one namespace", docs=list(docs))


def corpus() -> list[Case]:
    return [
        *file_cases("SlurmCluster"), *file_cases("NodeLendingPolicy"), *generated_cases(),
        *sweep_cases("SlurmCluster"), *sweep_cases("NodeLendingPolicy"), *pair_cases(),
    ]


# -- classifying ----------------------------------------------------------------------------


class Unsafe(Exception):
    """Accepted, but one of U1-U11 holds."""


def _check_refusal(exc: InvalidSpec) -> str | None:
    """Why a refusal breaks the rules of refused-with-path, or None."""
    if not exc.errors:
        return "no errors"
    for e in exc.errors:
        top_level_key = "." not in e.path and "[" not in e.path and "not a known field" in e.message
        if not (ROOTS.match(e.path) or top_level_key) or not e.message.strip():
            return f"error without a field path or a reason: {e!r}"
    text = str(exc)
    lines = text.split("\n")
    if len(lines) != len(exc.errors) + 1 or any(unprintable(ch) for ch in text.replace("\n", "")):
        return f"printed error is not one clean line per problem: {ascii(text)[:300]}"
    return None


def _strings_of(obj: Any) -> Iterator[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield str(k)
            yield from _strings_of(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings_of(v)


def _no_unprintable(where: str, obj: Any) -> None:
    for s in _strings_of(obj):
        if any(unprintable(ch) for ch in s.replace("\n", "")):
            raise Unsafe(f"U10 {where}: unprintable character in {ascii(s)[:120]}")


def _code(text: str, comment: re.Pattern) -> list[str]:
    return [line for line in text.split("\n") if not comment.match(line.lstrip())]


#: The programs among the config files, with their comment lines and their code whatever the
#: cluster (only their comments name it; a shell script's "#!" line is code).
LUA_COMMENT, SH_COMMENT = re.compile("--"), re.compile("#($| )")
PROGRAMS = {
    "job_submit.lua": (LUA_COMMENT, _code(render_template("job_submit.lua", namespace="ns", cluster="c"), LUA_COMMENT)),
    PROLOG_SLURMCTLD_FILE: (SH_COMMENT, _code(render_template("prolog-slurmctld", namespace="ns", cluster="c",
                                                              state_dir=STATE_DIR), SH_COMMENT)),
}


def _check_config(cluster, files: dict[str, str]) -> None:
    extra = {line.split("=", 1)[0].lower() for line in cluster.spec.slurm_config.extra_lines}
    counts = {"partitionname": 0, "nodeset": 0}
    for fname, text in files.items():
        if fname in PROGRAMS and _code(text, PROGRAMS[fname][0]) != PROGRAMS[fname][1]:
            raise Unsafe(f"U14 {fname} runs code of its own: {ascii(text)}")
        for line in text.split("\n"):
            if any(unprintable(ch) for ch in line) or line.endswith("\\"):
                raise Unsafe(f"U1 {fname}: {ascii(line)}")
            if fname in PROGRAMS:
                continue
            if not line.strip() or line.startswith("#"):
                continue
            if not SETTING.fullmatch(line):
                raise Unsafe(f"U2 {fname}: {line!r}")
            if fname != "slurm.conf":
                continue
            key, value = line.split(" ", 1)[0].split("=", 1)
            key = key.lower()
            if key not in OWNED_KEYS and not (key in extra and key in EXTRA_LINE_KEYS):
                raise Unsafe(f"U3 slurm.conf key {key} is neither slurmk8s's nor an allowed extra line")
            if key in PROGRAM_KEYS and OWN_PROGRAMS.get(key) != value:
                raise Unsafe(f"U3 slurm.conf runs {value!r} through {key}")
            if key in counts:
                counts[key] += 1
                if value.upper() in ("DEFAULT", "ALL"):
                    raise Unsafe(f"U4 slurm.conf: {line!r}")
    _check_tokens(cluster, files)
    lent = sum(p.accept_lent_nodes for p in cluster.spec.partitions)
    if counts != {"partitionname": len(cluster.spec.partitions), "nodeset": len(cluster.spec.node_sets) + lent}:
        raise Unsafe(f"U4 slurm.conf has {counts}")


def _check_tokens(cluster, files: dict[str, str]) -> None:
    """U16: every node set, feature and switch names one source."""
    sets = re.findall(r"^NodeSet=(\S+) Feature=(\S+)$", files["slurm.conf"], re.M)
    for what, tokens in (("name", [n for n, _ in sets]), ("feature", [f.lower() for _, f in sets])):
        if len(set(tokens)) != len(tokens):
            raise Unsafe(f"U16 two NodeSet lines of one {what}: {sets}")
    for ns in cluster.spec.node_sets:
        registered = {f.lower() for f in re.search(r"Feature=(\S+)", node_conf(cluster, ns)).group(1).split(",")}
        into = {n for n, f in sets if f.lower() in registered}
        if into != {ns.name}:
            raise Unsafe(f"U16 the nodes of node set {ns.name} join node sets {sorted(into)}")
    switches = re.findall(r"^SwitchName=(\S+)", files["topology.conf"], re.M)
    if len(set(switches)) != len(switches):
        raise Unsafe(f"U16 two switches of one name: {switches}")


def _check_name(obj: dict) -> None:
    kind, name = obj["kind"], obj["metadata"]["name"]
    if kind == "Service":
        ok = DNS_1035.fullmatch(name)
    elif kind == "StatefulSet":
        ok = DNS_1123_LABEL.fullmatch(name) and len(name) <= 52
    else:
        ok = DNS_1123_SUBDOMAIN.fullmatch(name) and len(name) <= 253
    if not ok:
        raise Unsafe(f"U5 {kind} name {name!r} is invalid for its kind")


def _pod_specs(obj: dict) -> list[dict]:
    spec = obj.get("spec", {})
    if obj["kind"] == "Pod":
        return [spec]
    return [spec["template"]["spec"]] if "template" in spec else []


def _check_pod_privileges(cluster, o: dict, pod: dict, plain: dict | None) -> None:
    """U22: what a pod may do on its node; ``plain``: the same pod without the spec's pod template."""
    name = o["metadata"]["name"]
    if any("hostPath" in v for v in pod.get("volumes", [])) or any(pod.get(k) for k in ("hostNetwork", "hostPID",
                                                                                           "hostIPC")):
        raise Unsafe(f"U22 {name} reaches its node (a hostPath or a host namespace)")
    volumes = [v["name"] for v in pod.get("volumes", [])]
    if len(set(volumes)) != len(volumes):
        raise Unsafe(f"U22 {name} has two volumes of one name: {volumes}")
    allowed = {*ROOT_CAPABILITIES, *CAPABILITIES}
    for ctr in pod["containers"]:
        security = ctr.get("securityContext", {})
        added = set(security.get("capabilities", {}).get("add", []))
        if added - allowed:
            raise Unsafe(f"U22 {name}/{ctr['name']} adds {sorted(added - allowed)}")
        if security.get("privileged") and not (ctr["name"] == "slurmd" and cluster.spec.slurm_config.cgroups
                                               and o["kind"] != "Pod"):
            raise Unsafe(f"U22 {name}/{ctr['name']} is privileged")
        mounts = [m["mountPath"] for m in ctr.get("volumeMounts", [])]
        if len(set(mounts)) != len(mounts):
            raise Unsafe(f"U22 {name}/{ctr['name']} mounts two volumes at one path: {mounts}")
    now = [c for c in pod["containers"] if c["name"] == "slurmd"]
    before = [c for c in (plain or {}).get("containers", []) if c["name"] == "slurmd"]
    if now and before and any(now[0].get(k) != before[0].get(k) for k in ("image", "command", "args", "env")):
        raise Unsafe(f"U22 {name}: the pod template changed what slurmd runs")


def _without_templates(cluster):
    """``cluster`` with no node set's pod template (None: it has none)."""
    if not any(ns.pod_template for ns in cluster.spec.node_sets):
        return None
    doc = cluster.dump()
    for ns in doc["spec"]["nodeSets"]:
        ns.pop("podTemplate", None)
    return load_cluster(doc)


def _check_objects(cluster, objs: list[dict], plain_objs: list[dict] | None = None) -> None:
    """``plain_objs``: the same rendered without the spec's pod templates (U22)."""
    plain = {(o["kind"], o["metadata"]["name"]): spec for o in plain_objs or [] for spec in _pod_specs(o)}
    seen: set[tuple[str, str]] = set()
    shared = {v.mount_path for v in (cluster.spec.shared_storage.volumes if cluster.spec.shared_storage else [])}
    for o in objs:
        _check_name(o)
        try:
            kubernetes_validate.validate(o, kubernetes_validate.latest_version(), strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise Unsafe(f"U5 {o['kind']} {o['metadata']['name']}: {exc}") from None
        ident = (o["kind"], o["metadata"]["name"])
        if ident in seen:
            raise Unsafe(f"U6 two {ident[0]}s named {ident[1]}")
        seen.add(ident)
        if o["kind"] == "ConfigMap":
            size = sum(len(k.encode()) + len(v.encode()) for k, v in o.get("data", {}).items())
            if size > 1 << 20:
                raise Unsafe(f"U7 ConfigMap {o['metadata']['name']} holds {size} bytes")
        if o["kind"] != "Secret":
            _no_unprintable(f"{o['kind']} {o['metadata']['name']}", o)
        if o["kind"] == "ConfigMap":
            _check_numbers_and_hosts(o)
        for pod in _pod_specs(o):
            _check_secret_volumes(cluster, o, pod)
            _check_tolerations(o, pod)
            _check_pod_privileges(cluster, o, pod, plain.get((o["kind"], o["metadata"]["name"])))
            for ctr in pod["containers"] + pod.get("initContainers", []):
                for what in ("cpu", "memory"):
                    req = ctr.get("resources", {}).get("requests", {}).get(what)
                    if req is not None and quantity_value(str(req)) <= 0:
                        raise Unsafe(f"U8 {o['metadata']['name']}/{ctr['name']} requests {what} {req}")
                if ctr["name"] == "slurmd":
                    limit = ctr.get("resources", {}).get("limits", {}).get("memory")
                    request = ctr.get("resources", {}).get("requests", {}).get("memory")
                    if limit is None or quantity_value(str(limit)) < quantity_value(str(request or "0")):
                        raise Unsafe(f"U13 {o['metadata']['name']}/slurmd: memory limit {limit} (request {request})")
                for env in ctr.get("env", []):
                    m = re.search(r"RealMemory=(\S+)", env.get("value", ""))
                    if m and int(m.group(1)) < 1:
                        raise Unsafe(f"U8 {o['metadata']['name']}: RealMemory={m.group(1)}")
                mounts = [m["mountPath"] for m in ctr.get("volumeMounts", [])]
                for v in pod.get("volumes", []):
                    if (v.get("emptyDir") or {}).get("medium") == "Memory" and not v["emptyDir"].get("sizeLimit"):
                        raise Unsafe(f"U13 {o['metadata']['name']}: memory-backed volume {v['name']} has no sizeLimit")
                for mp in (m for m in mounts if m in shared):
                    others = [*IMAGE_PATHS, *(m for m in mounts if m != mp)]
                    for other in others:
                        if mp == other or other.startswith(mp.rstrip("/") + "/") or mp.startswith(other + "/"):
                            raise Unsafe(f"U9 shared volume at {mp} covers or sits in {other}")


def _check_secret_volumes(cluster, o: dict, pod: dict) -> None:
    for v in pod.get("volumes", []):
        named = [v["secret"]["secretName"]] if "secret" in v else []
        projected = v.get("projected") or {}
        users = [src["secret"]["name"] for src in projected.get("sources", []) if "secret" in src]
        for name in named + users:
            for suffix in OWNED_SECRET_SUFFIXES:
                if name.endswith(suffix) and name != cluster.name + suffix:
                    raise Unsafe(f"U17 {o['metadata']['name']} mounts {name}, another cluster's key Secret")
        if users and (projected.get("defaultMode", 0o644) & 0o077):
            raise Unsafe(f"U17 {o['metadata']['name']}: users' Secrets mounted {oct(projected.get('defaultMode', 0o644))}")


def _check_tolerations(o: dict, pod: dict) -> None:
    for t in pod.get("tolerations", []):
        if (not t.get("key") and t.get("operator") != "Exists") or (t.get("operator") == "Exists" and t.get("value")) \
                or (t.get("tolerationSeconds") is not None and t.get("effect") != "NoExecute"):
            raise Unsafe(f"U18 {o['metadata']['name']}: toleration {t}")


def _check_numbers_and_hosts(o: dict) -> None:
    for text in (o.get("data") or {}).values():
        for host in re.findall(r"^StorageHost=(\S+)", text, re.M):
            try:
                address = ipaddress.IPv4Address(socket.inet_aton(host))
            except OSError:
                continue  # a name, not an address
            if address.is_loopback or address.is_link_local or address.is_unspecified or address.is_multicast:
                raise Unsafe(f"U19 StorageHost={host} is {address}")
        for value in re.findall(r"\bDefMemPerCPU=(\d+)", text):
            if int(value) > 2**63 - 1:
                raise Unsafe(f"U19 DefMemPerCPU={value}")
        for value in re.findall(r"\b(?:MaxTime|MaxWall)=(\S+)", text):
            if re.fullmatch(r"[0-9:-]+", value) and (duration_seconds(value) or 0) > 2**31 - 1:
                raise Unsafe(f"U19 time {value}")


def _check_directory(cluster, objs: list[dict]) -> None:
    """U21: the pods' own accounts win over the directory, whose ids and egress stay bounded."""
    conf = sssd_conf(cluster)
    if conf is None:
        return
    setting = {k: v for k, _, v in (ln.partition(" = ") for ln in conf.splitlines()) if v}
    users = {u.name for u in cluster.spec.login.users}
    for key, wanted in (("filter_users", users | RESERVED_USERS), ("filter_groups", users | SYSTEM_GROUPS)):
        missing = wanted - set(setting.get(key, "").split(", "))
        if missing:
            raise Unsafe(f"U21 sssd.conf's {key} lacks {sorted(missing)[:5]}")
    low, high = int(setting["min_id"]), int(setting["max_id"])
    ids = {i for u in cluster.spec.login.users for i in (u.uid, u.gid) if i is not None}
    if any(low <= i <= high for i in ids) or (low <= SYSTEM_ID_BLOCK[1] and high >= SYSTEM_ID_BLOCK[0]):
        raise Unsafe(f"U21 the directory's ids {low}-{high} hold a login user's or the images' own")
    dns = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    for o in objs:
        for rule in (o["spec"].get("egress") or []) if o["kind"] == "NetworkPolicy" else []:
            if rule.get("ports") != dns and not rule.get("to"):
                raise Unsafe(f"U21 {o['metadata']['name']} opens {rule.get('ports')} to any address")


def _render(cluster) -> list[dict]:
    nodes = [TopologyNode(f"{cluster.name}-n{i}", {"example.com/spine": f"s{i % 2}", "example.com/leaf": f"l{i}"})
             for i in range(3)]
    _check_config(cluster, config_files(cluster, nodes))
    objs = render(cluster, KEYS, nodes)
    bare = _without_templates(cluster)
    _check_objects(cluster, objs, render(bare, KEYS, nodes) if bare is not None else None)
    _check_directory(cluster, objs)
    return objs


#: The cluster an accepted policy's lent pod is rendered for (U22).
BASE_CLUSTER = load_cluster(base("SlurmCluster"))


def _check_lent_pod(policy) -> None:
    """The lent slurmd pod the bridge would start for the base cluster, with and without the
    policy's pod template (which the bridge does not lend with while it meets the cluster's
    shared storage: PodTemplateConflict)."""
    template = policy.spec.pod_template
    storage = BASE_CLUSTER.spec.shared_storage
    taken = [("shared", v.mount_path) for v in storage.volumes] if storage else []
    if template is not None and next(mount_conflicts(template, "spec.podTemplate", taken), None) is not None:
        return

    def pod(t):
        return lent_slurmd_pod(BASE_CLUSTER, "", node="gpu-0", labels={}, partition=policy.spec.partition,
                               resources={"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4"},
                               shm_size=policy.spec.shm_size, taint_key="slurmk8s.dev/lent", pod_template=t)

    _check_objects(BASE_CLUSTER, [pod(template)], [pod(None)])


def _load(case_kind: str, doc: Any):
    return (load_policy if case_kind == "NodeLendingPolicy" else load_cluster)(doc)


def classify(case: Case) -> tuple[str, str]:
    """(class, detail) of one case."""
    try:
        if case.kind == "Pair":
            clusters = [load_cluster(d) for d in case.docs]
            names: dict[tuple[str, str], int] = {}
            for i, cl in enumerate(clusters):
                objs = _render(cl)
                for o in objs:
                    ident = (o["kind"], o["metadata"]["name"])
                    if names.get(ident, i) != i:
                        raise Unsafe(f"U6 both clusters render {ident[0]} {ident[1]}")
                for ident in set(_everything(cl, objs)):
                    if names.setdefault(ident, i) != i:
                        raise Unsafe(f"U15 both clusters have a {ident[0]} {ident[1]}")
            return "accepted-and-safe", ""
        obj = _load(case.kind, case.doc)
        if case.kind == "NodeLendingPolicy":
            dumped = obj.dump()
            dumped["metadata"].pop("annotations", None)  # free text by Kubernetes' definition, used nowhere
            _no_unprintable("policy", dumped)
            if not re.fullmatch(SLURM_NAME_RE, obj.spec.partition) or obj.spec.partition.upper() == "DEFAULT":
                raise Unsafe(f"U11 partition {obj.spec.partition!r}")
            if obj.spec.node_selector.matches({}):
                raise Unsafe(f"U12 nodeSelector {obj.spec.node_selector.dump()} matches a node with no labels")
            r = obj.spec.reclaim
            if not (isinstance(r.deadline_seconds, int) and 30 <= r.deadline_seconds <= 86400
                    and r.grace_period_seconds + r.deadline_seconds <= 2 * 86400):
                raise Unsafe(f"U20 reclaim deadline {r.deadline_seconds!r} (grace {r.grace_period_seconds}) is not "
                             "bounded: a borrower could keep a node")
            _check_lent_pod(obj)
        else:
            _render(obj)
        return "accepted-and-safe", ""
    except InvalidSpec as exc:
        broken = _check_refusal(exc)
        return ("crashed", broken) if broken else ("refused-with-path", exc.errors[0].path)
    except Unsafe as exc:
        return "accepted-and-unsafe", str(exc)
    except Exception as exc:  # noqa: BLE001 - that is the point: anything else is a crash
        return "crashed", f"{type(exc).__name__}: {str(exc)[:200]}"


# -- the tests ------------------------------------------------------------------------------

#: Filled by test_the_corpus; printed in the test session's summary (conftest.py).
COUNTS: dict[str, int] = {}


@pytest.fixture(scope="module")
def results() -> list[tuple[Case, str, str]]:
    return [(case, *classify(case)) for case in corpus()]


def test_the_corpus_has_no_unsafe_acceptance_and_no_crash(results):
    counts = {k: 0 for k in ("cases", *CLASSES)}
    for _, cls, _ in results:
        counts["cases"] += 1
        counts[cls] += 1
    COUNTS.clear()
    COUNTS.update(counts)
    bad = [f"{cls}: {case.id}: {detail}" for case, cls, detail in results
           if cls in ("accepted-and-unsafe", "crashed")]
    assert not bad, f"{counts}\n" + "\n".join(bad[:40])
    assert counts["refused-with-path"] and counts["accepted-and-safe"], counts


def test_every_category_of_the_issue_is_in_the_corpus(results):
    ids = {case.id for case, _, _ in results}
    for needed in ("SlurmCluster/extra-line-HealthCheckProgram", "SlurmCluster/ssh-key-100kB",
                   "SlurmCluster/replicas-string", "SlurmCluster/memory-1e400", "SlurmCluster/metadata-null",
                   "SlurmCluster/nested-50000-spec", "SlurmCluster/version-nonascii-\\u0662\\u0663.\\u0660\\u0662",
                   "SlurmCluster/nodeset-name-controller", "SlurmCluster/partition-default",
                   "SlurmCluster/cluster-name-9demo", "SlurmCluster/mount-/opt",
                   "Pair/nodeset-b-controller-vs-cluster-a-b", "NodeLendingPolicy/partition-default",
                   "Pair/lent-pod-a-gpu-0-vs-cluster-a-lent-nodeset-gpu", "SlurmCluster/nodeset-name-mariadb",
                   "SlurmCluster/feature-names-another-nodeset",
                   "NodeLendingPolicy/selector-does-not-exist-only"):
        assert needed in ids, needed
    for kind in ("SlurmCluster", "NodeLendingPolicy"):
        for name in SWEEP:
            assert any(i.startswith(f"{kind}/sweep/") and i.endswith(f"/{name}") for i in ids), (kind, name)


@pytest.mark.parametrize("case_id,expected", [
    ("SlurmCluster/extra-line-HealthCheckProgram", "refused-with-path"),
    ("SlurmCluster/memory-1e400", "refused-with-path"),
    ("SlurmCluster/metadata-string", "refused-with-path"),
    ("SlurmCluster/mount-/var", "refused-with-path"),
    ("SlurmCluster/extra-line-allowed", "accepted-and-safe"),
    ("SlurmCluster/mount-ok-/home", "accepted-and-safe"),
    ("Pair/nodeset-bx-vs-cluster-a-b-nodeset-x", "accepted-and-safe"),
    ("Pair/lent-pod-a-gpu-0-vs-cluster-a-lent-nodeset-gpu", "accepted-and-safe"),
    ("SlurmCluster/nodeset-name-mariadb", "refused-with-path"),
    ("SlurmCluster/feature-names-another-nodeset", "refused-with-path"),
    ("SlurmCluster/partitions-differ-in-case", "refused-with-path"),
    ("SlurmCluster/account-named-like-user-in-no-account", "refused-with-path"),
    ("NodeLendingPolicy/partition-default", "refused-with-path"),
    ("SlurmCluster/cgroups-foreign-image", "refused-with-path"),
    ("SlurmCluster/memory-limit-below-memory", "refused-with-path"),
    ("SlurmCluster/shm-over-memory-limit", "refused-with-path"),
    ("NodeLendingPolicy/selector-empty", "refused-with-path"),
    ("NodeLendingPolicy/selector-does-not-exist-only", "refused-with-path"),
    ("NodeLendingPolicy/selector-notin-only", "refused-with-path"),
    ("SlurmCluster/secret-ref-owned-demo-munge-key", "refused-with-path"),
    ("SlurmCluster/db-host-169.254.169.254", "refused-with-path"),
    ("SlurmCluster/db-host-2852039166", "refused-with-path"),
    ("SlurmCluster/db-host-ok", "accepted-and-safe"),
    ("SlurmCluster/toleration-seconds-noschedule", "refused-with-path"),
    ("SlurmCluster/toleration-ok", "accepted-and-safe"),
    ("SlurmCluster/quantity-1Ei", "accepted-and-safe"),
    ("SlurmCluster/quantity-+1Gi", "refused-with-path"),
    ("SlurmCluster/def-mem-per-cpu-1e30", "refused-with-path"),
    ("SlurmCluster/max-time-999999999-00", "refused-with-path"),
    ("SlurmCluster/account-set", "refused-with-path"),
    ("SlurmCluster/login-user-where", "refused-with-path"),
    ("SlurmCluster/ldap-id-range-holds-slurmuser", "refused-with-path"),
    ("SlurmCluster/ldap-id-range-holds-login-user", "refused-with-path"),
    ("SlurmCluster/ldap-id-range-above-the-images", "accepted-and-safe"),
    ("SlurmCluster/ldap-egress-host-by-name", "refused-with-path"),
    ("SlurmCluster/ldap-egress-ipv4-uri", "accepted-and-safe"),
    ("SlurmCluster/login-service-cluster-hides-ssh-clients", "refused-with-path"),
    ("SlurmCluster/login-service-ssh-from-behind-a-load-balancer", "accepted-and-safe"),
    ("SlurmCluster/login-service-traffic-policy-on-clusterip", "refused-with-path"),
    ("SlurmCluster/login-service-source-ranges-on-nodeport", "refused-with-path"),
    ("SlurmCluster/login-service-annotation-own-prefix", "refused-with-path"),
    ("SlurmCluster/login-service-annotation-not-qualified", "refused-with-path"),
])
def test_known_cases_land_in_their_class(results, case_id, expected):
    found = {case.id: cls for case, cls, _ in results}
    assert found[case_id] == expected


def test_the_unsafe_checks_catch_what_they_define():
    """The classifier itself: a program line, a stray key and a hidden character are unsafe."""
    cluster = load_cluster(base("SlurmCluster"))
    files = config_files(cluster)
    for bad, rule in [("HealthCheckProgram=/tmp/x\n", "U3"), ("Waittime=5\\\n", "U1"),
                      ("PartitionName=DEFAULT State=UP\n", "U4"), ("X=1\u2028Y=2\n", "U1"), ("a b\n", "U2")]:
        with pytest.raises(Unsafe, match=rule):
            _check_config(cluster, {**files, "slurm.conf": files["slurm.conf"] + bad})
    # Code in a program, a line that is no comment or a changed "#!" line: U14; a comment passes.
    for name, bad in [("job_submit.lua", "os.execute('x')\n"), (PROLOG_SLURMCTLD_FILE, "x\n"),
                      (PROLOG_SLURMCTLD_FILE, "#!/tmp/x\n")]:
        with pytest.raises(Unsafe, match="U14"):
            _check_config(cluster, {**files, name: bad + files[name]})
    _check_config(cluster, {**files, PROLOG_SLURMCTLD_FILE: files[PROLOG_SLURMCTLD_FILE] + "# a comment\n"})
    objs = render(cluster, KEYS)
    svc = next(o for o in objs if o["kind"] == "Service")
    with pytest.raises(Unsafe, match="U5"):
        _check_objects(cluster, [{**svc, "metadata": {**svc["metadata"], "name": "9demo-controller"}}])
    with pytest.raises(Unsafe, match="U6"):
        _check_objects(cluster, [svc, svc])
    conf = files["slurm.conf"]
    for bad in ("NodeSet=cpu Feature=other\n", "NodeSet=other Feature=CPU\n", "NodeSet=other Feature=avx512\n"):
        with pytest.raises(Unsafe, match="U16"):
            _check_tokens(cluster, {**files, "slurm.conf": conf + bad})
    with pytest.raises(Unsafe, match="U16"):
        _check_tokens(cluster, {**files, "topology.conf": "SwitchName=sw_a Nodes=x\nSwitchName=sw_a Nodes=y\n"})
    a = load_cluster(_cluster("a", partitions=[{"name": "gpu", "acceptLentNodes": True}]))
    a_lent = load_cluster(_cluster("a-lent", nodeSets=[{"name": "gpu"}]))
    worker_pods = {name for kind, name in _everything(a_lent, render(a_lent, KEYS)) if kind == "Pod"}
    lent_pods = {name for kind, name in _everything(a, render(a, KEYS)) if kind == "Pod"}
    assert "a-lent-gpu-0" in worker_pods and object_names.lent_slurmd(a, "gpu-0") in lent_pods
    login = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-login"))
    bad = copy.deepcopy(login)
    vols = bad["spec"]["template"]["spec"]["volumes"]
    vols.append({"name": "x", "projected": {"defaultMode": 0o444, "sources": [{"secret": {"name": "k"}}]}})
    with pytest.raises(Unsafe, match="U17"):
        _check_objects(cluster, [bad])
    vols[-1] = {"name": "x", "secret": {"secretName": "other-munge-key"}}
    with pytest.raises(Unsafe, match="U17"):
        _check_objects(cluster, [bad])
    bad = copy.deepcopy(login)
    bad["spec"]["template"]["spec"]["tolerations"] = [{"operator": "Exists", "value": "x"}]
    with pytest.raises(Unsafe, match="U18"):
        _check_objects(cluster, [bad])
    for line in ("StorageHost=2852039166", "DefMemPerCPU=1" + "0" * 30, "MaxTime=999999999-00"):
        with pytest.raises(Unsafe, match="U19"):
            _check_numbers_and_hosts({"data": {"x.conf": line + "\n"}})
