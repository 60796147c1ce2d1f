"""The runc runtime's pure part: a planned container and its image's config
as the OCI runtime spec runc runs (sandbox/oci.py)."""

from __future__ import annotations

import pytest

from sandbox import gpus, oci
from sandbox.images import ImageConfig
from sandbox.plan import ContainerPlan, Mount, pod_plan

IMAGE = ImageConfig(entrypoint=("/usr/local/bin/slurmk8s-entrypoint",), cmd=("serve",),
                    env=("PATH=/usr/local/sbin:/usr/bin:/bin", "LANG=C.UTF-8"), working_dir="/srv", user="slurm")
PASSWD = "root:x:0:0:root:/root:/bin/bash\nslurm:x:64030:64030::/nonexistent:/usr/sbin/nologin\n"
GROUP = "root:x:0:\nslurm:x:64030:\nmunge:x:101:slurm\nvideo:x:44:other\n"
NS = oci.Namespaces("/var/run/netns/sk8s-abc-pod", 4242)


def spec(c: ContainerPlan, image: ImageConfig = IMAGE, mounts=(), gpus: tuple[int, ...] = ()) -> dict:
    return oci.container_spec(c, image, root="/state/pods/p/containers/0/rootfs", hostname="pod-0", ns=NS,
                              hosts_file="/state/hosts", hostname_file="/state/pods/p/hostname",
                              mounts=list(mounts), gpus=gpus, cgroups_path="/slurmk8s/p/0",
                              passwd=PASSWD, group=GROUP)


def ctr(**kw) -> ContainerPlan:
    return ContainerPlan(name="main", image="ghcr.io/slurmk8s/slurmctld:22.05", **kw)


def test_the_image_runs_as_its_config_says_with_the_containers_env_over_it():
    s = spec(ctr(env={"LANG": "en_US.UTF-8", "SLURMK8S_CONTROLLER": "ctl"}))
    p = s["process"]
    assert p["args"] == ["/usr/local/bin/slurmk8s-entrypoint", "serve"]
    assert p["env"] == ["PATH=/usr/local/sbin:/usr/bin:/bin", "LANG=en_US.UTF-8", "HOSTNAME=pod-0",
                        "SLURMK8S_CONTROLLER=ctl"]
    assert p["cwd"] == "/srv"
    # The image's USER by name, from its /etc/passwd; /etc/group adds munge.
    assert p["user"] == {"uid": 64030, "gid": 64030, "additionalGids": [101]}
    assert s["root"] == {"path": "/state/pods/p/containers/0/rootfs", "readonly": False}


def test_command_replaces_entrypoint_and_cmd_args_replace_cmd():
    assert spec(ctr(command=["slurmctld", "-V"]))["process"]["args"] == ["slurmctld", "-V"]
    assert spec(ctr(container_args=["ready"]))["process"]["args"] == ["/usr/local/bin/slurmk8s-entrypoint", "ready"]
    assert spec(ctr(command=["sh", "-c"], container_args=["echo $(X)"], env={"X": "1"}))["process"]["args"] == \
        ["sh", "-c", "echo 1"]


def test_run_as_user_and_group_override_the_image_user():
    p = spec(ctr(security={"runAsUser": 0, "runAsGroup": 0}))["process"]
    assert p["user"] == {"uid": 0, "gid": 0}
    p = spec(ctr(security={"runAsUser": 1000, "supplementalGroups": [5], "fsGroup": 7}))["process"]
    assert p["user"] == {"uid": 1000, "gid": 0, "additionalGids": [5, 7]}
    with pytest.raises(oci.SpecError, match="runAsNonRoot"):
        spec(ctr(security={"runAsUser": 0, "runAsNonRoot": True}))
    with pytest.raises(oci.SpecError, match="not in its /etc/passwd"):
        spec(ctr(), image=ImageConfig(entrypoint=("x",), user="nobody-here"))


