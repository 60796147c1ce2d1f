"""Issue 13, items 1-5: input that ran code, crashed, collided or hid the system."""

from __future__ import annotations

import re

import pytest

from slurmk8s.api import InvalidSpec, load_cluster, load_policy
from slurmk8s.api.validate import EXTRA_LINE_KEYS, RESERVED_MOUNTS, USERS_CONFIG_BUDGET, users_config_bytes
from slurmk8s.render import ClusterKeys, render
from slurmk8s.render.config import config_files

from .conftest import minimal

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop"
KEYS = ClusterKeys.generate()


def errors_at(doc: dict, loader=load_cluster) -> dict[str, list[str]]:
    """Every error of ``doc``, by field path. Anything but InvalidSpec fails the test."""
    with pytest.raises(InvalidSpec) as info:
        loader(doc)
    out: dict[str, list[str]] = {}
    for e in info.value.errors:
        out.setdefault(e.path, []).append(e.message)
    return out


def refused_at(doc: dict, path: str, reason: str = "", loader=load_cluster) -> None:
    found = errors_at(doc, loader)
    assert path in found, f"no error at {path}; got {found}"
    assert any(reason in m for m in found[path]), f"{reason!r} not in {found[path]}"


# -- 1. extraLines: an allowlist -------------------------------------------------------------

PROGRAM_LINES = [
    "HealthCheckProgram=/tmp/x", "RebootProgram=/tmp/x", "UnkillableStepProgram=/tmp/x",
    "PlugStackConfig=/tmp/plugstack.conf", "PluginDir=/tmp", "PrologSlurmctld=/tmp/x",
    "EpilogSlurmctld=/tmp/x", "ResumeProgram=/tmp/x", "SlurmctldPrimaryOnProg=/tmp/x",
    "ResvProlog=/tmp/x", "TaskEpilog=/tmp/x", "SrunProlog=/tmp/x",
]


@pytest.mark.parametrize("line", PROGRAM_LINES)
def test_extra_lines_that_run_programs_are_refused(line):
    refused_at(minimal(slurmConfig={"extraLines": [line]}), "spec.slurmConfig.extraLines[0]", "program")


def test_a_key_outside_the_allowlist_is_refused_even_if_harmless_looking():
    refused_at(minimal(slurmConfig={"extraLines": ["AccountingStorageTRES=gres/gpu"]}),
               "spec.slurmConfig.extraLines[0]", "may not set")


@pytest.mark.parametrize("line,reason", [
    ("Waittime=5\0", "NUL"),
    ("Waittime=5\x1b[2J", "control character"),
    ("Waittime=5\u200b", "invisible"),
    ("Waittime=\u202e5", "invisible"),
    ("Waittime=5\\", "join the next line"),
    ("Waittime=5\u2028PrologSlurmctld=/x", "line break"),
    ("Waittime=5\x85PrologSlurmctld=/x", "line break"),
    ("Waittime=" + "5" * 5000, "at most 1024"),
])
def test_extra_lines_refuse_invisible_characters_a_trailing_backslash_and_length(line, reason):
    refused_at(minimal(slurmConfig={"extraLines": [line]}), "spec.slurmConfig.extraLines[0]", reason)


def test_every_allowlisted_key_is_accepted_and_written_as_given():
    lines = [f"{key}=1" for key in sorted(EXTRA_LINE_KEYS)]
    conf = config_files(load_cluster(minimal(slurmConfig={"extraLines": lines})))["slurm.conf"]
    assert all(line + "\n" in conf for line in lines)


# -- 2. the validator agrees with the CRD ---------------------------------------------------

@pytest.mark.parametrize("replicas", ["3", True, 3.0])
def test_replicas_are_not_coerced(replicas):
    refused_at(minimal(nodeSets=[{"name": "a", "replicas": replicas}]), "spec.nodeSets[0].replicas", "integer")


def test_a_bool_is_not_coerced_from_a_string():
    refused_at(minimal(restApi={"enabled": "yes"}), "spec.restApi.enabled", "true or false")


def test_an_ssh_key_longer_than_the_crd_allows_is_refused():
    doc = minimal(login={"users": [{"name": "alice", "uid": 3000, "sshPublicKeys": [KEY + "x" * 100_000]}]})
    refused_at(doc, "spec.login.users[0].sshPublicKeys[0]", "at most 16384")


def test_twenty_thousand_users_are_refused():
    users = [{"name": f"u{i}", "uid": 1000 + i % 59000, "sshPublicKeys": [KEY]} for i in range(20_000)]
    refused_at(minimal(login={"users": users}), "spec.login.users", "at most 1000")


