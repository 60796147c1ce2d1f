"""Load and check a SlurmCluster: the schema (pydantic) and the rules that span fields.

``load_cluster`` is the one entry point. It reports every problem at once,
each with its field path, and raises :class:`InvalidSpec`; it never returns a
half-valid object. Which slurm.conf keys ``extraLines`` may set is
:mod:`.extralines`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

from pydantic import ValidationError

from .. import versions
from .base import without_nulls
from .cluster import LENT_PREFIX, PROJECT_REPOSITORY, SACCTMGR_KEYWORDS, SlurmCluster
from .errors import FieldError, InvalidSpec, field_path, from_pydantic
from .extralines import EXTRA_LINE_KEYS, KNOB_FOR_KEY, OWNED_KEYS, PROGRAM_KEYS, extra_line_errors
from .fields import SACCTMGR_NAME_RE, quantity_value, quote
from .identity import account_group_errors, egress_errors, identity_errors, login_overlap_errors
from .mounts import RESERVED_MOUNTS, nested, system_mount_problem
from .network import ipv4_literal
from .podtemplate import pod_template_errors, unknown_field_reason
from .scheduling import toleration_errors
from .secrets import owned_name_error, pull_secret_refs, secret_refs

__all__ = [
    "load_cluster", "semantic_errors", "OWNED_KEYS", "KNOB_FOR_KEY",
    "EXTRA_LINE_KEYS", "PROGRAM_KEYS", "RESERVED_MOUNTS", "MAX_DEPTH", "USERS_CONFIG_BUDGET", "users_config_bytes",
]

#: The deepest nesting a manifest may have. The models are at most 7 levels
#: deep; this guard keeps pathological input (50,000 nested lists) away from
#: the recursive validators.
MAX_DEPTH = 32

#: Bytes of the <cluster>-users ConfigMap the login users may fill: Kubernetes
#: refuses a ConfigMap over 1 MiB; the rest is headroom for keys' names.
USERS_CONFIG_BUDGET = 1_000_000

def _depth_error(obj: Any) -> FieldError | None:
    """The path of the first value nested deeper than MAX_DEPTH, found without recursion."""
    stack: list[tuple[Any, tuple, int]] = [(obj, (), 0)]
    while stack:
        value, loc, depth = stack.pop()
        if depth > MAX_DEPTH:
            return FieldError(field_path(loc) or "(document)",
                              f"is nested more than {MAX_DEPTH} levels deep; no field of the resource is")
        if isinstance(value, dict):
            stack.extend((v, (*loc, str(k)), depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, (*loc, i), depth + 1) for i, v in enumerate(value))
    return None


def _name_of(obj: dict) -> str:
    meta = obj.get("metadata")
    name = meta.get("name", "") if isinstance(meta, dict) else ""
    return name if isinstance(name, str) else ""


def _precheck(obj: Any, kind: str) -> dict:
    """What must hold before the models may look at ``obj`` at all; ``obj`` as the API
    server would store it."""
    if not isinstance(obj, dict):
        raise InvalidSpec([FieldError("(document)", f"must be a mapping (a {kind} object)")], kind=kind)
    too_deep = _depth_error(obj)
    if too_deep is not None:
        raise InvalidSpec([too_deep], kind=kind, name=_name_of(obj))
    return without_nulls(obj)



def load_cluster(obj: Any, *, trusted_repositories: Sequence[str] = (PROJECT_REPOSITORY,)) -> SlurmCluster:
    """Parse and check a SlurmCluster manifest (a dict, as read from YAML).

    Schema problems are reported first, all of them; the rules that span
    fields run once the schema holds. ``trusted_repositories``: the image
    repositories a privileged slurmd (``slurmConfig.cgroups``) may come
    from, the site's choice (``--trusted-repository``, which the operator,
    its webhook and the bridge are given alike: they judge by this one rule).
    """
    obj = _precheck(obj, "SlurmCluster")
    name = _name_of(obj)
    try:
        cluster = SlurmCluster.model_validate(obj)
    except ValidationError as exc:
        raise InvalidSpec(sorted(from_pydantic(exc, explain=unknown_field_reason)), name=name) from None
    errors = list(semantic_errors(cluster, trusted_repositories))
    if errors:
        raise InvalidSpec(errors, name=cluster.name)
    return cluster


def _duplicates(items: list, attr: str, path: str, what: str, *, fold: bool = False) -> Iterator[FieldError]:
    """Items whose ``attr`` repeats an earlier one's; with ``fold``, in any letter case."""
    seen: dict[Any, int] = {}
    for i, item in enumerate(items):
        value = getattr(item, attr)
        key = value.lower() if fold else value
        if key in seen:
            shown = quote(value) if isinstance(value, str) else str(value)
            yield FieldError(
                f"{path}[{i}].{_camel(attr)}",
                f"{shown} is already used by {path}[{seen[key]}]{' (letter case aside)' if fold else ''}; "
                f"{what} must be unique",
            )
        else:
            seen[key] = i


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(p.title() for p in rest)


