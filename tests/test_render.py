"""The renderer: spec -> Slurm config text and Kubernetes objects, purely.

Over 500 lines because the renderer is one pure function over the whole spec; its cases
share the fixtures here.
"""

from __future__ import annotations

import base64
import copy
import os
import re
import struct
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import kubernetes_validate
import pytest

from slurmk8s import versions
from slurmk8s.api import load_cluster
from slurmk8s.api.crd import dump_yaml
from slurmk8s.api.validate import OWNED_KEYS
from slurmk8s.operator.workers import OPERATOR_DRAINS
from slurmk8s.render import ClusterKeys, TopologyNode, config_files, config_hash, names, render
from slurmk8s.render.config import (
    GPU_FILES,
    PROLOG_SLURMCTLD,
    PROLOG_SLURMCTLD_FILE,
    STATE_DIR,
    TASK_PROLOG,
    render_template,
)
from slurmk8s.render.manifests import lent_slurmd_pod
from slurmk8s.render.pods import ROOT_CAPABILITIES
from slurmk8s.render.slurmd import TERMINATING_DRAIN_REASON
from slurmk8s.slurm.checkpoints import job_dir
from slurmk8s.slurm.model import POD_TERMINATING

from .conftest import minimal

K8S_VERSIONS = sorted({"1.29.0", kubernetes_validate.latest_version()})
#: A release whose topology/tree places dynamic nodes (spec.topology is refused on the others).
TOPOLOGY_RELEASE = next(r.version for r in versions.RELEASES.values() if r.topology_places_dynamic_nodes)
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop"