def test_users_whose_keys_overflow_the_configmap_are_refused():
    big = "ssh-rsa " + "A" * 16000
    users = [{"name": f"u{i}", "uid": 2000 + i, "sshPublicKeys": [big] * 8} for i in range(10)]
    refused_at(minimal(login={"users": users}), "spec.login.users", "ConfigMap")


def test_the_users_estimate_bounds_the_rendered_configmap():
    users = [{"name": f"user{i}", "uid": 2000 + i, "sshPublicKeys": [KEY] * (i % 4 + 1)} for i in range(50)]
    c = load_cluster(minimal(login={"users": users}))
    cm = next(o for o in render(c, KEYS) if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "c1-users")
    actual = sum(len(k.encode()) + len(v.encode()) for k, v in cm["data"].items())
    assert actual <= users_config_bytes(c) <= USERS_CONFIG_BUDGET


def test_the_number_of_node_sets_is_capped():
    sets = [{"name": f"n{i}", "replicas": 0} for i in range(65)]
    refused_at(minimal(nodeSets=sets), "spec.nodeSets", "at most 64")


# -- 3. crashes become field-path errors ----------------------------------------------------

@pytest.mark.parametrize("memory", ["1Ei", "9Ei", "2E", "1e400", "1e-400", "-1Gi", "١٢Gi", "0.5", "1e99999999"])
def test_memory_out_of_range_is_a_field_error(memory):
    doc = minimal(nodeSets=[{"name": "a", "memory": memory}])
    try:
        c = load_cluster(doc)
    except InvalidSpec as exc:
        assert [e.path for e in exc.errors] == ["spec.nodeSets[0].memory"], exc
        return
    render(c, KEYS)  # accepted: then it must render


@pytest.mark.parametrize("metadata", ["x", None, ["a"], 5])
def test_metadata_of_the_wrong_type_is_a_field_error(metadata):
    doc = minimal()
    doc["metadata"] = metadata
    assert "metadata" in errors_at(doc)
    pol = {"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "NodeLendingPolicy", "metadata": metadata,
           "spec": {"clusterRef": {"name": "c"}, "partition": "p", "nodeSelector": {"matchLabels": {"a": "b"}}}}
    assert "metadata" in errors_at(pol, load_policy)


def test_deep_nesting_is_a_field_error():
    deep: list = []
    for _ in range(50_000):
        deep = [deep]
    for loader in (load_cluster, load_policy):
        doc = minimal(nodeSets=deep)
        found = errors_at(doc, loader)
        assert any(p.startswith("spec.nodeSets") for p in found), found
        # metadata keeps unknown keys: this one was accepted, then crashed whoever dumped it
        doc = minimal()
        doc["metadata"]["extra"] = deep
        found = errors_at(doc, loader)
        assert any(p.startswith("metadata.extra") for p in found), found


def test_a_deeply_nested_file_is_a_field_error(tmp_path):
    from slurmk8s.manifest import read_documents

    f = tmp_path / "deep.yaml"
    f.write_text("a: " + "[" * 50_000 + "]" * 50_000 + "\n")
    with pytest.raises(InvalidSpec) as info:
        read_documents(str(f))
    assert [e.path for e in info.value.errors] == ["(file)"]


@pytest.mark.parametrize("spec,path", [
    ({"slurm": {"version": "٢٣.٠٢"}}, "spec.slurm.version"),
    ({"partitions": [{"name": "p", "maxTime": "١٢"}]}, "spec.partitions[0].maxTime"),
    ({"nodeSets": [{"name": "a", "cpus": "١٢"}]}, "spec.nodeSets[0].cpus"),
    ({"controller": {"resources": {"requests": {"cpu": "١"}}}}, "spec.controller.resources.requests.cpu"),
])
def test_non_ascii_digits_are_refused(spec, path):
    refused_at(minimal(**spec), path)


def test_non_ascii_digits_in_a_lending_window_are_refused():
    pol = {"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "NodeLendingPolicy", "metadata": {"name": "p"},
           "spec": {"clusterRef": {"name": "c"}, "partition": "p", "nodeSelector": {"matchLabels": {"a": "b"}},
                    "windows": [{"start": "٠٨:٠٠", "end": "10:00"}]}}
    refused_at(pol, "spec.windows[0].start", loader=load_policy)


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\0b", "a\u2028b", "a\x85b", "a\u200bb", "a\x1bb"])
def test_error_messages_escape_control_characters_in_paths_and_values(bad):
    doc = minimal(nodeSets=[{"name": "a", "nodeSelector": {bad: "x"}}], partitions=[{"name": bad}])
    with pytest.raises(InvalidSpec) as info:
        load_cluster(doc)
    text = str(info.value)
    assert len(info.value.errors) == 2
    # The message is one line per error, and nothing in it is invisible.
    assert len(text.splitlines()) == 3, text
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u200b]", text), ascii(text)