def semantic_errors(c: SlurmCluster, trusted_repositories: Sequence[str] = (PROJECT_REPOSITORY,)
                    ) -> Iterator[FieldError]:
    """Rules that involve more than one field. Yields every violation."""
    spec = c.spec
    release = versions.release(spec.slurm.version)
    if spec.topology is not None and not release.topology_places_dynamic_nodes:
        able = [r.version for r in versions.RELEASES.values() if r.topology_places_dynamic_nodes]
        yield FieldError(
            "spec.topology",
            f"Slurm {release.version}'s {release.topology_tree_plugin} does not place dynamic nodes, so "
            f"no job would ever run; set spec.slurm.version to {' or '.join(able)}, or leave "
            "spec.topology unset",
        )
    yield from _duplicates(spec.node_sets, "name", "spec.nodeSets", "node set names")
    # Slurm's lent node set and feature of a partition are made of its name (lent_<partition>).
    yield from _duplicates(spec.partitions, "name", "spec.partitions", "partition names", fold=True)

    for i, ns in enumerate(spec.node_sets):
        full = f"{c.name}-{ns.name}"
        if len(full) > 52:
            yield FieldError(
                f"spec.nodeSets[{i}].name",
                f"{quote(ns.name)} makes the StatefulSet name {quote(full)} {len(full)} characters "
                "long; cluster and node set names together must stay within 51 characters",
            )
    for i, ns in enumerate(spec.node_sets):
        if quantity_value(ns.memory) < 2**20:
            yield FieldError(
                f"spec.nodeSets[{i}].memory",
                f"{quote(ns.memory)} is less than 1Mi; Slurm counts a node's memory (RealMemory) in MiB",
            )
            continue
        limit = ns.pod_memory_limit()
        if ns.memory_limit is not None and quantity_value(ns.memory_limit) < quantity_value(ns.memory):
            yield FieldError(
                f"spec.nodeSets[{i}].memoryLimit",
                f"{quote(ns.memory_limit)} is less than memory ({quote(ns.memory)}), which Slurm hands to "
                "jobs; leave it out (memory + 512Mi) or give at least memory plus what slurmd needs",
            )
        elif quantity_value(ns.shm_size) > quantity_value(limit):
            yield FieldError(
                f"spec.nodeSets[{i}].shmSize",
                f"{quote(ns.shm_size)} is more than the memory limit ({limit}{'' if ns.memory_limit else ', memory + 512Mi'}), "
                "which /dev/shm counts against; lower shmSize or raise memoryLimit",
            )
        if quantity_value(ns.shm_size) < 2**20:
            yield FieldError(f"spec.nodeSets[{i}].shmSize", f"{quote(ns.shm_size)} is not at least 1Mi")
    if spec.slurm_config.cgroups:
        # Privileged pods are root on their node: their image is not the spec's to choose.
        if spec.slurm.image.repository not in trusted_repositories:
            yield FieldError(
                "spec.slurm.image.repository",
                f"{quote(spec.slurm.image.repository)}: with slurmConfig.cgroups the slurmd pods run "
                f"privileged, and only images from the repositories the operator trusts may "
                f"({', '.join(trusted_repositories)}); use one of them, ask your platform team to trust "
                "this one (the chart's trustedRepositories), or turn cgroups off (jobs are then tracked "
                "by process tree)",
            )
        for i, p in enumerate(spec.partitions):
            if p.accept_lent_nodes:
                yield FieldError(
                    f"spec.partitions[{i}].acceptLentNodes",
                    "cannot be true with slurmConfig.cgroups: lent nodes run slurmd unprivileged, and "
                    "slurmd with cgroups would not start there",
                )
    total = sum(ns.replicas for ns in spec.node_sets)
    if total > spec.slurm_config.max_node_count:
        yield FieldError(
            "spec.slurmConfig.maxNodeCount",
            f"{spec.slurm_config.max_node_count} is less than the {total} nodes the node sets "
            "ask for; raise maxNodeCount or lower the replicas",
        )

    known = [ns.name for ns in spec.node_sets]
    defaults = [i for i, p in enumerate(spec.partitions) if p.default]
    for i in defaults[1:]:
        yield FieldError(
            f"spec.partitions[{i}].default",
            f"spec.partitions[{defaults[0]}] is already the default partition; at most one may be",
        )
    for i, p in enumerate(spec.partitions):
        for j, node_set in enumerate(p.node_sets):
            if node_set not in known:
                yield FieldError(
                    f"spec.partitions[{i}].nodeSets[{j}]",
                    f"{quote(node_set)} is not a node set; known node sets: {', '.join(known) or '(none)'}",
                )

    shared = [(f"spec.sharedStorage.volumes[{j}].mountPath", v.mount_path)
              for j, v in enumerate(spec.shared_storage.volumes if spec.shared_storage else [])]
    for i, ns in enumerate(spec.node_sets):
        for j, t in enumerate(ns.tolerations):
            yield from toleration_errors(f"spec.nodeSets[{i}].tolerations[{j}]", t)
        if ns.pod_template is not None:
            yield from pod_template_errors(ns.pod_template, f"spec.nodeSets[{i}].podTemplate", taken_mounts=shared,
                                           memory_limit=ns.pod_memory_limit())
    yield from _feature_errors(spec)

    users = spec.login.users
    yield from _duplicates(users, "name", "spec.login.users", "user names")
    yield from _duplicates(users, "uid", "spec.login.users", "uids")
    for i, u in enumerate(users):
        if not u.ssh_public_keys and u.ssh_public_keys_from is None:
            yield FieldError(
                f"spec.login.users[{i}]",
                f"user {quote(u.name)} has no SSH public key and could not log in; "
                "set sshPublicKeys or sshPublicKeysFrom",
            )

    for ref in [*secret_refs(c), *pull_secret_refs(c)]:
        owned = owned_name_error(ref)
        if owned is not None:
            yield owned

    size = users_config_bytes(c)
    if size > USERS_CONFIG_BUDGET:
        yield FieldError(
            "spec.login.users",
            f"the users and their inline SSH keys take {size} bytes of the {c.name}-users ConfigMap; "
            f"at most {USERS_CONFIG_BUDGET} fit (Kubernetes' limit is 1 MiB). Move keys to "
            "sshPublicKeysFrom Secrets",
        )

    if spec.shared_storage is not None:
        yield from _storage_errors(spec.shared_storage)

    cfg = spec.slurm_config
    if cfg.select_type_parameters.endswith("_Memory") and cfg.def_mem_per_cpu is None:
        yield FieldError(
            "spec.slurmConfig.defMemPerCPU",
            f"is required with selectTypeParameters {cfg.select_type_parameters}: without it every "
            "job that gives no --mem takes a whole node's memory",
        )
    seen_keys: dict[str, int] = {}
    for i, line in enumerate(cfg.extra_lines):
        yield from extra_line_errors(i, line, seen_keys)

    yield from _accounting_errors(spec)
    yield from _login_service_errors(spec)
    yield from identity_errors(spec.identity)
    yield from login_overlap_errors(spec.identity, spec.login.users)
    yield from egress_errors(spec.identity, spec.network.egress)
    yield from _database_egress_errors(spec)
    yield from _resource_errors(spec)

    if spec.topology is not None:
        keys = spec.topology.label_keys
        for i, k in enumerate(keys):
            if k in keys[:i]:
                yield FieldError(f"spec.topology.labelKeys[{i}]", f"{quote(k)} is listed twice")


