"""Bad input gets an error that names the field path and the reason."""

from __future__ import annotations

import pytest

from slurmk8s import versions
from slurmk8s.api import InvalidSpec, load_cluster
from slurmk8s.api.validate import KNOB_FOR_KEY

from .conftest import minimal

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop"


def errors_of(doc: dict) -> list[str]:
    with pytest.raises(InvalidSpec) as info:
        load_cluster(doc)
    assert info.value.errors, "InvalidSpec must carry at least one error"
    return [str(e) for e in info.value.errors]


def test_the_newline_example_from_the_spec():
    doc = minimal(partitions=[{"name": "cpu"}, {"name": "gpu\nProlog=/x"}])
    assert errors_of(doc) == ['spec.partitions[1].name: "gpu\\nProlog=/x" contains a newline']


@pytest.mark.parametrize(
    "spec,path,reason",
    [
        ({"partitions": [{"name": "gpu#x"}]}, "spec.partitions[0].name", "contains '#'"),
        ({"partitions": [{"name": "gpu=x"}]}, "spec.partitions[0].name", "contains '='"),
        ({"partitions": [{"name": "gpu Nodes=ALL"}]}, "spec.partitions[0].name", "contains '='"),
        ({"partitions": [{"name": "gpu x"}]}, "spec.partitions[0].name", "whitespace"),
        ({"partitions": [{"name": "-gpu"}]}, "spec.partitions[0].name", "is not valid"),
        ({"partitions": [{"name": "p", "maxTime": "1 day"}]}, "spec.partitions[0].maxTime", "whitespace"),
        ({"partitions": [{"name": "p", "maxTime": "forever"}]}, "spec.partitions[0].maxTime", "Slurm time"),
        ({"nodeSets": [{"name": "GPU"}]}, "spec.nodeSets[0].name", "lower-case letters and digits"),
        ({"nodeSets": [{"name": "g", "features": ["a,b"]}]}, "spec.nodeSets[0].features[0]", "is not valid"),
        ({"nodeSets": [{"name": "g", "gpus": {"type": "h100:8"}}]}, "spec.nodeSets[0].gpus.type", "is not valid"),
        ({"nodeSets": [{"name": "g", "memory": "4 GB"}]}, "spec.nodeSets[0].memory", "whitespace"),
        ({"nodeSets": [{"name": "g", "drain": {"signal": "KILL"}}]}, "spec.nodeSets[0].drain.signal", "'USR1'"),
        ({"nodeSets": [{"name": "g", "drain": {"gracePeriod": -1}}]}, "spec.nodeSets[0].drain.gracePeriod",
         "too small"),
        ({"nodeSets": [{"name": "g", "replicas": -1}]}, "spec.nodeSets[0].replicas", "too small"),
        ({"nodeSets": [{"name": "g", "nodeSelector": {"bad key!": "x"}}]}, "spec.nodeSets[0].nodeSelector.bad key!", "label key"),
        ({"nodeSets": [{"name": "g", "tolerations": [{"operator": "Maybe"}]}]}, "spec.nodeSets[0].tolerations[0].operator", "not allowed"),
        ({"slurmConfig": {"schedulerParameters": ["bf_continue\nProlog=/x"]}}, "spec.slurmConfig.schedulerParameters[0]", "newline"),
        ({"slurmConfig": {"schedulerParameters": ["a,b"]}}, "spec.slurmConfig.schedulerParameters[0]", "one option per list item"),
        ({"slurmConfig": {"extraLines": ["Foo=1\nProlog=/x"]}}, "spec.slurmConfig.extraLines[0]", "newline"),
        ({"slurmConfig": {"extraLines": ["Foo=1 # hi"]}}, "spec.slurmConfig.extraLines[0]", "'#'"),
        ({"slurmConfig": {"extraLines": ["Foo=1 Prolog=/x"]}}, "spec.slurmConfig.extraLines[0]", "single Key=Value"),
        ({"slurmConfig": {"extraLines": ["SelectType=select/linear"]}}, "spec.slurmConfig.extraLines[0]", "cannot be overridden"),
        ({"slurmConfig": {"extraLines": ["maxnodecount=5"]}}, "spec.slurmConfig.extraLines[0]", "use spec.slurmConfig.maxNodeCount instead"),
        ({"slurmConfig": {"extraLines": ["Waittime=1", "WAITTIME=2"]}}, "spec.slurmConfig.extraLines[1]", "already set by extraLines[0]"),
        ({"slurmConfig": {"selectTypeParameters": "CR_Core_Memory"}}, "spec.slurmConfig.defMemPerCPU", "whole node's memory"),
        ({"slurmConfig": {"maxNodeCount": 1}, "nodeSets": [{"name": "a", "replicas": 2}]}, "spec.slurmConfig.maxNodeCount", "raise maxNodeCount"),
        ({"slurmConfig": {"bogus": 1}}, "spec.slurmConfig.bogus", "not a known field"),
        ({"slurm": {"version": "21.08"}}, "spec.slurm.version", "not a supported Slurm release: use one of "
         + ", ".join(versions.SUPPORTED)),
        ({"slurm": {"version": "23.02"}}, "spec.slurm.version", "not a supported Slurm release"),
        ({"slurm": {"version": "24.11.1"}}, "spec.slurm.version", "not a supported Slurm release"),
        ({"slurm": {"version": "latest"}}, "spec.slurm.version", "Slurm release"),
        ({"slurm": {"version": "22.05"}, "topology": {"labelKeys": ["net/leaf"]}}, "spec.topology",
         "does not place dynamic nodes"),
        ({"slurm": {"image": {"repository": "Registry/x"}}}, "spec.slurm.image.repository", "image repository"),
        ({"login": {"users": [{"name": "root", "uid": 3000, "sshPublicKeys": [KEY]}]}}, "spec.login.users[0].name", "system account"),
        ({"login": {"users": [{"name": "a;rm", "uid": 3000, "sshPublicKeys": [KEY]}]}}, "spec.login.users[0].name", "is not valid"),
        ({"login": {"users": [{"name": "alice", "uid": 0, "sshPublicKeys": [KEY]}]}}, "spec.login.users[0].uid", "too small"),
        ({"login": {"users": [{"name": "alice", "uid": 3000}]}}, "spec.login.users[0]", "no SSH public key"),
        ({"login": {"users": [{"name": "alice", "uid": 3000, "sshPublicKeys": [KEY + "\nssh-rsa AAAA evil"]}]}}, "spec.login.users[0].sshPublicKeys[0]", "newline"),
        ({"login": {"users": [{"name": "alice", "uid": 3000, "sshPublicKeys": ['command="sh" ' + KEY]}]}}, "spec.login.users[0].sshPublicKeys[0]", "options are not allowed"),
        ({"login": {"users": [{"name": "a", "uid": 3000, "sshPublicKeys": [KEY]}, {"name": "b", "uid": 3000, "sshPublicKeys": [KEY]}]}}, "spec.login.users[1].uid", "uids must be unique"),
        ({"sharedStorage": {"volumes": [{"name": "s", "mountPath": "/shared"}]}}, "spec.sharedStorage.volumes[0]", "exactly one of existingClaim"),
        ({"sharedStorage": {"volumes": [{"name": "s", "mountPath": "/etc/x", "size": "1Gi"}]}}, "spec.sharedStorage.volumes[0].mountPath", "system directory"),
        ({"sharedStorage": {"volumes": [{"name": "s", "mountPath": "/shared/../etc", "size": "1Gi"}]}}, "spec.sharedStorage.volumes[0].mountPath", "'..'"),
        ({"sharedStorage": {"volumes": [{"name": "s", "mountPath": "/shared; reboot", "size": "1Gi"}]}}, "spec.sharedStorage.volumes[0].mountPath", "whitespace"),
        ({"sharedStorage": {"volumes": [{"name": "s", "mountPath": "/a", "size": "1Gi"}, {"name": "t", "mountPath": "/a/b", "size": "1Gi"}]}}, "spec.sharedStorage.volumes[1].mountPath", "nests with"),
        ({"sharedStorage": {"volumes": [{"name": "s", "mountPath": "/shared", "size": "1Gi"}], "checkpointDir": "/scratch/ckpt"}}, "spec.sharedStorage.checkpointDir", "not inside any shared volume"),
        ({"sharedStorage": {"volumes": [{"name": "s", "mountPath": "/shared", "size": "1Gi", "readOnly": True}], "checkpointDir": "/shared/ckpt"}}, "spec.sharedStorage.checkpointDir", "read-only"),
        ({"topology": {"labelKeys": ["a/b", "a/b"]}}, "spec.topology.labelKeys[1]", "listed twice"),
        ({"partitions": [{"name": "a", "default": True}, {"name": "b", "default": True}]}, "spec.partitions[1].default", "at most one"),
        ({"partitions": [{"name": "a"}, {"name": "a"}]}, "spec.partitions[1].name", "must be unique"),
        ({"partitions": [{"name": "a", "nodeSets": ["ghost"]}]}, "spec.partitions[0].nodeSets[0]", "is not a node set"),
    ],
)
def test_bad_input_names_the_field_and_the_reason(spec, path, reason):
    found = errors_of(minimal(**spec))
    matching = [e for e in found if e.startswith(path + ": ")]
    assert matching, f"no error at {path}; got {found}"
    assert any(reason in e for e in matching), f"{reason!r} not in {matching}"