def by_kind(objs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def slurm_conf(objs: list[dict]) -> str:
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-slurm-config"))
    return cm["data"]["slurm.conf"]


def conf_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_example_renders_every_component(doc, keys):
    objs = by_kind(render(load_cluster(doc), keys))
    expected = {
        ("ConfigMap", "demo-slurm-config"), ("ConfigMap", "demo-users"),
        ("Secret", "demo-munge-key"), ("Secret", "demo-ssh-host-keys"), ("Secret", "demo-agent-token"),
        ("PersistentVolumeClaim", "demo-shared"),
        ("Service", "demo-controller"), ("StatefulSet", "demo-controller"),
        ("Service", "demo-workers"), ("StatefulSet", "demo-cpu"), ("StatefulSet", "demo-gpu"),
        ("PodDisruptionBudget", "demo-cpu-busy"), ("PodDisruptionBudget", "demo-gpu-busy"),
        ("Service", "demo-login"), ("Deployment", "demo-login"),
        # spec.accounting: the managed MariaDB and slurmdbd.
        ("Secret", "demo-db-password"), ("Service", "demo-mariadb"), ("StatefulSet", "demo-mariadb"),
        ("ConfigMap", "demo-slurmdbd-config"), ("Service", "demo-slurmdbd"), ("Deployment", "demo-slurmdbd"),
        # spec.network.policies: each component's traffic.
        ("NetworkPolicy", "demo-controller"), ("NetworkPolicy", "demo-workers"), ("NetworkPolicy", "demo-login"),
        ("NetworkPolicy", "demo-slurmdbd"), ("NetworkPolicy", "demo-mariadb"),
    }
    assert set(objs) == expected
    ctld = objs[("StatefulSet", "demo-controller")]["spec"]
    assert ctld["replicas"] == 1
    assert ctld["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert "readinessProbe" in ctld["template"]["spec"]["containers"][0]
    for svc in ("demo-controller", "demo-workers"):
        assert objs[("Service", svc)]["spec"]["clusterIP"] == "None"
    gpu = objs[("StatefulSet", "demo-gpu")]["spec"]
    assert gpu["replicas"] == 2 and gpu["serviceName"] == "demo-workers"
    container = gpu["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["SLURMK8S_NODE_CONF"] == "CPUs=2 RealMemory=4096 Gres=gpu:h100:4 Feature=gpu"
    assert env["SLURMK8S_CONTROLLER"] == "demo-controller-0.demo-controller.default.svc.cluster.local"
    # memory + 512Mi; the CPUs slurm.conf says
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "4", "memory": "4608Mi", "cpu": "2"}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    # A GPU worker reads the config files with a gres.conf its entrypoint
    # completes with the devices its pod was given; CPU workers are configless.
    assert "/shared" in mounts and "/etc/slurm" in mounts
    assert env["SLURMK8S_GRES_CONF"].splitlines()[-1] == f"Name=gpu Type=h100 File={GPU_FILES}"
    cpu = objs[("StatefulSet", "demo-cpu")]["spec"]["template"]["spec"]["containers"][0]
    assert "/etc/slurm" not in {m["mountPath"] for m in cpu["volumeMounts"]}
    assert "SLURMK8S_GRES_CONF" not in {e["name"] for e in cpu["env"]}
    assert env["SLURMK8S_CHECKPOINT_ROOT"] == "/shared/checkpoints"
    login = objs[("Deployment", "demo-login")]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "SLURMK8S_SHARED_DIRS", "value": "/shared"} in login["env"]


def test_slurm_conf_has_what_configless_dynamic_nodes_need(doc, keys):
    conf = slurm_conf(render(load_cluster(doc), keys))
    lines = conf_lines(conf)
    assert "SelectType=select/cons_tres" in lines
    assert "TreeWidth=65533" in lines
    assert "MaxNodeCount=1024" in lines
    assert any(re.fullmatch(r"SlurmctldParameters=(\S+,)?enable_configless(,\S+)?", x) for x in lines)
    assert "NodeSet=gpu Feature=gpu" in lines
    assert not any(x.startswith("NodeName=") for x in lines)
    part = next(x for x in lines if x.startswith("PartitionName=gpu "))
    assert " Nodes=gpu,lent_gpu " in part and " GraceTime=60 " in part  # the example accepts lent nodes
    assert "NodeSet=lent_gpu Feature=lent_gpu" in lines and " PreemptMode=REQUEUE " in part


@pytest.mark.parametrize("version", versions.SUPPORTED)
def test_version_specific_settings_follow_the_version_table(doc, keys, version):
    doc["spec"]["slurm"]["version"] = version
    release = versions.release(version)
    conf = slurm_conf(render(load_cluster(doc), keys))
    settings = dict(line.split("=", 1) for line in conf_lines(conf) if "=" in line and " " not in line)
    key, value = release.preempt_user_signal
    assert value in settings[key].split(",")
    other = {"SlurmctldParameters", "PreemptParameters"} - {key}
    assert all(value not in settings.get(k, "") for k in other)
    assert settings["SelectType"] == release.select_type
    assert settings["AuthType"] in release.auth_types
    assert f"(Slurm {version})" in conf.splitlines()[0]


def test_the_two_ways_of_sending_the_users_signal_both_occur():
    """The table is not uniform by accident: releases differ where the notes say they do."""
    assert {r.preempt_user_signal for r in versions.RELEASES.values()} == {
        ("SlurmctldParameters", "preempt_send_user_signal"), ("PreemptParameters", "send_user_signal")}


@pytest.mark.parametrize("version", versions.SUPPORTED)
def test_slurmrestd_loads_the_plugins_of_its_release(doc, keys, version):
    doc["spec"]["slurm"]["version"] = version
    doc["spec"]["restApi"] = {"enabled": True}
    release = versions.release(version)
    objs = by_kind(render(load_cluster(doc), keys))
    container = objs[("Deployment", "demo-restapi")]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["SLURMK8S_RESTD_OPENAPI"] == release.rest_openapi_plugin
    assert env.get("SLURMK8S_RESTD_DATA_PARSER") == release.rest_data_parser
    assert container["image"] == f"ghcr.io/slurmk8s/slurmrestd:{version}"


@pytest.mark.parametrize("version", versions.SUPPORTED)
def test_slurmctld_is_probed_over_http_where_it_serves_probes(doc, keys, version):
    doc["spec"]["slurm"]["version"] = version
    objs = by_kind(render(load_cluster(doc), keys))
    ctld = objs[("StatefulSet", "demo-controller")]["spec"]["template"]["spec"]["containers"][0]
    assert ctld["name"] == "slurmctld"
    if versions.release(version).ctld_http_probes:
        assert ctld["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "slurmctld"}
        assert ctld["startupProbe"]["httpGet"] == {"path": "/readyz", "port": "slurmctld"}
        assert ctld["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "slurmctld"}
    else:  # the entrypoint's `scontrol ping`; nothing restarts slurmctld
        assert ctld["readinessProbe"]["exec"]["command"][-1] == "ready"
        assert "livenessProbe" not in ctld


def test_no_preemption_means_no_preempt_settings(keys):
    conf = slurm_conf(render(load_cluster(minimal(partitions=[{"name": "p"}])), keys))
    assert "Preempt" not in conf
    # The only partition becomes the default, so jobs without -p have a home.
    assert "PartitionName=p Default=YES" in conf


def test_same_input_gives_byte_identical_output(example_doc, keys):
    first = dump_yaml(render(load_cluster(example_doc), keys))
    second = dump_yaml(render(load_cluster(dict(example_doc)), keys))
    assert first == second
    assert len(first) > 5000


def test_every_object_carries_labels_and_the_config_hash(doc, keys):
    c = load_cluster(doc)
    objs = render(c, keys)
    files = by_kind(objs)[("ConfigMap", "demo-slurm-config")]["data"]
    chash = config_hash(files)
    for o in objs:
        meta = o["metadata"]
        for label in ("name", "instance", "component", "part-of", "managed-by", "version"):
            assert f"app.kubernetes.io/{label}" in meta["labels"], (o["kind"], meta["name"], label)
        assert meta["annotations"][names.CONFIG_HASH] == chash
        assert meta["namespace"] == "default"


def test_a_config_change_changes_the_hash_and_leaves_keys_alone(doc, keys):
    before = by_kind(render(load_cluster(doc), keys))
    doc["spec"]["slurmConfig"]["killWait"] = 45
    after = by_kind(render(load_cluster(doc), keys))
    hash_of = lambda objs: objs[("ConfigMap", "demo-slurm-config")]["metadata"]["annotations"][names.CONFIG_HASH]  # noqa: E731 - a one-line accessor
    assert hash_of(before) != hash_of(after)
    secret = ("Secret", "demo-munge-key")
    assert before[secret]["data"] == after[secret]["data"]
    # Pod templates carry no config hash: a config change is applied by
    # `scontrol reconfigure`, not by restarting pods. The workers' grace
    # period follows killWait, but their restart hash leaves it out.
    controller = ("StatefulSet", "demo-controller")
    assert before[controller]["spec"]["template"] == after[controller]["spec"]["template"]
    worker = lambda objs: objs[("StatefulSet", "demo-gpu")]["spec"]["template"]  # noqa: E731 - a one-line accessor
    grace = lambda objs: worker(objs)["spec"]["terminationGracePeriodSeconds"]  # noqa: E731 - a one-line accessor
    assert grace(after) - grace(before) == 45 - 30
    assert worker(before)["metadata"]["annotations"] == worker(after)["metadata"]["annotations"]
    for key in (controller, ("StatefulSet", "demo-gpu")):
        assert names.CONFIG_HASH not in str(after[key]["spec"]["template"].get("metadata", {}))
    # Anything else in a worker's template is a restart.
    doc["spec"]["nodeSets"][-1]["memory"] = "2Gi"
    changed = by_kind(render(load_cluster(doc), keys))
    assert worker(changed)["metadata"]["annotations"][names.RESTART_HASH] != \
        worker(after)["metadata"]["annotations"][names.RESTART_HASH]


def test_munge_key_secret_is_immutable_and_holds_the_given_key(doc):
    keys = ClusterKeys.generate()
    secret = by_kind(render(load_cluster(doc), keys))[("Secret", "demo-munge-key")]
    assert secret["immutable"] is True
    assert secret["metadata"]["annotations"][names.CREATE_ONLY] == "true"
    assert base64.b64decode(secret["data"]["munge.key"]) == keys.munge_key
    assert len(keys.munge_key) == 1024
    assert ClusterKeys.generate().munge_key != keys.munge_key


def test_owner_references_follow_the_uid_and_retained_claims_have_none(doc, keys):
    doc["metadata"]["uid"] = "0b5e2c6e-1111-4c2b-9c57-3a9a4d3c2e01"
    objs = render(load_cluster(doc), keys)
    for o in objs:
        refs = o["metadata"].get("ownerReferences")
        if o["kind"] == "PersistentVolumeClaim":
            assert refs is None  # deletionPolicy Retain: never garbage-collected
        else:
            assert refs and refs[0]["uid"] == doc["metadata"]["uid"] and refs[0]["kind"] == "SlurmCluster"
    doc["spec"]["deletionPolicy"] = "Delete"
    pvc = by_kind(render(load_cluster(doc), keys))[("PersistentVolumeClaim", "demo-shared")]
    assert pvc["metadata"]["ownerReferences"][0]["uid"] == doc["metadata"]["uid"]


def test_the_slurm_agent_runs_beside_slurmctld_with_its_token(doc):
    keys = ClusterKeys.generate()
    c = load_cluster(doc)
    objs = by_kind(render(c, keys))
    secret = objs[("Secret", "demo-agent-token")]
    assert secret["immutable"] is True and secret["metadata"]["annotations"][names.CREATE_ONLY] == "true"
    assert base64.b64decode(secret["data"]["token"]) == keys.agent_token
    assert re.fullmatch(rb"[0-9a-f]{64}", keys.agent_token)

    pod = objs[("StatefulSet", "demo-controller")]["spec"]["template"]["spec"]
    ctld, agent = pod["containers"]
    assert ctld["name"] == "slurmctld"  # the first container stays slurmctld
    assert agent["image"] == f"ghcr.io/slurmk8s/controller:{c.spec.slurm.version}"  # the cluster's own release
    assert agent["args"][:3] == ["agent", "--listen", f"0.0.0.0:{names.AGENT_PORT}"]
    assert agent["securityContext"]["runAsUser"] == 0  # the entrypoint starts munged as root
    mounts = {m["mountPath"]: m["name"] for m in agent["volumeMounts"]}
    assert mounts == {"/etc/slurm": "slurm-config", "/run/slurmk8s/munge": "munge-key",
                      "/run/slurmk8s/agent": "agent-token", "/shared": "shared-shared"}
    # The shared volume with the checkpoint directory, read-only: the bridge
    # reads published model versions through the agent.
    assert next(m for m in agent["volumeMounts"] if m["mountPath"] == "/shared")["readOnly"] is True
    assert agent["args"][agent["args"].index("--checkpoint-root") + 1] == c.spec.shared_storage.checkpoint_dir
    assert not any(m["mountPath"] == "/shared" for m in ctld["volumeMounts"])
    token_file = agent["args"][agent["args"].index("--token-file") + 1]
    assert token_file == "/run/slurmk8s/agent/token"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["agent-token"]["secret"]["secretName"] == "demo-agent-token"
    assert agent["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "agent"}
    ports = objs[("Service", "demo-controller")]["spec"]["ports"]
    assert {"name": "agent", "port": names.AGENT_PORT, "targetPort": "agent"} in ports


def test_worker_pods_are_restarted_by_the_operator_not_the_statefulset_controller(doc, keys):
    objs = render(load_cluster(doc), keys)
    workers = [o for o in objs if o["kind"] == "StatefulSet" and names.NODESET_LABEL in o["metadata"]["labels"]]
    assert len(workers) == 2
    for sts in workers:
        assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}


def test_keys_are_read_back_from_their_secrets_and_only_missing_ones_are_generated(doc):
    from slurmk8s.render.keys import BadKeySecret, keys_from_secrets

    c = load_cluster({**doc, "metadata": {**doc["metadata"], "uid": "c0ffee00-0000-4000-8000-000000000001"}})
    first, second = ClusterKeys.generate(), ClusterKeys.generate()
    secrets = {o["metadata"]["name"]: o for o in render(c, first) if o["kind"] == "Secret"}
    # restApi is off, so no JWT Secret exists, and none is needed: no key is generated.
    made: list[str] = []
    keys, missing = keys_from_secrets(c, secrets, lambda name: made.append(name) or b"new")
    assert missing == [] and made == [] and keys.jwt_key == b""
    assert (keys.munge_key, keys.ssh_host_key, keys.agent_token) == \
        (first.munge_key, first.ssh_host_key, first.agent_token)
    # Rendering with the keys read back gives the same Secrets: nothing to replace.
    again = {o["metadata"]["name"]: o for o in render(c, keys) if o["kind"] == "Secret"}
    assert again == secrets
    keys, missing = keys_from_secrets(c, {}, second)
    # The example keeps accounting on: the database password is a key it needs.
    assert keys == replace(second, jwt_key=b"") and len(missing) == 4
    # With slurmrestd the JWT key is used: only that one comes from `fresh`.
    doc["spec"]["restApi"] = {"enabled": True}
    rest = load_cluster({**doc, "metadata": {**doc["metadata"], "uid": c.metadata.uid}})
    keys, missing = keys_from_secrets(rest, secrets, lambda name: made.append(name) or b"new")
    assert missing == ["demo-jwt-key"] and made == ["jwt_key"] and keys.jwt_key == b"new"

    broken = dict(secrets)
    broken["demo-munge-key"] = {**secrets["demo-munge-key"], "data": {}}
    with pytest.raises(BadKeySecret, match="Secret demo-munge-key exists but has no 'munge.key' key"):
        keys_from_secrets(c, broken, second)


@pytest.mark.parametrize("tamper", ["planted", "other-owner", "labels-only", "not-controller"])
def test_a_key_secret_the_cluster_does_not_own_is_refused_not_adopted(doc, tamper):
    """Issue 13, item 9: a pre-planted <cluster>-munge-key was mounted. A key
    Secret is used only if it is labelled for the cluster and its controller
    ownerReference is this SlurmCluster (by uid); else the round refuses it,
    saying what to do, and it is never overwritten."""
    from slurmk8s.render.keys import BadKeySecret, ForeignKeySecret, keys_from_secrets

    doc = {**doc, "metadata": {**doc["metadata"], "uid": "c0ffee00-0000-4000-8000-000000000001"}}
    c = load_cluster(doc)
    secrets = {o["metadata"]["name"]: o for o in render(c, ClusterKeys.generate()) if o["kind"] == "Secret"}
    keys_from_secrets(c, secrets, ClusterKeys.generate())  # its own Secrets are read back
    planted = copy.deepcopy(secrets["demo-munge-key"])
    meta = planted["metadata"]
    if tamper == "planted":
        planted["metadata"] = {"name": "demo-munge-key", "namespace": meta["namespace"]}
    elif tamper == "other-owner":
        meta["ownerReferences"][0]["uid"] = "c0ffee00-0000-4000-8000-00000000dead"
    elif tamper == "labels-only":
        del meta["ownerReferences"]
    else:
        meta["ownerReferences"][0]["controller"] = False
    with pytest.raises(ForeignKeySecret) as refused:
        keys_from_secrets(c, {**secrets, "demo-munge-key": planted}, ClusterKeys.generate())
    assert isinstance(refused.value, BadKeySecret)
    message = str(refused.value)
    assert "Secret demo-munge-key" in message and "not created by slurmk8s" in message
    assert "kubectl -n default delete secret demo-munge-key" in message


def test_a_cluster_without_a_uid_owns_no_key_secret(doc):
    """Without the uid nothing proves ownership: fail closed."""
    from slurmk8s.render.keys import ForeignKeySecret, keys_from_secrets

    c = load_cluster(doc)
    secrets = {o["metadata"]["name"]: o for o in render(c, ClusterKeys.generate()) if o["kind"] == "Secret"}
    with pytest.raises(ForeignKeySecret):
        keys_from_secrets(c, secrets, ClusterKeys.generate())
    assert keys_from_secrets(c, {}, ClusterKeys.generate())[1]  # none there: all generated


def test_the_clusters_gres_conf_names_no_device_each_gpu_slurmd_has_its_own(doc, keys):
    c = load_cluster(doc)
    # No gres.conf can name a pod's devices before the device plugin picks them.
    assert conf_lines(config_files(c)["gres.conf"]) == []
    gpu = next(o for o in render(c, keys) if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "demo-gpu")
    env = {e["name"]: e["value"] for e in gpu["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert conf_lines(env["SLURMK8S_GRES_CONF"]) == [f"Name=gpu Type=h100 File={GPU_FILES}"]
    assert env["SLURMK8S_GPU_COUNT"] == "4"


def test_topology_conf_is_built_from_node_labels(keys):
    c = load_cluster(minimal(slurm={"version": TOPOLOGY_RELEASE},
                             topology={"labelKeys": ["net/spine", "net/leaf"]}))
    nodes = [
        TopologyNode("c1-gpu-0", {"net/spine": "s1", "net/leaf": "l1"}),
        TopologyNode("c1-gpu-1", {"net/spine": "s1", "net/leaf": "l2"}),
        TopologyNode("c1-gpu-2", {"net/spine": "s2", "net/leaf": "l3"}),
        TopologyNode("c1-cpu-0", {}),
    ]
    lines = conf_lines(config_files(c, nodes)["topology.conf"])
    assert "SwitchName=sw-root Switches=sw-unlabelled-1,sw_s1,sw_s2" in lines
    assert "SwitchName=sw_s1 Switches=sw_s1_l1,sw_s1_l2" in lines
    assert "SwitchName=sw_s1_l1 Nodes=c1-gpu-0" in lines
    assert "SwitchName=sw-unlabelled-1 Switches=sw-unlabelled-2" in lines
    assert "SwitchName=sw-unlabelled-2 Nodes=c1-cpu-0" in lines
    assert "TopologyPlugin=topology/tree" in config_files(c, nodes)["slurm.conf"]


def test_users_are_rendered_with_the_same_ids_for_every_pod(keys):
    c = load_cluster(minimal(login={"users": [
        {"name": "alice", "uid": 2001, "sshPublicKeys": [KEY]},
        {"name": "bob", "uid": 2002, "gid": 2001, "sshPublicKeysFrom": {"name": "bob-keys", "key": "keys"}},
    ]}))
    objs = by_kind(render(c, keys))
    users = objs[("ConfigMap", "c1-users")]["data"]
    assert users["passwd"] == "alice:x:2001:2001::/home/alice:/bin/bash\nbob:x:2002:2001::/home/bob:/bin/bash\n"
    assert users["group"] == "alice:x:2001:\n"
    assert users["alice.authorized_keys"] == KEY + "\n"
    login = objs[("Deployment", "c1-login")]["spec"]["template"]["spec"]
    projected = next(v for v in login["volumes"] if v["name"] == "user-keys")["projected"]
    assert projected["sources"][0]["secret"] == {"name": "bob-keys", "items": [{"key": "keys", "path": "bob"}]}
    for kind, name in (("StatefulSet", "c1-controller"), ("Deployment", "c1-login")):
        vols = objs[(kind, name)]["spec"]["template"]["spec"]["volumes"]
        assert {"name": "users", "configMap": {"name": "c1-users"}} in vols


def test_rest_api_adds_jwt_auth_and_its_workload(doc, keys):
    doc["spec"]["restApi"] = {"enabled": True}
    objs = by_kind(render(load_cluster(doc), keys))
    assert ("Deployment", "demo-restapi") in objs and ("Secret", "demo-jwt-key") in objs
    conf = conf_lines(objs[("ConfigMap", "demo-slurm-config")]["data"]["slurm.conf"])
    assert "AuthAltTypes=auth/jwt" in conf
    pod = objs[("Deployment", "demo-restapi")]["spec"]["template"]["spec"]
    assert pod["containers"][0]["securityContext"]["runAsNonRoot"] is True


def test_slurm_conf_writes_only_keys_the_api_reserves(doc, keys):
    """Every key the template can write must be refused in extraLines."""
    doc["spec"]["restApi"] = {"enabled": True}
    doc["spec"]["accounting"] = {"enabled": True, "fairShare": {}}
    doc["spec"]["topology"] = {"labelKeys": ["net/leaf"]}
    doc["spec"]["slurm"]["version"] = TOPOLOGY_RELEASE
    doc["spec"]["slurmConfig"].update(
        selectTypeParameters="CR_Core_Memory", defMemPerCPU=1024, cgroups=True,
        extraLines=["SchedulerTimeSlice=60"],
    )
    for p in doc["spec"]["partitions"]:
        p.pop("acceptLentNodes", None)  # lent nodes and cgroups do not mix
    conf = slurm_conf(render(load_cluster(doc), keys))
    written = {line.split("=", 1)[0].lower() for line in conf_lines(conf)}
    assert written - {"schedulertimeslice"} <= OWNED_KEYS
    assert "SchedulerTimeSlice=60" in conf_lines(conf)


@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
def test_every_object_validates_against_the_official_kubernetes_schemas(doc, keys, k8s_version):
    doc["spec"]["restApi"] = {"enabled": True}
    doc["spec"]["accounting"] = {"enabled": True}
    doc["spec"]["login"]["replicas"] = 2
    doc["spec"]["login"]["users"][0]["sshPublicKeys"] = [KEY]
    doc["metadata"]["uid"] = "0b5e2c6e-1111-4c2b-9c57-3a9a4d3c2e01"
    objs = render(load_cluster(doc), keys)
    assert len(objs) >= 18
    for o in objs:
        kubernetes_validate.validate(o, k8s_version, strict=True)


def test_partitions_that_accept_lent_nodes_get_a_lent_node_set(keys):
    c = load_cluster(minimal(
        nodeSets=[{"name": "cpu"}],
        partitions=[{"name": "cpu", "nodeSets": ["cpu"]},
                    {"name": "burst.v1", "acceptLentNodes": True},
                    {"name": "mixed", "nodeSets": ["cpu"], "acceptLentNodes": True}],
    ))
    lines = conf_lines(config_files(c)["slurm.conf"])
    assert [x for x in lines if x.startswith("NodeSet=")] == [
        "NodeSet=cpu Feature=cpu",
        f"NodeSet={names.lent_nodeset('burst.v1')} Feature={names.lent_nodeset('burst.v1')}",
        f"NodeSet={names.lent_nodeset('mixed')} Feature={names.lent_nodeset('mixed')}",
    ]
    parts = {x.split()[0]: x for x in lines if x.startswith("PartitionName=")}
    assert " Nodes=cpu " in parts["PartitionName=cpu"]
    assert f" Nodes={names.lent_nodeset('burst.v1')} " in parts["PartitionName=burst.v1"]
    assert f" Nodes=cpu,{names.lent_nodeset('mixed')} " in parts["PartitionName=mixed"]
    # Lent nodes bring GPUs, though no node set has any.
    assert "GresTypes=gpu" in lines


def test_no_partition_accepting_lent_nodes_means_no_lent_node_set(keys):
    lines = conf_lines(config_files(load_cluster(minimal(partitions=[{"name": "p"}])))["slurm.conf"])
    assert not any(names.LENT_PREFIX in x for x in lines)
    assert "GresTypes=gpu" not in lines


def test_a_checkpoint_dir_adds_the_task_prolog_that_exports_it(doc, keys):
    conf = slurm_conf(render(load_cluster(doc), keys))
    assert f"TaskProlog={TASK_PROLOG}" in conf_lines(conf)
    # The TaskProlog reads the directory from this comment line (Slurm ignores it).
    assert "#slurmk8s:CheckpointDir=/shared/checkpoints" in conf.splitlines()


@pytest.mark.parametrize("storage", [None, {"volumes": [{"name": "s", "mountPath": "/s", "size": "1Gi"}]}])
def test_no_checkpoint_dir_means_no_task_prolog(keys, storage):
    spec = {"partitions": [{"name": "p"}]}
    if storage:
        spec["sharedStorage"] = storage
    conf = config_files(load_cluster(minimal(**spec)))["slurm.conf"]
    assert "TaskProlog" not in conf and "CheckpointDir" not in conf


@pytest.mark.parametrize("name, array_task, expected", [
    ("train", None, "train"),
    ("train", "7", "train_7"),
    ("../../etc x", None, "_._.._etc_x"),
    (".hidden", None, "_hidden"),
    ("", None, "job"),
    ("a" * 300, None, "a" * 128),
    ("réseau;rm -rf", "0", "r__seau_rm_-rf_0")  # bytes, whatever the locale,
])
def test_the_task_prolog_exports_a_per_user_per_job_dir(doc, keys, tmp_path, name, array_task, expected):
    """images/slurmd/task-prolog.sh against the rendered slurm.conf, as slurmstepd runs it."""
    root = tmp_path / "checkpoints"
    doc["spec"]["sharedStorage"]["volumes"][0]["mountPath"] = str(tmp_path)
    doc["spec"]["sharedStorage"]["checkpointDir"] = str(root)
    (tmp_path / "slurm.conf").write_text(slurm_conf(render(load_cluster(doc), keys)))
    (root / "researcher").mkdir(parents=True)
    env = {"PATH": os.environ["PATH"], "SLURM_CONF": str(tmp_path / "slurm.conf"),
           "SLURM_JOB_USER": "researcher", "SLURM_JOB_NAME": name, "LANG": "C.UTF-8",
           **({"SLURM_ARRAY_TASK_ID": array_task} if array_task else {})}
    script = Path(__file__).resolve().parent.parent / "images/slurmd/task-prolog.sh"
    for _ in range(2):  # a requeued job gets the same directory
        out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=True).stdout
        assert out == f"export SLURMK8S_CHECKPOINT_DIR={root}/researcher/{expected}\n"
    assert (root / "researcher" / expected).is_dir()
    assert [p.name for p in (root / "researcher").iterdir()] == [expected]
    # The agent finds the job's checkpoint directory by the same rule (slurm/checkpoints.py).
    assert job_dir("researcher", name, int(array_task) if array_task else None) == ("researcher", expected)


def test_the_task_prolog_leaves_the_variable_unset_when_it_cannot_create_the_dir(doc, keys, tmp_path):
    doc["spec"]["sharedStorage"]["volumes"][0]["mountPath"] = str(tmp_path)
    doc["spec"]["sharedStorage"]["checkpointDir"] = f"{tmp_path}/checkpoints"
    (tmp_path / "slurm.conf").write_text(slurm_conf(render(load_cluster(doc), keys)))
    (tmp_path / "checkpoints").write_text("a file where the directory should be")
    env = {"PATH": os.environ["PATH"], "SLURM_CONF": str(tmp_path / "slurm.conf"),
           "SLURM_JOB_USER": "researcher", "SLURM_JOB_NAME": "train"}
    script = Path(__file__).resolve().parent.parent / "images/slurmd/task-prolog.sh"
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0
    assert proc.stdout.startswith("print slurmk8s: cannot use the checkpoint directory")
    assert "export" not in proc.stdout


@pytest.mark.root
@pytest.mark.parametrize("squat", ["their-dir", "link-to-their-dir", "their-job-dir"])
def test_no_one_else_can_make_a_users_checkpoint_directory_first(doc, keys, squat):
    """Issue 24: on a checkpoint root others may write to (sticky, as /tmp), another user
    makes <root>/researcher (or the job's directory) before the researcher's first job: a
    directory of theirs, or a link to one. The researcher's job must not be given it."""
    if os.geteuid() != 0:
        pytest.fail("run as root (hack/test.sh): the prolog runs as two users here")
    researcher, mallory = 4242, 4343
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        base.chmod(0o755)
        root = base / "checkpoints"
        root.mkdir()
        root.chmod(0o1777)
        doc["spec"]["sharedStorage"]["volumes"][0]["mountPath"] = str(base)
        doc["spec"]["sharedStorage"]["checkpointDir"] = str(root)
        (base / "slurm.conf").write_text(slurm_conf(render(load_cluster(doc), keys)))

        def as_user(uid, *argv, env=None):
            return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv],
                                  env=env, capture_output=True, text=True)

        if squat == "their-dir":
            assert as_user(mallory, "mkdir", "-m", "0777", str(root / "researcher")).returncode == 0
        elif squat == "link-to-their-dir":
            assert as_user(mallory, "mkdir", "-m", "0777", str(root / "mallory")).returncode == 0
            assert as_user(mallory, "ln", "-s", str(root / "mallory"), str(root / "researcher")).returncode == 0
        else:  # the user's directory is theirs, but made open to all; a job directory is made in it
            assert as_user(researcher, "mkdir", "-m", "0777", str(root / "researcher")).returncode == 0
            assert as_user(mallory, "mkdir", str(root / "researcher" / "train")).returncode == 0
        env = {"PATH": os.environ["PATH"], "SLURM_CONF": str(base / "slurm.conf"),
               "SLURM_JOB_USER": "researcher", "SLURM_JOB_NAME": "train"}
        script = Path(__file__).resolve().parent.parent / "images/slurmd/task-prolog.sh"
        proc = as_user(researcher, "bash", str(script), env=env)
        assert proc.returncode == 0, proc.stderr
        assert "export" not in proc.stdout, proc.stdout
        assert proc.stdout.startswith("print slurmk8s: cannot use the checkpoint directory"), proc.stdout
        # Unsquatted, the same prolog makes and exports the researcher's own directories.
        for p in sorted(root.rglob("*"), reverse=True):
            p.unlink() if p.is_symlink() or p.is_file() else p.rmdir()
        proc = as_user(researcher, "bash", str(script), env=env)
        assert proc.stdout == f"export SLURMK8S_CHECKPOINT_DIR={root}/researcher/train\n", proc.stdout
        assert (root / "researcher" / "train").stat().st_uid == researcher


def test_slurm_pods_get_no_service_account_token_and_workers_drain_for_their_grace(doc, keys):
    """Jobs and SSH users run in these pods: a mounted token would be theirs to
    read. A worker deleted outside scale-in gives its jobs the node set's drain
    grace, and the kubelet waits for it."""
    doc["spec"]["nodeSets"][0]["drain"] = {"gracePeriod": 120}
    cluster = load_cluster(doc)
    objs = render(cluster, keys)
    templates = [o["spec"]["template"] for o in objs if o["kind"] in ("StatefulSet", "Deployment")]
    assert templates and all(t["spec"]["automountServiceAccountToken"] is False for t in templates)
    for ns in cluster.spec.node_sets:
        sts = next(o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == names.nodeset(cluster, ns.name))
        spec = sts["spec"]["template"]["spec"]
        env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
        assert env["SLURMK8S_DRAIN_TIMEOUT"] == str(ns.drain.grace_period)
        assert spec["terminationGracePeriodSeconds"] > ns.drain.grace_period + cluster.spec.slurm_config.kill_wait
    lent = lent_slurmd_pod(cluster, "h", node="n", resources=_ONE_GPU_1024, labels={}, partition="gpu",
                           shm_size="1Gi", taint_key="slurmk8s.dev/lent")
    assert lent["spec"]["automountServiceAccountToken"] is False


def test_every_slurmd_drains_its_node_with_the_reason_the_operator_knows(doc, keys):
    """The entrypoint drains a node whose pod goes away with the reason it is
    given (SLURMK8S_DRAIN_REASON), rendered from the operator's one constant:
    the reason is written once, in Python, and the script holds no copy."""
    cluster = load_cluster(doc)
    workers = {names.nodeset(cluster, ns.name) for ns in cluster.spec.node_sets}
    slurmd_pods = [o["spec"]["template"]["spec"] for o in render(cluster, keys)
                   if o["kind"] == "StatefulSet" and o["metadata"]["name"] in workers]
    slurmd_pods.append(lent_slurmd_pod(cluster, "h", node="n", resources=_ONE_GPU_1024, labels={}, partition="gpu",
                                       shm_size="1Gi", taint_key="slurmk8s.dev/lent")["spec"])
    assert len(slurmd_pods) == len(cluster.spec.node_sets) + 1
    for spec in slurmd_pods:
        env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
        assert env["SLURMK8S_DRAIN_REASON"] == TERMINATING_DRAIN_REASON
    assert TERMINATING_DRAIN_REASON in OPERATOR_DRAINS
    entrypoint = (Path(__file__).resolve().parents[1] / "images" / "slurmd" / "entrypoint.sh").read_text()
    assert POD_TERMINATING not in entrypoint and TERMINATING_DRAIN_REASON not in entrypoint
    assert 'reason="$drain_reason"' in entrypoint


#: A small lendable node (its allocatable resources), with 1 GiB or 64 GiB of memory.
_ONE_GPU_1024 = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}
_ONE_GPU_65536 = {"cpu": "1", "memory": "64Gi", "nvidia.com/gpu": "1"}


def _quantity(q: str) -> float:
    from slurmk8s.api.fields import parse_quantity
    return parse_quantity(q)


def test_slurmd_pods_have_a_memory_limit_and_a_bounded_dev_shm(doc, keys):
    """Issue 13, item 9: a job could take the Kubernetes node's memory (and
    /dev/shm, a tmpfs, with it). Workers get memoryLimit (default: memory +
    512Mi for slurmd, munged and slurmstepd) and /dev/shm shmSize."""
    doc["spec"]["nodeSets"][0].update(memory="4Gi")
    doc["spec"]["nodeSets"][1].update(memory="8Gi", memoryLimit="10Gi", shmSize="2Gi")
    cluster = load_cluster(doc)
    objs = render(cluster, keys)
    for ns, limit, shm in zip(cluster.spec.node_sets, ("4608Mi", "10Gi"), ("1Gi", "2Gi"), strict=True):
        sts = next(o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == names.nodeset(cluster, ns.name))
        spec = sts["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        assert _quantity(container["resources"]["limits"]["memory"]) == _quantity(limit)
        assert container["resources"]["requests"]["memory"] == ns.memory
        (volume,) = [v for v in spec["volumes"] if v["name"] == "shm"]
        assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": shm}
        kubernetes_validate.validate(sts, kubernetes_validate.latest_version(), strict=True)


def test_a_lent_slurmd_pod_has_a_memory_limit_and_a_bounded_dev_shm(doc):
    cluster = load_cluster(doc)
    pod = lent_slurmd_pod(cluster, "h", node="n", resources=_ONE_GPU_65536, labels={}, partition="gpu",
                          shm_size="4Gi", taint_key="slurmk8s.dev/lent")
    (container,) = pod["spec"]["containers"]
    # The memory and cpus lent, the most Slurm hands out there; a small
    # request, since the pod is bound to the node without the scheduler.
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1", "memory": "65536Mi", "cpu": "1"}
    assert container["resources"]["requests"]["memory"] == "256Mi"
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "shm"]
    assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": "4Gi"}
    kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize("cgroups", [False, True])
def test_only_slurmd_with_cgroups_is_privileged(doc, keys, cgroups):
    """Privileged only where required: slurmd creates a cgroup per job with
    cgroups on. No other container is privileged, none adds a capability
    beyond containerd's defaults (each drops the rest, NET_RAW and MKNOD
    among them) or may escalate, and a lent slurmd pod never is."""
    doc["spec"]["slurmConfig"] = {**doc["spec"].get("slurmConfig", {}), "cgroups": cgroups}
    for p in doc["spec"]["partitions"]:
        p.pop("acceptLentNodes", None)
    cluster = load_cluster(doc)
    privileged = []
    for o in render(cluster, keys):
        if o["kind"] not in ("StatefulSet", "Deployment"):
            continue
        for ctr in o["spec"]["template"]["spec"]["containers"]:
            sc = ctr.get("securityContext") or {}
            if not sc.get("privileged"):
                caps = sc["capabilities"]
                assert caps["drop"] == ["ALL"] and set(caps.get("add", ())) <= set(ROOT_CAPABILITIES)
                assert not {"NET_RAW", "MKNOD"} & set(caps.get("add", ()))
                assert sc["allowPrivilegeEscalation"] is False
            if sc.get("privileged"):
                privileged.append((o["metadata"]["name"], ctr["name"], ctr["image"]))
    workers = [names.nodeset(cluster, ns.name) for ns in cluster.spec.node_sets]
    assert privileged == ([(w, "slurmd", f"ghcr.io/slurmk8s/slurmd:{cluster.spec.slurm.version}") for w in workers]
                          if cgroups else [])
    lent = lent_slurmd_pod(cluster, "h", node="n", resources=_ONE_GPU_1024, labels={}, partition="gpu",
                           shm_size="1Gi", taint_key="slurmk8s.dev/lent")
    assert not (lent["spec"]["containers"][0].get("securityContext") or {}).get("privileged")


def test_slurmctld_runs_the_rendered_prolog_slurmctld_from_its_configmap_executable(doc, keys):
    """PrologSlurmctld names the slurm-config ConfigMap's script, which the controller pod's
    slurmctld container (and no other) mounts there with mode 0755."""
    objs = render(load_cluster(doc), keys)
    assert f"PrologSlurmctld={PROLOG_SLURMCTLD}" in conf_lines(slurm_conf(objs))
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-slurm-config"))
    assert cm["data"][PROLOG_SLURMCTLD_FILE].startswith("#!/bin/sh\n")
    found = []
    for obj in objs:
        pod = obj.get("spec", {}).get("template", {}).get("spec")
        if not pod:
            continue
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in pod["containers"]:
            for mount in container.get("volumeMounts", []):
                for source in volumes.get(mount["name"], {}).get("projected", {}).get("sources", []):
                    for item in source.get("configMap", {}).get("items", []):
                        if item["key"] == PROLOG_SLURMCTLD_FILE:
                            assert source["configMap"]["name"] == cm["metadata"]["name"]
                            found.append((container["name"], f"{mount['mountPath']}/{item['path']}", item["mode"]))
    assert found == [("slurmctld", PROLOG_SLURMCTLD, 0o755)]


def _environment_file(entries: list[bytes]) -> bytes:
    """A batch job's environment as slurmctld stores it: a native 4-byte count, then the
    entries, each NUL-terminated (job_mgr.c, _write_data_array_to_file)."""
    return struct.pack("=I", len(entries)) + b"".join(e + b"\0" for e in entries)


def _run_prolog_slurmctld(state: Path, job_id: str, array_job_id: str | None = None,
                          user: int | None = None) -> subprocess.CompletedProcess:
    """The rendered PrologSlurmctld over a state directory at ``state``, with the environment
    slurmctld gives it (job_common_env_vars), as ``user`` (default: this one)."""
    script = state.parent / "prolog-slurmctld"
    script.write_text(render_template(PROLOG_SLURMCTLD_FILE, namespace="ns", cluster="c", state_dir=str(state)))
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": job_id, "SLURM_SCRIPT_CONTEXT": "prolog_slurmctld",
           **({"SLURM_ARRAY_JOB_ID": array_job_id} if array_job_id else {})}
    user_args = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] if user is not None else []
    return subprocess.run([*user_args, "sh", str(script)], env=env, capture_output=True, text=True, timeout=10)