# -- 4. names that break or collide ---------------------------------------------------------

@pytest.mark.parametrize("name", ["controller", "workers", "login", "restapi", "all", "default"])
def test_reserved_node_set_names_are_refused(name):
    refused_at(minimal(nodeSets=[{"name": name}]), "spec.nodeSets[0].name", "reserved")


def test_a_node_set_name_cannot_reach_into_another_clusters_names():
    # Cluster "a" with node set "b-controller" rendered a-b-controller, the
    # controller of cluster "a-b"; so did "a" + "b-x" and "a-b" + "x".
    refused_at(minimal(nodeSets=[{"name": "b-controller"}]), "spec.nodeSets[0].name", "no '-'")
    refused_at(minimal(nodeSets=[{"name": "b-x"}]), "spec.nodeSets[0].name", "no '-'")
    refused_at(minimal(sharedStorage={"volumes": [{"name": "b-x", "mountPath": "/s", "size": "1Gi"}]}),
               "spec.sharedStorage.volumes[0].name", "no '-'")


@pytest.mark.parametrize("name", ["default", "DEFAULT", "Default"])
def test_a_partition_named_default_is_refused(name):
    refused_at(minimal(partitions=[{"name": name}]), "spec.partitions[0].name", "defaults line")
    pol = {"apiVersion": "slurmk8s.dev/v1alpha1", "kind": "NodeLendingPolicy", "metadata": {"name": "p"},
           "spec": {"clusterRef": {"name": "c"}, "partition": name, "nodeSelector": {"matchLabels": {"a": "b"}}}}
    refused_at(pol, "spec.partition", "defaults line", loader=load_policy)


def test_a_cluster_name_must_start_with_a_letter():
    doc = minimal()
    doc["metadata"]["name"] = "9demo"
    refused_at(doc, "metadata.name", "DNS-1035")


def test_negative_memory_is_refused():
    refused_at(minimal(nodeSets=[{"name": "a", "memory": "-1Gi"}]), "spec.nodeSets[0].memory", "negative")


# -- 5. mount paths --------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/", "/var", "/var/lib", "/opt", "/usr", "/opt/slurmk8s", "/usr/local",
                                  "/var/spool/slurmd", "/etc", "/lib"])
def test_system_directories_and_their_parents_are_refused_as_mount_paths(path):
    doc = minimal(sharedStorage={"volumes": [{"name": "s", "mountPath": path, "size": "1Gi"}]})
    refused_at(doc, "spec.sharedStorage.volumes[0].mountPath", "system directory")


@pytest.mark.parametrize("path", ["/shared", "/home", "/data/team", "/scratch", "/mnt/fs"])
def test_ordinary_mount_paths_are_accepted(path):
    doc = minimal(sharedStorage={"volumes": [{"name": "s", "mountPath": path, "size": "1Gi"}]})
    assert load_cluster(doc).spec.shared_storage.volumes[0].mount_path == path


def test_every_reserved_mount_is_refused():
    for path in RESERVED_MOUNTS:
        doc = minimal(sharedStorage={"volumes": [{"name": "s", "mountPath": path, "size": "1Gi"}]})
        refused_at(doc, "spec.sharedStorage.volumes[0].mountPath", "system directory")


def test_the_largest_spec_the_caps_allow_fits_its_configmaps():
    """Node sets, partitions and extraLines at their caps, names at their longest."""
    sets = [{"name": f"n{i:02d}" + "x" * 17, "replicas": 0, "features": [f"f{j}" + "y" * 60 for j in range(32)],
             "gpus": {"type": "t" * 64, "count": 64}} for i in range(64)]
    parts = [{"name": f"p{i:02d}" + "z" * 61, "nodeSets": [s["name"] for s in sets]} for i in range(64)]
    lines = [f"{key}=" + "1" * (1024 - len(key) - 1) for key in sorted(EXTRA_LINE_KEYS)]
    doc = minimal(nodeSets=sets, partitions=parts, slurmConfig={"extraLines": lines, "maxNodeCount": 65533})
    doc["metadata"]["name"] = "c" * 20
    c = load_cluster(doc)
    for cm in (o for o in render(c, KEYS) if o["kind"] == "ConfigMap"):
        size = sum(len(k.encode()) + len(v.encode()) for k, v in cm["data"].items())
        assert size <= 1 << 20, (cm["metadata"]["name"], size)