def _login_service_errors(spec) -> Iterator[FieldError]:
    """What Kubernetes would refuse on the login Service, and a policy that
    would hide the clients' addresses from the sshFrom NetworkPolicy."""
    service = spec.login.service
    path = "spec.login.service"
    if service.external_traffic_policy is not None and service.type == "ClusterIP":
        yield FieldError(
            f"{path}.externalTrafficPolicy",
            "applies only to a NodePort or LoadBalancer Service (Kubernetes refuses it on type ClusterIP); "
            "leave it unset or change spec.login.service.type",
        )
    if service.load_balancer_source_ranges and service.type != "LoadBalancer":
        yield FieldError(
            f"{path}.loadBalancerSourceRanges",
            f"applies only to a LoadBalancer Service (Kubernetes refuses it on type {service.type}); "
            "leave it empty or set spec.login.service.type to LoadBalancer",
        )
    if service.external_traffic_policy == "Cluster" and service.type != "ClusterIP" and spec.network.limits_ssh():
        yield FieldError(
            f"{path}.externalTrafficPolicy",
            "Cluster hands SSH connections on with a node's address in place of the client's, so the login "
            "pods' NetworkPolicy, which admits only spec.network.sshFrom, would not see the clients (it would "
            "refuse them, or admit anyone behind a listed node); use Local (or leave it unset, which is Local "
            "here), or empty spec.network.sshFrom",
        )