def _stored(state: Path, job: int, entries: list[bytes]) -> Path:
    path = state / f"hash.{job % 10}" / f"job.{job}" / "environment"
    path.parent.mkdir(parents=True)
    path.write_bytes(_environment_file(entries))
    path.chmod(0o600)
    return path


def test_the_template_renders_the_prolog_slurmctld_of_the_state_directory(doc, keys):
    files = config_files(load_cluster(doc))
    assert files[PROLOG_SLURMCTLD_FILE] == render_template(PROLOG_SLURMCTLD_FILE, namespace="default",
                                                           cluster="demo", state_dir=STATE_DIR)


GET = b"SLURM_GET_USER_ENV=1"
KEEP = b"SLURM_GET_USER_ENV=0"


@pytest.mark.parametrize("entries", [
    [b"PATH=/bin", KEEP, GET],                             # job_submit.lua rewrote the first, a second left
    [KEEP, b"PATH=/bin", GET, b"HOME=/x", GET],            # more than one left
    [GET, *[b"V%d=x" % i for i in range(8)], GET],         # ten entries: the count's first byte is a newline
    [b"F=() { echo\n}", KEEP, GET, b"G=a\n"],              # values with newlines around it
], ids=["second", "third-and-fifth", "count-is-a-newline", "multi-line-values"])
def test_the_prolog_slurmctld_turns_every_login_environment_request_left_into_0(tmp_path, entries):
    """A REST or libslurm request may name SLURM_GET_USER_ENV=1 more than once; slurmd acts on
    any such entry. Every one left in the stored environment becomes =0 before the launch,
    in place: the file keeps its count, its length, its other entries and its mode."""
    state = tmp_path / "state"
    path = _stored(state, 4711, entries)
    proc = _run_prolog_slurmctld(state, "4711")
    assert proc.returncode == 0, proc.stderr
    assert path.read_bytes() == _environment_file([KEEP if e == GET else e for e in entries])
    assert path.stat().st_mode & 0o777 == 0o600