def test_the_container_joins_the_pods_network_and_the_pauses_namespaces():
    ns = {n["type"]: n.get("path") for n in spec(ctr())["linux"]["namespaces"]}
    assert ns == {"network": "/var/run/netns/sk8s-abc-pod", "uts": "/proc/4242/ns/uts",
                  "ipc": "/proc/4242/ns/ipc", "pid": "/proc/4242/ns/pid", "mount": None}
    pause = oci.pause_spec(root="/img/rootfs", hostname="pod-0", net="/var/run/netns/x", cgroups_path="/s/p")
    assert pause["hostname"] == "pod-0" and pause["root"]["readonly"] is True
    assert {n["type"]: n.get("path") for n in pause["linux"]["namespaces"]} == {
        "network": "/var/run/netns/x", "uts": None, "ipc": None, "pid": None, "mount": None}


def test_mounts_kernel_filesystems_hosts_hostname_and_volumes():
    vols = [Mount("bind", "/state/pods/p/volumes/cfg", "/etc/slurm", read_only=True),
            Mount("bind", "/state/storage/claims/ns/state", "/var/spool/slurmctld"),
            Mount("tmpfs", "tmpfs", "/dev/shm", mode="1777", size=2**30)]
    mounts = {m["destination"]: m for m in spec(ctr(), mounts=vols)["mounts"]}
    assert [d for d in mounts] == ["/proc", "/dev", "/dev/pts", "/dev/mqueue", "/sys", "/sys/fs/cgroup",
                                   "/etc/hosts", "/etc/hostname", "/etc/slurm", "/var/spool/slurmctld", "/dev/shm"]
    assert mounts["/sys"]["options"][-1] == "ro" and mounts["/sys/fs/cgroup"]["type"] == "cgroup"
    assert mounts["/etc/hosts"] == {"destination": "/etc/hosts", "type": "bind", "source": "/state/hosts",
                                    "options": ["rbind", "rprivate", "ro"]}
    assert mounts["/etc/slurm"]["options"][-1] == "ro" and mounts["/var/spool/slurmctld"]["options"][-1] == "rw"
    assert f"size={2**30}" in mounts["/dev/shm"]["options"]  # the emptyDir's sizeLimit, not the default 64 MiB
    with pytest.raises(oci.SpecError, match="absolute"):
        spec(ctr(), mounts=[Mount("bind", "volumes/x", "/x")])