def _database_egress_errors(spec) -> Iterator[FieldError]:
    """With egress rules, the way out to an external database goes to its address alone,
    and a host given by name needs its address blocks said (egressCidrs)."""
    external = spec.accounting.database.external if spec.accounting.enabled else None
    if external is None or not spec.network.egress or external.egress_cidrs or ipv4_literal(external.host):
        return
    yield FieldError("spec.accounting.database.external.egressCidrs",
                     f"host {quote(external.host)} is a name, and with spec.network.egress slurmdbd reaches only "
                     "addresses a NetworkPolicy admits: list the address blocks of the database's servers here "
                     "(e.g. 192.0.2.20/32), or give host as an IPv4 address")


def _resource_errors(spec) -> Iterator[FieldError]:
    """A request above its limit, as Kubernetes refuses the pod (and never
    creates it); a component's default is filled in below or above the other
    (``Resources.filled``), so only what the spec gives both of is checked."""
    managed = spec.accounting.database.managed
    for path, r in (("spec.controller.resources", spec.controller.resources),
                    ("spec.login.resources", spec.login.resources),
                    ("spec.restApi.resources", spec.rest_api.resources),
                    ("spec.accounting.slurmdbd.resources", spec.accounting.slurmdbd.resources),
                    *([("spec.accounting.database.managed.resources", managed.resources)] if managed else [])):
        for key in ("cpu", "memory"):
            req, lim = getattr(r.requests, key), getattr(r.limits, key)
            if req is not None and lim is not None and quantity_value(req) > quantity_value(lim):
                yield FieldError(f"{path}.requests.{key}",
                                 f"{quote(req)} is more than limits.{key} {quote(lim)}: the request must be "
                                 "less than or equal to the limit")


def _feature_errors(spec) -> Iterator[FieldError]:
    """A node's Slurm features say which node set it is in: a node set's
    NodeSet line selects the nodes with the feature of its name, and a lent
    node set the nodes with lent_<partition>. So no node set may list another
    node set's name, or a lent_ name, among its features (in any letter case:
    fail closed on how Slurm compares them)."""
    sets = {ns.name.lower(): i for i, ns in enumerate(spec.node_sets)}
    for i, ns in enumerate(spec.node_sets):
        for j, feature in enumerate(ns.features):
            where = f"spec.nodeSets[{i}].features[{j}]"
            folded = feature.lower()
            if folded.startswith(LENT_PREFIX):
                yield FieldError(
                    where, f"{quote(feature)} starts with {quote(LENT_PREFIX)}, which names the features of lent "
                    "nodes (lent_<partition>): this node set's nodes could join a partition as lent nodes. "
                    "Choose another feature name")
            elif folded in sets:
                other = sets[folded]
                whose = "this node set's own name" if other == i else f"the name of spec.nodeSets[{other}]"
                yield FieldError(
                    where, f"{quote(feature)} is {whose}, which is the feature that puts a node in that node set"
                    + ("" if other == i else ": this node set's nodes would join it, and its partitions")
                    + ". Every node has its node set's name as a feature already; choose another feature name")