def test_long_cluster_and_node_set_names_together_are_refused():
    doc = minimal(nodeSets=[{"name": "n" * 20}])
    doc["metadata"]["name"] = "c" * 40
    assert any(
        e.startswith("spec.nodeSets[0].name: ") and "within 51 characters" in e for e in errors_of(doc)
    )


def test_every_problem_is_reported_at_once():
    doc = minimal(
        partitions=[{"name": "a#"}, {"name": "b\n"}],
        nodeSets=[{"name": "x", "replicas": "many"}],
    )
    paths = {e.split(":")[0] for e in errors_of(doc)}
    assert paths == {"spec.partitions[0].name", "spec.partitions[1].name", "spec.nodeSets[0].replicas"}


def test_braces_in_input_do_not_break_the_message():
    found = errors_of(minimal(partitions=[{"name": "{x}\n"}]))
    assert found == ['spec.partitions[0].name: "{x}\\n" contains a newline']


def test_metadata_name_becomes_hostnames_so_it_is_checked():
    doc = minimal()
    doc["metadata"]["name"] = "Demo_1"
    assert any(e.startswith("metadata.name: ") for e in errors_of(doc))


def test_every_owned_key_is_refused_in_extra_lines():
    for key in KNOB_FOR_KEY:
        found = errors_of(minimal(slurmConfig={"extraLines": [f"{key}=x"]}))
        assert len(found) == 1 and "writes itself" in found[0], (key, found)