def test_an_array_jobs_tasks_share_the_environment_of_its_master_id(tmp_path):
    state = tmp_path / "state"
    path = _stored(state, 30, [b"PATH=/bin", KEEP, GET])
    proc = _run_prolog_slurmctld(state, "33", array_job_id="30")
    assert proc.returncode == 0, proc.stderr
    assert path.read_bytes() == _environment_file([b"PATH=/bin", KEEP, KEEP])
    # The next task finds nothing left to do.
    assert _run_prolog_slurmctld(state, "34", array_job_id="30").returncode == 0
    assert path.read_bytes() == _environment_file([b"PATH=/bin", KEEP, KEEP])


@pytest.mark.parametrize("entries", [
    [b"PATH=/bin", KEEP],
    [b"PATH=/bin", b"SLURM_GET_USER_ENV=10", b"XSLURM_GET_USER_ENV=1", b"SLURM_GET_USER_ENV=1 ",
     b"A=x\nSLURM_GET_USER_ENV=1", b"SLURM_GET_USER_ENV=1\nB=y"],
    [],
], ids=["none", "only-look-alikes", "empty"])
def test_the_prolog_slurmctld_leaves_any_other_environment_alone(tmp_path, entries):
    """Entries slurmd does not read as the request (it compares whole entries) are not
    touched, nor is the file: no rewrite, the same inode, per job only a read."""
    state = tmp_path / "state"
    path = _stored(state, 12, entries)
    before = path.stat()
    proc = _run_prolog_slurmctld(state, "12")
    assert proc.returncode == 0, proc.stderr
    assert path.read_bytes() == _environment_file(entries)
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.mark.parametrize("job_id", ["99", "", "1;x", "../1"])
def test_a_job_without_a_stored_environment_passes(tmp_path, job_id):
    """salloc and srun jobs have no environment file; nothing blocks them."""
    (tmp_path / "state").mkdir()
    proc = _run_prolog_slurmctld(tmp_path / "state", job_id)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr


@pytest.mark.root
def test_a_rewrite_that_fails_keeps_the_job_from_launching(tmp_path):
    """Fail closed: when the entry cannot be rewritten, the script exits non-zero, and
    slurmctld requeues the job instead of sending it to a slurmd it would end."""
    if os.geteuid() != 0:
        pytest.fail("run as root (hack/test.sh): the script runs as another user here")
    state = tmp_path / "state"
    path = _stored(state, 5, [b"PATH=/bin", KEEP, GET])
    path.chmod(0o644)  # readable, in a directory nobody may not write to
    tmp_path.chmod(0o755)
    proc = _run_prolog_slurmctld(state, "5", user=65534)
    assert proc.returncode != 0
    assert path.read_bytes() == _environment_file([b"PATH=/bin", KEEP, GET])
