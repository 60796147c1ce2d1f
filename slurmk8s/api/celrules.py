"""The cross-field rules of the validators, in CEL, for the CRDs (``x-kubernetes-validations``).

The validators (:func:`.validate.semantic_errors`, :func:`.policy.policy_errors` and the
functions they call) are the rules; the operator's webhook applies them. Where the
webhook is absent, or set to ``failurePolicy: Ignore`` and unreachable, the API server
still refuses what these rules state, at ``kubectl apply``. Each :class:`CelRule` is
placed on one schema node by :mod:`.crd` (``self`` is the value there), names the
validator rule it mirrors (``mirrors``: a pattern of the validator's
``<path>: <message>``), and reports at the validator's field path where Kubernetes
can (``fieldPath`` reaches fields, not list indices) with the validator's reason.

What is left out, and why (docs/decisions/0054-cel-rules-in-the-crds.md): rules that
depend on the site's settings (trusted repositories, a default storage class), on
other objects, on quantities (``memory``, ``shmSize``, resources: Kubernetes' CEL
quantity library is not the one the stand-in evaluates), on byte sizes, on parsing
(``extraLines``, LDAP filters, time zones), and the rules over the login users and
accounts whose nested loops (1000 x 1000 x 1000) go over the API server's cost budget.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import versions
from .cluster import LENT_PREFIX, SACCTMGR_KEYWORDS
from .fields import SYSTEM_ID_BLOCK

__all__ = ["CelRule", "RULES", "rules_for", "mirrored"]


@dataclass(frozen=True)
class CelRule:
    """One ``x-kubernetes-validations`` entry and the validator rule it mirrors."""

    kind: str
    #: Schema node the rule is placed on: "" (the object), "spec", "spec.nodeSets[]" (each item).
    at: str
    rule: str
    message: str
    #: Pattern of the validator's "<path>: <message>" this rule refuses too.
    mirrors: str
    #: Field the error names, relative to ``at`` (".memoryLimit"), as Kubernetes' fieldPath.
    field_path: str | None = None

    def entry(self) -> dict:
        """The ``x-kubernetes-validations`` entry."""
        out = {"rule": self.rule, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


def _unique(expr: str, key: str = "x") -> str:
    """Every element of the list ``expr`` is there once (by ``key``, an expression of x)."""
    other = re.sub(r"\bx\b", "y", key)
    return f"{expr}.all(x, {expr}.filter(y, {other} == {key}).size() == 1)"


_ABLE = [r.version for r in versions.RELEASES.values() if r.topology_places_dynamic_nodes]
_KEYWORDS = ", ".join(f"'{k}'" for k in sorted(SACCTMGR_KEYWORDS))
_LOW, _HIGH = SYSTEM_ID_BLOCK
_IPV4 = r"^[0-9]{1,3}(\\.[0-9]{1,3}){3}$"

SC, NLP = "SlurmCluster", "NodeLendingPolicy"

RULES: tuple[CelRule, ...] = (
    # -- SlurmCluster: semantic_errors ------------------------------------------------------------
    CelRule(SC, "spec", f"!has(self.topology) || self.slurm.version in [{', '.join(repr(v) for v in _ABLE)}]",
            "this Slurm release's topology/tree does not place dynamic nodes, so no job would ever run; set "
            f"spec.slurm.version to {' or '.join(_ABLE)}, or leave spec.topology unset",
            r"^spec\.topology: Slurm .* does not place dynamic nodes", ".topology"),
    CelRule(SC, "spec.partitions", _unique("self", "x.name.lowerAscii()"),
            "partition names must be unique (letter case aside)",
            r"^spec\.partitions\[\d+\]\.name: .* is already used by .* \(letter case aside\)"),
    CelRule(SC, "", "!has(self.spec.nodeSets) || self.spec.nodeSets.all(n, size(self.metadata.name) + size(n.name) "
            "<= 51)",
            "a node set's name makes the StatefulSet name <cluster>-<node set>; cluster and node set names together "
            "must stay within 51 characters", r"^spec\.nodeSets\[\d+\]\.name: .* makes the StatefulSet name",
            ".spec.nodeSets"),
    CelRule(SC, "spec", "!self.slurmConfig.cgroups || !has(self.partitions) || "
            "self.partitions.all(p, !p.acceptLentNodes)",
            "acceptLentNodes cannot be true with slurmConfig.cgroups: lent nodes run slurmd unprivileged, and slurmd "
            "with cgroups would not start there", r"^spec\.partitions\[\d+\]\.acceptLentNodes: cannot be true with",
            ".partitions"),
    CelRule(SC, "spec", "!has(self.nodeSets) || self.nodeSets.map(n, n.replicas).sum() <= "
            "self.slurmConfig.maxNodeCount",
            "is less than the nodes the node sets ask for (the sum of their replicas); raise maxNodeCount or lower "
            "the replicas", r"^spec\.slurmConfig\.maxNodeCount: \d+ is less than the", ".slurmConfig.maxNodeCount"),
    CelRule(SC, "spec.partitions", "self.filter(p, p.default).size() <= 1",
            "at most one partition may be the default", r"^spec\.partitions\[\d+\]\.default: .* is already the default"),
    CelRule(SC, "spec", "!has(self.partitions) || self.partitions.all(p, !has(p.nodeSets) || p.nodeSets.all(n, "
            "has(self.nodeSets) && self.nodeSets.exists(s, s.name == n)))",
            "a partition names a node set that is not in spec.nodeSets",
            r"^spec\.partitions\[\d+\]\.nodeSets\[\d+\]: .* is not a node set", ".partitions"),
    # toleration_errors (the node sets' tolerations; the pod templates' are checked by the webhook)
    CelRule(SC, "spec.nodeSets[].tolerations[]", "(has(self.key) && self.key != '') || self.operator == 'Exists'",
            "must be Exists when key is empty (which matches every taint); give a key, or operator: Exists",
            r"^spec\.nodeSets\[\d+\]\.tolerations\[\d+\]\.operator: must be Exists", ".operator"),
    CelRule(SC, "spec.nodeSets[].tolerations[]", "self.operator != 'Exists' || !has(self.value) || self.value == ''",
            "a toleration with operator Exists matches any value and may not give one; drop value, or use "
            "operator: Equal", r"^spec\.nodeSets\[\d+\]\.tolerations\[\d+\]\.value: .* operator Exists", ".value"),
    CelRule(SC, "spec.nodeSets[].tolerations[]",
            "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "only applies to effect NoExecute; drop it or set effect: NoExecute",
            r"^spec\.nodeSets\[\d+\]\.tolerations\[\d+\]\.tolerationSeconds: only applies to effect NoExecute",
            ".tolerationSeconds"),
    # _feature_errors
    CelRule(SC, "spec.nodeSets[]", f"!has(self.features) || self.features.all(f, "
            f"!f.lowerAscii().startsWith('{LENT_PREFIX}'))",
            f"a feature starts with '{LENT_PREFIX}', which names the features of lent nodes (lent_<partition>): this "
            "node set's nodes could join a partition as lent nodes. Choose another feature name",
            r"^spec\.nodeSets\[\d+\]\.features\[\d+\]: .* starts with \"lent_\"", ".features"),
    CelRule(SC, "spec", "!has(self.nodeSets) || self.nodeSets.all(n, !has(n.features) || n.features.all(f, "
            "!self.nodeSets.exists(m, m.name.lowerAscii() == f.lowerAscii())))",
            "a node set's feature is the name of a node set (in any letter case), which is the feature that puts a "
            "node in that node set; choose another feature name",
            r"^spec\.nodeSets\[\d+\]\.features\[\d+\]: .* is (this node set's own name|the name of spec\.nodeSets)",
            ".nodeSets"),
    # login users
    CelRule(SC, "spec.login.users", _unique("self", "x.uid"), "uids must be unique",
            r"^spec\.login\.users\[\d+\]\.uid: .* is already used by"),
    CelRule(SC, "spec.login.users[]", "(has(self.sshPublicKeys) && size(self.sshPublicKeys) > 0) || "
            "has(self.sshPublicKeysFrom)",
            "the user has no SSH public key and could not log in; set sshPublicKeys or sshPublicKeysFrom",
            r"^spec\.login\.users\[\d+\]: user .* has no SSH public key"),
    # _storage_errors
    CelRule(SC, "spec.sharedStorage.volumes", _unique("self", "x.mountPath"), "mount paths must be unique",
            r"^spec\.sharedStorage\.volumes\[\d+\]\.mountPath: .* is already used by"),
    CelRule(SC, "spec.sharedStorage.volumes[]", "has(self.existingClaim) != has(self.size)",
            "set exactly one of existingClaim (use a claim) or size (create a claim)",
            r"^spec\.sharedStorage\.volumes\[\d+\]: set exactly one of existingClaim"),
    CelRule(SC, "spec.sharedStorage.volumes[]", "!has(self.existingClaim) || !has(self.storageClassName)",
            "only applies to a claim the operator creates; drop it or drop existingClaim",
            r"^spec\.sharedStorage\.volumes\[\d+\]\.storageClassName: only applies to a claim", ".storageClassName"),
    CelRule(SC, "spec.sharedStorage.volumes", "self.all(x, self.all(y, !x.mountPath.startsWith(y.mountPath + '/')))",
            "a volume's mountPath nests with another's; mount volumes side by side",
            r"^spec\.sharedStorage\.volumes\[\d+\]\.mountPath: .* nests with spec\.sharedStorage\.volumes"),
    CelRule(SC, "spec.sharedStorage", "!has(self.checkpointDir) || self.volumes.exists(v, self.checkpointDir == "
            "v.mountPath || self.checkpointDir.startsWith(v.mountPath + '/'))",
            "is not inside any shared volume; put it under one of the volumes' mount paths",
            r"^spec\.sharedStorage\.checkpointDir: .* is not inside any shared volume", ".checkpointDir"),
    CelRule(SC, "spec.sharedStorage", "!has(self.checkpointDir) || !self.volumes.exists(v, v.readOnly && "
            "(self.checkpointDir == v.mountPath || self.checkpointDir.startsWith(v.mountPath + '/')))",
            "is on a volume that is mounted read-only",
            r"^spec\.sharedStorage\.checkpointDir: .* which is mounted read-only", ".checkpointDir"),
    CelRule(SC, "spec.slurmConfig", "!self.selectTypeParameters.endsWith('_Memory') || has(self.defMemPerCPU)",
            "is required with a selectTypeParameters ending in _Memory: without it every job that gives no --mem "
            "takes a whole node's memory", r"^spec\.slurmConfig\.defMemPerCPU: is required with", ".defMemPerCPU"),
    # _accounting_errors (those within the cost budget)
    CelRule(SC, "spec.accounting", "self.enabled || !has(self.fairShare)",
            "fair share needs the accounting database; set spec.accounting.enabled: true or leave fairShare out",
            r"^spec\.accounting\.fairShare: fair share needs", ".fairShare"),
    CelRule(SC, "spec.accounting", "!self.enabled || !has(self.database.managed) || !has(self.database.external)",
            "set one of managed and external, not both", r"^spec\.accounting\.database: set one of managed",
            ".database"),
    CelRule(SC, "spec.accounting", "!self.enabled || !has(self.enforce) || " + _unique("self.enforce"),
            "an enforce option is listed twice", r"^spec\.accounting\.enforce\[\d+\]: .* is listed twice", ".enforce"),
    CelRule(SC, "spec.accounting", "!self.enabled || !has(self.accounts) || self.accounts.all(a, a.name != 'root')",
            "'root' is Slurm's own top account; choose another name",
            r"^spec\.accounting\.accounts\[\d+\]\.name: 'root' is Slurm's own", ".accounts"),
    CelRule(SC, "spec", "!self.accounting.enabled || !has(self.login.users) || self.login.users.all(u, "
            f"!(u.name in [{_KEYWORDS}]))",
            f"a login user's name is a sacctmgr keyword ({', '.join(sorted(SACCTMGR_KEYWORDS))}), and with accounting "
            "on every login user gets an association; choose another name",
            r"^spec\.login\.users\[\d+\]\.name: .* is a sacctmgr keyword .* and with accounting on", ".login.users"),
    CelRule(SC, "spec", "!self.accounting.enabled || !has(self.accounting.accounts) || "
            "self.accounting.accounts.all(a, !has(a.groups) || size(a.groups) == 0 || has(self.identity.ldap))",
            "groups are the directory's: set spec.identity.ldap, or list users instead",
            r"^spec\.accounting\.accounts\[\d+\]\.groups\[\d+\]: groups are the directory's", ".accounting.accounts"),
    # _login_service_errors
    CelRule(SC, "spec.login.service", "!has(self.externalTrafficPolicy) || self.type != 'ClusterIP'",
            "applies only to a NodePort or LoadBalancer Service (Kubernetes refuses it on type ClusterIP); leave it "
            "unset or change spec.login.service.type",
            r"^spec\.login\.service\.externalTrafficPolicy: applies only to", ".externalTrafficPolicy"),
    CelRule(SC, "spec.login.service", "!has(self.loadBalancerSourceRanges) || size(self.loadBalancerSourceRanges) "
            "== 0 || self.type == 'LoadBalancer'",
            "applies only to a LoadBalancer Service; leave it empty or set spec.login.service.type to LoadBalancer",
            r"^spec\.login\.service\.loadBalancerSourceRanges: applies only to", ".loadBalancerSourceRanges"),
    CelRule(SC, "spec", "!has(self.login.service.externalTrafficPolicy) || "
            "self.login.service.externalTrafficPolicy != 'Cluster' || self.login.service.type == 'ClusterIP' || "
            "!self.network.policies || !has(self.network.sshFrom) || size(self.network.sshFrom) == 0",
            "Cluster hands SSH connections on with a node's address in place of the client's, so the login pods' "
            "NetworkPolicy, which admits only spec.network.sshFrom, would not see the clients; use Local (or leave "
            "it unset, which is Local here), or empty spec.network.sshFrom",
            r"^spec\.login\.service\.externalTrafficPolicy: Cluster hands SSH", ".login.service.externalTrafficPolicy"),
    # _database_egress_errors
    CelRule(SC, "spec", "!self.accounting.enabled || !has(self.accounting.database.external) || "
            "!self.network.egress || (has(self.accounting.database.external.egressCidrs) && "
            "size(self.accounting.database.external.egressCidrs) > 0) || "
            f"self.accounting.database.external.host.matches('{_IPV4}')",
            "the database's host is a name, and with spec.network.egress slurmdbd reaches only addresses a "
            "NetworkPolicy admits: list the address blocks of the database's servers here (e.g. 192.0.2.20/32), or "
            "give host as an IPv4 address",
            r"^spec\.accounting\.database\.external\.egressCidrs: host .* is a name",
            ".accounting.database.external"),
    CelRule(SC, "spec.topology", _unique("self.labelKeys"), "a label key is listed twice",
            r"^spec\.topology\.labelKeys\[\d+\]: .* is listed twice", ".labelKeys"),
    # identity_errors, login_overlap_errors
    CelRule(SC, "spec.identity.ldap", "self.startTls || self.allowPlainLdap || "
            "self.uris.all(u, !u.startsWith('ldap://'))",
            "a URI is plain LDAP: set startTls (or use ldaps://), or allowPlainLdap for a directory on a trusted "
            "network", r"^spec\.identity\.ldap\.uris\[\d+\]: .* is plain LDAP", ".uris"),
    CelRule(SC, "spec.identity.ldap", "!self.startTls || self.uris.exists(u, u.startsWith('ldap://'))",
            "applies to ldap:// URIs only, and every URI is ldaps:// (TLS already)",
            r"^spec\.identity\.ldap\.startTls: applies to ldap:// URIs only", ".startTls"),
    CelRule(SC, "spec.identity.ldap", "has(self.bindDn) == has(self.bindPasswordSecret)",
            "set bindDn and bindPasswordSecret together (or neither, for an anonymous bind)",
            r"^spec\.identity\.ldap\.(bindDn|bindPasswordSecret): set bindDn and bindPasswordSecret together"),
    CelRule(SC, "spec.identity.ldap", "!has(self.ca) || has(self.ca.configMap) != has(self.ca.secret)",
            "set exactly one of configMap and secret", r"^spec\.identity\.ldap\.ca: set exactly one of", ".ca"),
    CelRule(SC, "spec.identity.ldap", "self.minId <= self.maxId", "is below minId",
            r"^spec\.identity\.ldap\.maxId: \d+ is below minId", ".maxId"),
    CelRule(SC, "spec.identity.ldap", f"self.minId > self.maxId || self.minId > {_HIGH} || self.maxId < {_LOW}",
            f"the id range holds the ids {_LOW}-{_HIGH} the images keep for their own accounts (SlurmUser slurm is "
            "64030, nobody 65534); choose a range outside them",
            r"^spec\.identity\.ldap\.(minId|maxId): the id range .* holds the ids"),
    CelRule(SC, "spec.identity.ldap", _unique("self.uris"), "a URI is listed twice",
            r"^spec\.identity\.ldap\.uris\[\d+\]: .* is listed twice", ".uris"),
    CelRule(SC, "spec.identity.ldap", "!has(self.loginGroups) || " + _unique("self.loginGroups"),
            "a group is listed twice", r"^spec\.identity\.ldap\.loginGroups\[\d+\]: .* is listed twice",
            ".loginGroups"),
    CelRule(SC, "spec", "!has(self.identity.ldap) || !has(self.login.users) || self.login.users.all(u, "
            "(u.uid < self.identity.ldap.minId || u.uid > self.identity.ldap.maxId) && (!has(u.gid) || "
            "u.gid < self.identity.ldap.minId || u.gid > self.identity.ldap.maxId))",
            "a login user's uid or gid lies in the directory's id range (spec.identity.ldap minId-maxId), where it "
            "would own the directory's files and jobs; give the user an id outside the range",
            r"^spec\.login\.users\[\d+\]\.(uid|gid): \d+ lies in the directory", ".login.users"),
    # -- NodeLendingPolicy: policy_errors ----------------------------------------------------------
    CelRule(NLP, "spec.nodeSelector", "(has(self.matchLabels) && size(self.matchLabels) > 0) || "
            "(has(self.matchExpressions) && size(self.matchExpressions) > 0)",
            "is empty and would lend every GPU node of the cluster; give matchLabels or matchExpressions, e.g. "
            'matchLabels: {slurmk8s.dev/lendable: "true"}', r"^spec\.nodeSelector: is empty and would lend"),
    CelRule(NLP, "spec.nodeSelector", "(!has(self.matchLabels) || size(self.matchLabels) == 0) && "
            "(!has(self.matchExpressions) || size(self.matchExpressions) == 0) || "
            "(has(self.matchLabels) && size(self.matchLabels) > 0) || "
            "(has(self.matchExpressions) && self.matchExpressions.exists(r, r.operator in ['In', 'Exists']))",
            "only says which labels a node must not have, so it matches every node without them; ask for a label "
            'with matchLabels, or an In or Exists expression, e.g. matchLabels: {slurmk8s.dev/lendable: "true"}',
            r"^spec\.nodeSelector: only says which labels a node must not have"),
    CelRule(NLP, "spec.reclaim", "!has(self.podSelector) || (has(self.podSelector.matchLabels) && "
            "size(self.podSelector.matchLabels) > 0) || (has(self.podSelector.matchExpressions) && "
            "size(self.podSelector.matchExpressions) > 0)",
            "is empty and matches every pod; leave podSelector out (then every pending GPU pod triggers a reclaim, "
            "or those with minPriority) or give matchLabels or matchExpressions",
            r"^spec\.reclaim\.podSelector: is empty and matches every pod", ".podSelector"),
    CelRule(NLP, "spec.windows[]", "self.start != '24:00'", "\"24:00\" is the end of a day; start the window at 00:00",
            r'^spec\.windows\[\d+\]\.start: "24:00" is the end of a day', ".start"),
    CelRule(NLP, "spec.windows[]", "self.start == '24:00' || self.start != self.end",
            "equals start, which leaves an empty window; for a whole day use start 00:00 and end 24:00",
            r"^spec\.windows\[\d+\]\.end: .* equals start", ".end"),
    CelRule(NLP, "spec.windows[]", "!has(self.days) || " + _unique("self.days"), "a day is listed twice",
            r"^spec\.windows\[\d+\]\.days\[\d+\]: .* is listed twice", ".days"),
)


def rules_for(kind: str) -> list[CelRule]:
    return [r for r in RULES if r.kind == kind]


def mirrored(kind: str, error: str) -> CelRule | None:
    """The rule that mirrors a validator's ``<path>: <message>`` error, or None."""
    return next((r for r in rules_for(kind) if re.search(r.mirrors, error)), None)