def test_an_allowed_extra_line_is_accepted():
    c = load_cluster(minimal(slurmConfig={"extraLines": ["SchedulerTimeSlice=60", "Waittime=5"]}))
    assert c.spec.slurm_config.extra_lines == ["SchedulerTimeSlice=60", "Waittime=5"]


def test_a_node_set_feature_may_not_be_a_lent_node_feature():
    doc = minimal(nodeSets=[{"name": "a", "features": ["fast", "lent_gpu"]}],
                  partitions=[{"name": "gpu", "nodeSets": ["a"], "acceptLentNodes": True}])
    found = errors_of(doc)
    assert len(found) == 1
    assert found[0].startswith("spec.nodeSets[0].features[1]: ") and "could join a partition as lent nodes" in found[0]


@pytest.mark.parametrize("node_set,path,reason", [
    ({"memory": "4Gi", "memoryLimit": "2Gi"}, "spec.nodeSets[0].memoryLimit", "less than memory"),
    ({"memory": "4Gi", "memoryLimit": "5Gi", "shmSize": "6Gi"}, "spec.nodeSets[0].shmSize", "more than the memory limit"),
    ({"memory": "1Gi", "shmSize": "2Gi"}, "spec.nodeSets[0].shmSize", "more than the memory limit (1536Mi"),
    ({"shmSize": "0"}, "spec.nodeSets[0].shmSize", "at least 1Mi"),
])
def test_memory_limit_and_shm_size_are_checked(node_set, path, reason):
    doc = minimal(nodeSets=[{"name": "cpu", **node_set}], partitions=[{"name": "cpu", "nodeSets": ["cpu"]}])
    found = [e for e in errors_of(doc) if e.startswith(path + ": ")]
    assert found and reason in found[0], errors_of(doc)


def test_privileged_workers_run_only_the_projects_images():
    """Issue 13, item 9: cgroups makes slurmd pods privileged, root on the
    Kubernetes node; the spec's image repository must then be the project's,
    not one the namespace's admin chose."""
    doc = minimal(slurm={"image": {"repository": "registry.example.com/mine"}}, slurmConfig={"cgroups": True})
    found = [e for e in errors_of(doc) if e.startswith("spec.slurm.image.repository: ")]
    assert found and "privileged" in found[0] and "ghcr.io/slurmk8s" in found[0], errors_of(doc)
    load_cluster(minimal(slurm={"image": {"repository": "registry.example.com/mine"}}))  # unprivileged: any
    load_cluster(minimal(slurm={"image": {"tag": "22.05-2"}}, slurmConfig={"cgroups": True}))


def test_cgroups_and_lent_nodes_do_not_mix():
    """Lent slurmd pods run unprivileged on other teams' nodes; slurmd with
    proctrack/cgroup could not start there."""
    doc = minimal(slurmConfig={"cgroups": True}, partitions=[{"name": "gpu", "acceptLentNodes": True}])
    assert any(e.startswith("spec.partitions[0].acceptLentNodes: ") and "cgroups" in e for e in errors_of(doc))