def test_gpus_are_the_hosts_devices_under_their_own_numbers_and_the_cgroup_allows_only_those():
    # GPUs 4 and 6 of the node, as the device plugin hands them over.
    s = spec(ctr(), gpus=(4, 6))
    char = {d["path"]: (d["type"], d["major"], d["minor"]) for d in s["linux"]["devices"]}
    assert char == {"/dev/nvidia4": ("c", 195, 4), "/dev/nvidia6": ("c", 195, 6), "/dev/nvidiactl": ("c", 195, 255),
                    "/dev/nvidia-uvm": ("c", 238, 0), "/dev/nvidia-uvm-tools": ("c", 238, 1)}
    rules = s["linux"]["resources"]["devices"]
    assert rules[0] == {"allow": False, "access": "rwm"}
    assert {(r["major"], r["minor"]) for r in rules[1:]} == {c[1:] for c in char.values()}
    assert all(r["allow"] and r["access"] == "rwm" for r in rules[1:])
    env = s["process"]["env"]
    assert [e for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES=")] == ["NVIDIA_VISIBLE_DEVICES=4,6"]
    # The device plugin's value wins over the image's (CUDA images say "all").
    cuda = ImageConfig(entrypoint=IMAGE.entrypoint, env=(*IMAGE.env, "NVIDIA_VISIBLE_DEVICES=all"))
    env = spec(ctr(), cuda, gpus=(1,))["process"]["env"]
    assert [e for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES=")] == ["NVIDIA_VISIBLE_DEVICES=1"]
    # No GPUs: no devices, nothing allowed.
    none = spec(ctr())
    assert none["linux"]["devices"] == [] and none["linux"]["resources"]["devices"] == [rules[0]]
    assert not any(e.startswith("NVIDIA_VISIBLE_DEVICES=") for e in none["process"]["env"])


def test_a_node_gives_each_pod_the_lowest_free_gpus_and_refuses_what_it_lacks():
    assert gpus.allocate(8, (), 4) == (0, 1, 2, 3)
    assert gpus.allocate(8, (0, 1, 2, 3), 4) == (4, 5, 6, 7)
    assert gpus.allocate(8, (0, 2, 3, 7), 2) == (1, 4)  # what a pod that left freed is given again
    with pytest.raises(gpus.Unavailable, match="Requested: 4, Available: 2"):
        gpus.allocate(8, (0, 1, 2, 3, 4, 5), 4)


def test_security_context_capabilities_privilege_and_read_only_root():
    caps = spec(ctr(security={"runAsUser": 0}))["process"]["capabilities"]
    assert caps["bounding"] == list(oci.DEFAULT_CAPS) and caps["effective"] == list(oci.DEFAULT_CAPS)
    caps = spec(ctr(security={"runAsUser": 0, "capabilities": {"add": ["SYS_PTRACE"], "drop": ["NET_RAW"]}})
                )["process"]["capabilities"]
    assert "CAP_SYS_PTRACE" in caps["bounding"] and "CAP_NET_RAW" not in caps["bounding"]
    caps = spec(ctr(security={"runAsUser": 0, "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]}}))
    assert caps["process"]["capabilities"]["bounding"] == ["CAP_CHOWN"]
    # A non-root process holds them only in its bounding set.
    assert spec(ctr())["process"]["capabilities"]["effective"] == []
    with pytest.raises(oci.SpecError, match="not a Linux capability"):
        spec(ctr(security={"capabilities": {"add": ["FLY"]}}))
    priv = spec(ctr(security={"privileged": True}), gpus=(0,))
    assert priv["process"]["capabilities"]["bounding"] == list(oci.ALL_CAPS)
    assert priv["linux"]["resources"]["devices"] == [{"allow": True, "access": "rwm"}]
    assert "maskedPaths" not in priv["linux"]
    assert spec(ctr())["linux"]["maskedPaths"] == list(oci.MASKED_PATHS)
    assert spec(ctr(security={"readOnlyRootFilesystem": True}))["root"]["readonly"] is True
    assert spec(ctr(security={"allowPrivilegeEscalation": False}))["process"]["noNewPrivileges"] is True
    assert spec(ctr())["process"]["noNewPrivileges"] is False


def test_limits_become_cgroup_resources():
    s = spec(ctr(resources={"requests": {"cpu": "2"}, "limits": {"memory": "256Mi", "cpu": "500m"}}))
    assert s["linux"]["resources"]["memory"] == {"limit": 256 * 2**20}
    assert s["linux"]["resources"]["cpu"] == {"quota": 50_000, "period": 100_000}
    assert "memory" not in spec(ctr(resources={"requests": {"memory": "1Gi"}}))["linux"]["resources"]
    with pytest.raises(oci.SpecError, match="resources.limits.memory"):
        spec(ctr(resources={"limits": {"memory": "lots"}}))


def test_the_pod_plan_carries_what_the_runc_runtime_needs():
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
           "spec": {"securityContext": {"runAsUser": 1000, "fsGroup": 7},
                    "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
                    "containers": [{"name": "c", "image": "ghcr.io/slurmk8s/slurmd:22.05", "command": ["slurmd"],
                                    "args": ["-D"], "securityContext": {"runAsUser": 0},
                                    "resources": {"limits": {"memory": "1Gi"}},
                                    "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}]}}
    pod["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/srv/data"}})
    pod["spec"]["containers"][0]["volumeMounts"].append({"name": "host", "mountPath": "/data", "readOnly": True})
    c = pod_plan(pod, {}, {}, "10.0.0.2").main
    assert (c.image, c.command, c.container_args) == ("ghcr.io/slurmk8s/slurmd:22.05", ["slurmd"], ["-D"])
    assert c.security == {"runAsUser": 0, "fsGroup": 7}
    assert [(m.kind, m.source, m.target, m.read_only, m.size) for m in c.mounts] == [
        ("bind", "/srv/data", "/data", True, None), ("tmpfs", "tmpfs", "/dev/shm", False, 2**30)]