def _accounting_errors(spec) -> Iterator[FieldError]:
    acct = spec.accounting
    if not acct.enabled:
        if acct.fair_share is not None:
            yield FieldError("spec.accounting.fairShare",
                             "fair share needs the accounting database; set spec.accounting.enabled: true "
                             "or leave fairShare out")
        return
    db = acct.database
    if db.managed is not None and db.external is not None:
        yield FieldError("spec.accounting.database",
                         "set one of managed and external, not both")
    for i, opt in enumerate(acct.enforce):
        if opt in acct.enforce[:i]:
            yield FieldError(f"spec.accounting.enforce[{i}]", f"{quote(opt)} is listed twice")
    yield from _duplicates(acct.accounts, "name", "spec.accounting.accounts", "account names")
    yield from _duplicates(acct.qos, "name", "spec.accounting.qos", "QOS names")
    login = [u.name for u in spec.login.users]
    listed = {user for account in acct.accounts for user in account.users}
    for i, u in enumerate(spec.login.users):
        if u.name not in listed and not re.fullmatch(SACCTMGR_NAME_RE, u.name):
            yield FieldError(f"spec.login.users[{i}].name",
                             f"{quote(u.name)} is in no account of spec.accounting.accounts, so it would get an "
                             "account of its own name, and an account name starts with a letter or digit; "
                             "list the user in an account")
    for i, user in enumerate(login):
        if user in SACCTMGR_KEYWORDS:  # every login user gets an association: `sacctmgr add user <name>`
            yield FieldError(f"spec.login.users[{i}].name",
                             f"{quote(user)} is a sacctmgr keyword ({', '.join(sorted(SACCTMGR_KEYWORDS))}), and "
                             "with accounting on every login user gets an association; choose another name")
    for i, account in enumerate(acct.accounts):
        if account.name == "root":
            yield FieldError(f"spec.accounting.accounts[{i}].name",
                             "'root' is Slurm's own top account; choose another name")
        elif account.name in login and account.name not in listed:
            # A user in no account gets an account named after the user (operator/accounting.wanted).
            yield FieldError(f"spec.accounting.accounts[{i}].name",
                             f"{quote(account.name)} is the account made for login user {quote(account.name)}, "
                             "who is in no account: the user would join this account. List the user in it "
                             "(or in another account), or choose another name")
        for j, user in enumerate(account.users):
            if user not in login:
                yield FieldError(f"spec.accounting.accounts[{i}].users[{j}]",
                                 f"{quote(user)} is not in spec.login.users; add the user there first")
    yield from account_group_errors(spec.identity, acct)


def users_config_bytes(c: SlurmCluster) -> int:
    """An upper bound of the size of the ``<cluster>-users`` ConfigMap's data
    (passwd, group and one authorized_keys per user; keys and values), as
    Kubernetes counts it. A test checks it against the rendered ConfigMap."""
    total = len("passwd") + len("group")
    for u in c.spec.login.users:
        total += 2 * (len(u.name) + 40)  # passwd and group lines: name, ids, home, shell
        total += len(u.name) + len(".authorized_keys")
        total += sum(len(k.encode()) + 1 for k in u.ssh_public_keys)
    return total


def _storage_errors(storage) -> Iterator[FieldError]:
    vols = storage.volumes
    yield from _duplicates(vols, "name", "spec.sharedStorage.volumes", "volume names")
    yield from _duplicates(vols, "mount_path", "spec.sharedStorage.volumes", "mount paths")
    for i, v in enumerate(vols):
        path = f"spec.sharedStorage.volumes[{i}]"
        if (v.existing_claim is None) == (v.size is None):
            yield FieldError(
                path, "set exactly one of existingClaim (use a claim) or size (create a claim)"
            )
        if v.existing_claim is not None and v.storage_class_name is not None:
            yield FieldError(
                f"{path}.storageClassName",
                "only applies to a claim the operator creates; drop it or drop existingClaim",
            )
        mp = v.mount_path
        why = system_mount_problem(mp)
        if why is not None:
            yield FieldError(f"{path}.mountPath", f"{quote(mp)} {why}; mount under another path such as /shared")
        for j, other in enumerate(vols[:i]):
            if nested(mp, other.mount_path):
                yield FieldError(
                    f"{path}.mountPath",
                    f"{quote(mp)} nests with spec.sharedStorage.volumes[{j}].mountPath "
                    f"{quote(other.mount_path)}; mount volumes side by side",
                )
    cp = storage.checkpoint_dir
    if cp is not None:
        owner = next(
            (v for v in vols if cp == v.mount_path or cp.startswith(v.mount_path + "/")), None
        )
        if owner is None:
            yield FieldError(
                "spec.sharedStorage.checkpointDir",
                f"{quote(cp)} is not inside any shared volume; put it under one of "
                + ", ".join(v.mount_path for v in vols),
            )
        elif owner.read_only:
            yield FieldError(
                "spec.sharedStorage.checkpointDir",
                f"{quote(cp)} is on volume {quote(owner.name)}, which is mounted read-only",
            )
