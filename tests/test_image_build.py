"""Builds every image of images/ with buildah (cached in the default image cache, so
minutes only the first time) and checks each exported root file system from the
inside, with chroot: the entrypoint, the Slurm release the tag names, and what
each component runs."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from sandbox import images as rules
from sandbox.imagestore import Image, ImageStore
from slurmk8s import __version__, versions
from slurmk8s.api import load_cluster
from slurmk8s.render import ClusterKeys, TopologyNode, render
from slurmk8s.render.slurmd import TERMINATING_DRAIN_REASON
from slurmk8s.slurm.model import job_from_json, node_from_json, release_of

from .conftest import example_without_accounting

pytestmark = [pytest.mark.images, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parent.parent
ENTRYPOINT = "/usr/local/bin/slurmk8s-entrypoint"
#: image -> (command printing the Slurm version, what it prints before the version)
SLURM_VERSION_OF = {
    "slurmctld": (["slurmctld", "-V"], "slurm-wlm "),
    "slurmd": (["slurmd", "-V"], "slurm-wlm "),
    "slurmrestd": (["slurmrestd", "-V"], "slurm-wlm "),
    # The Slurm commands need a slurm.conf even for -V; ask dpkg.
    "login": (["dpkg-query", "-W", "-f", "${Version}", "slurm-client"], ""),
    "controller": (["dpkg-query", "-W", "-f", "${Version}", "slurm-client"], ""),
}


@pytest.fixture(scope="module")
def built() -> dict[str, Image]:
    messages: list[str] = []
    images = ImageStore().build(progress=messages.append)
    return {i.name: i for i in images}


def chroot(image: Image, *argv: str, user: str | None = None) -> subprocess.CompletedProcess:
    prefix = ["setpriv", f"--reuid={user.split(':')[0]}", f"--regid={user.split(':')[1]}", "--clear-groups"] \
        if user else []
    return subprocess.run(["chroot", str(image.rootfs), *prefix, *argv], capture_output=True, text=True,
                          env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})


def test_every_image_is_built_with_its_entrypoint(built):
    assert sorted(built) == sorted(p.parent.name for p in ImageStore().repo.glob("images/*/Dockerfile"))
    for name, image in built.items():
        assert image.config.entrypoint == (ENTRYPOINT,), name
        entry = image.rootfs / ENTRYPOINT.lstrip("/")
        assert entry.is_file() and entry.stat().st_mode & 0o111, f"{name}: {entry} is not executable"
        assert entry.read_bytes() == (ImageStore().repo / f"images/{name}/entrypoint.sh").read_bytes()
        proc = chroot(image, "bash", "-n", ENTRYPOINT)
        assert proc.returncode == 0, f"{name}: {proc.stderr}"
        assert (image.rootfs / "usr/local/lib/slurmk8s/lib.sh").is_file(), name
        # Nothing of the build host: its DNS server and name are the runtime's to provide.
        for f in ("etc/resolv.conf", "etc/hostname"):
            assert not (image.rootfs / f).exists() or (image.rootfs / f).stat().st_size == 0, f"{name}: {f}"


@pytest.mark.parametrize("version", versions.SUPPORTED)
@pytest.mark.parametrize("name", sorted(SLURM_VERSION_OF))
def test_the_image_has_the_slurm_release_its_tag_names(built, name, version):
    image = built[name] if version == versions.DEFAULT else \
        {i.name: i for i in ImageStore().build([name], version)}[name]
    argv, prefix = SLURM_VERSION_OF[name]
    proc = chroot(image, *argv)
    assert proc.returncode == 0, proc.stderr
    assert image.meta["slurmVersion"] == version
    assert image.meta["suite"] == versions.release(version).debian_suite
    assert proc.stdout.strip().startswith(f"{prefix}{version}."), proc.stdout
    assert f"ghcr.io/slurmk8s/{name}:{version}" in image.meta["tags"]
    # The exact package the version table pins, whatever day it was built.
    assert image.slurm_package == versions.release(version).slurm_package_version


def test_the_image_user_has_its_own_group(built):
    for name in ("controller", "serve"):
        assert built[name].config.user == "10001:10001"
        assert chroot(built[name], "id", "slurmk8s").stdout.strip() == \
            "uid=10001(slurmk8s) gid=10001(slurmk8s) groups=10001(slurmk8s)", name


def test_the_controller_runs_slurmk8s_installed_from_the_checkout(built):
    image = built["controller"]
    proc = chroot(image, "/opt/slurmk8s/bin/slurmk8s", "--version", user="10001:10001")
    assert proc.returncode == 0 and proc.stdout.strip() == f"slurmk8s, version {__version__}", proc.stderr
    # Every module imports: a package missing from pyproject's list would not be installed.
    proc = chroot(image, "/opt/slurmk8s/bin/python", "-c",
                  "import importlib, pkgutil, slurmk8s\n"
                  "for m in pkgutil.walk_packages(slurmk8s.__path__, 'slurmk8s.'): importlib.import_module(m.name)\n"
                  "print('ok')", user="10001:10001")
    assert proc.stdout.strip() == "ok", proc.stderr
    for tool in ("munged", "scontrol", "setpriv"):
        assert chroot(image, "bash", "-c", f"command -v {tool}").returncode == 0, tool


def test_the_login_sshd_accepts_its_config(built):
    image = built["login"]
    proc = chroot(image, "bash", "-c",
                  "set -e; d=$(mktemp -d); ssh-keygen -q -t ed25519 -N '' -f $d/k; install -d /run/sshd; "
                  "/usr/sbin/sshd -t -f /etc/ssh/sshd_config.slurmk8s -o HostKey=$d/k; rm -rf $d")
    assert proc.returncode == 0, proc.stderr


def test_the_serve_image_runs_its_server(built):
    proc = chroot(built["serve"], "python3", "/usr/local/lib/slurmk8s/serve.py", "--help", user="10001:10001")
    assert proc.returncode == 0 and "--model-dir" in proc.stdout, proc.stderr


def test_the_prometheus_image_discovers_kubernetes_pods_and_takes_the_example_and_the_rules(built):
    """Debian's Prometheus of the image's suite has Kubernetes service discovery (bookworm's
    has none); the image's own promtool accepts the example's configuration and the alerts."""
    import yaml

    image, repo = built["prometheus"], ImageStore().repo
    docs = yaml.safe_load_all((repo / "examples/monitoring/prometheus.yaml").read_text())
    [config] = [d["data"]["prometheus.yml"] for d in docs if d and d["kind"] == "ConfigMap"]
    for what, text in (("config", config), ("rules", (repo / "charts/slurmk8s/files/prometheus/alerts.yaml").read_text())):
        # In a mount namespace of its own, with a tmpfs on the image's /tmp: the cached root stays as built.
        script = ('mount -t tmpfs tmpfs "$1/tmp" && cat > "$1/tmp/file.yaml" && '
                  'chroot "$1" promtool check "$2" /tmp/file.yaml')
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                               str(image.rootfs), what], input=text, capture_output=True, text=True)
        assert proc.returncode == 0 and "SUCCESS" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "kubernetes_sd_configs" in config
    assert chroot(image, "prometheus", "--version").stdout.startswith("prometheus, version 3.")
    # The alerts' unit tests, by the promtool of the Prometheus that runs them (the suite runs bookworm's too).
    tests = (repo / "tests/prometheus/alerts-test.yaml").read_text().replace(
        "../../charts/slurmk8s/files/prometheus/alerts.yaml", "alerts.yaml")
    script = ('mount -t tmpfs tmpfs "$1/tmp" && cp "$2" "$1/tmp/alerts.yaml" && cat > "$1/tmp/test.yaml" && '
              'chroot "$1" sh -c "cd /tmp && promtool test rules test.yaml"')
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                           str(image.rootfs), str(repo / "charts/slurmk8s/files/prometheus/alerts.yaml")],
                          input=tests, capture_output=True, text=True)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr


def test_the_slurmd_image_has_the_task_prolog_and_the_job_tools(built):
    image = built["slurmd"]
    assert chroot(image, "bash", "-n", "/usr/local/lib/slurmk8s/task-prolog").returncode == 0
    for tool in ("slurmstepd", "srun", "munged", "hostname", "ps", "setpriv"):
        assert chroot(image, "bash", "-c", f"command -v {tool}").returncode == 0, tool


def test_a_second_build_is_cached_and_ensure_finds_the_renderers_names(built):
    messages: list[str] = []
    start = time.monotonic()
    again = ImageStore().build(progress=messages.append)
    assert time.monotonic() - start < 60, messages
    assert {i.name: i.key for i in again} == {n: i.key for n, i in built.items()}
    assert sorted(m.split(":")[0] for m in messages if ": cached (" in m) == sorted(built), messages
    assert not [m for m in messages if "building" in m or "bootstrapping" in m], messages
    refs = [t for n in built for t in rules.tags(n)]
    found = ImageStore().ensure(refs)
    assert {r: i.key for r, i in found.items()} == {r: built[i.name].key for r, i in found.items()}
    for ref in refs:
        image = ImageStore().lookup(ref)
        assert image is not None and image.key == built[image.name].key and image.rootfs.is_dir(), ref


def _config_map(objects: list[dict], name: str) -> dict[str, str]:
    return next(o["data"] for o in objects if o["kind"] in ("ConfigMap", "Secret") and o["metadata"]["name"] == name)


def _show_config(text: str) -> dict[str, str]:
    """``scontrol show config``: ``Key = value`` lines."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def _image_cluster(version: str, tmp_path: Path, *, topology: bool):
    """Runs fixtures/image-cluster.sh on ``version``'s images with the rendered example
    (and a switch topology naming node-1 if ``topology``): the cluster, the finished
    process and the work directory with the logs."""
    release = versions.release(version)
    doc = example_without_accounting()
    doc["spec"]["slurm"]["version"] = version
    if topology:
        doc["spec"]["topology"] = {"labelKeys": ["net/spine", "net/leaf"]}
    if topology and not release.topology_places_dynamic_nodes:
        # The validator refuses this; render it anyway to show the daemons' reason.
        doc["spec"]["slurm"]["version"] = next(v for v, r in versions.RELEASES.items()
                                               if r.topology_places_dynamic_nodes)
        cluster = load_cluster(doc)
        slurm = cluster.spec.slurm.model_copy(update={"version": version})
        cluster = cluster.model_copy(update={"spec": cluster.spec.model_copy(update={"slurm": slurm})})
    else:
        cluster = load_cluster(doc)
    built = {i.name: i for i in ImageStore().build(["slurmctld", "slurmd", "controller"], version)}
    nodes = [TopologyNode("node-1", {"net/spine": "s0", "net/leaf": "l0"})]
    objects = render(cluster, ClusterKeys.generate(), nodes)
    conf = tmp_path / "etc-slurm"
    conf.mkdir()
    for name, text in _config_map(objects, f"{cluster.name}-slurm-config").items():
        (conf / name).write_text(text)
    key = _config_map(objects, f"{cluster.name}-munge-key")["munge.key"]
    (tmp_path / "munge.key").write_bytes(base64.b64decode(key))
    work = tmp_path / "run"
    work.mkdir()
    mpi = "pmix" if "pmix" in release.mpi_types else release.mpi_types[0]
    proc = subprocess.run([str(ROOT / "tests/fixtures/image-cluster.sh"), str(built["slurmctld"].rootfs),
                           str(built["slurmd"].rootfs), str(conf), str(tmp_path / "munge.key"), str(work),
                           str(built["controller"].rootfs)],
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, "SLURMK8S_TEST_MPI": mpi,
                               "SLURMK8S_DRAIN_REASON": TERMINATING_DRAIN_REASON})
    return cluster, proc, work


@pytest.mark.parametrize("version", versions.SUPPORTED)
def test_a_job_runs_on_slurmctld_and_slurmd_started_from_the_images(version, tmp_path):
    """The images' entrypoints as a runtime starts them: each in an overlay root over the
    exported rootfs, with the renderer's slurm.conf for ``version`` and munge key mounted;
    the agent's Slurm facade from the controller image of the same release.
    Every supported release runs the example (preemption, lending, GPUs, a checkpoint
    directory), with a switch topology where the release places dynamic nodes in one
    (the node is in topology.conf, and `scontrol reconfigure` runs after it registered,
    as the operator does); slurmctld's view of the config shows what the version table
    says."""
    release = versions.release(version)
    cluster, proc, work = _image_cluster(version, tmp_path, topology=release.topology_places_dynamic_nodes)
    logs = "\n".join(f"--- {f.name}\n{f.read_text()}" for f in sorted(work.glob("*.log")))
    out = proc.stdout
    assert "node ready: yes" in out, out + proc.stderr + logs
    assert "node ready after reconfigure: yes" in out, out + proc.stderr + logs
    assert "node-1 idle" in out, out + logs
    assert "job on demo-controller-0 in debian" in out, out + proc.stderr + logs
    assert "mpi rank 0" in out, out + proc.stderr + logs
    slurmd_log = (work / "slurmd.log").read_text()
    assert "deleted node node-1 from slurmctld" in slurmd_log, logs
    assert "can not load PMIx library" not in slurmd_log
    assert f"slurmctld version {version}." in (work / "ctld.log").read_text(), logs
    for log in ("ctld.log", "slurmd.log"):
        text = (work / log).read_text()
        assert "fatal" not in text and "Unknown parameter" not in text, f"{log}:\n{text}"

    # The facade's parsers read what this release's commands printed (fixtures/slurm-json/ keeps a copy).
    [job] = [job_from_json(j) for j in json.loads((work / "squeue.json").read_text())["jobs"]]
    assert (job.name, job.state, job.nodes) == ("sleeper", "RUNNING", "node-1")
    nodes_file = "sinfo-drain.json" if release.nodes_command[0] == "sinfo" else "scontrol-nodes.json"
    data = json.loads((work / nodes_file).read_text())
    assert release_of(data) == version
    [node] = [node_from_json(n) for n in data["nodes"]]
    assert node.name == "node-1" and node.drain_is_ours and release.dynamic_node_flag in node.flags

    # The agent's facade, run from the controller image of this release, reads the drained
    # node and its job: a Slurm client of the cluster's own release.
    assert f"facade release: {version}\n" in out, out + proc.stderr
    assert f"facade node: node-1 allocated DRAIN,{release.dynamic_node_flag} ours\n" in out, out + proc.stderr
    assert "facade job: 1 sleeper RUNNING\n" in out, out + proc.stderr
    # The agent's Slurm metrics: this release's sdiag parsed, the running job and the drained node counted.
    metric = dict(line.removeprefix("facade metric: ").rsplit(" ", 1) for line in out.splitlines()
                  if line.startswith("facade metric: "))
    assert metric.get("slurmk8s_slurm_up") == "1.0", out + proc.stderr
    assert metric.get('slurmk8s_slurm_jobs{partition="cpu",state="running"}') == "1.0", metric
    assert metric.get('slurmk8s_slurm_nodes{partition="cpu",state="drain"}') == "1.0", metric
    assert metric.get('slurmk8s_slurm_queue_wait_seconds_count{partition="cpu"}') == "1.0", metric
    assert float(metric['slurmk8s_slurm_scheduler_cycles_total{scheduler="main"}']) >= 1, metric
    assert float(metric["slurmk8s_slurm_rpcs_total"]) >= 1 and float(metric["slurmk8s_slurm_server_threads"]) >= 1
    assert "facade undrained: True\n" in out, out + proc.stderr
    assert "facade requeued: 1 RUNNING restarts=1 within 30s\n" in out, out + proc.stderr + logs
    assert "facade signalled: [1]\n" in out, out + proc.stderr
    assert "facade jobs on node-1 after the signal: []\n" in out, out + proc.stderr + logs

    # slurmctld answers the kubelet's httpGet probes where the table says it does
    # (a status from 200 to 399 is a success to the kubelet; 26.05 answers 204).
    for path in ("/readyz", "/livez"):
        status = re.search(rf"^http {path}: (\d+)$", out, re.M)
        assert bool(status and 200 <= int(status[1]) < 400) == release.ctld_http_probes, out

    shown = _show_config((work / "config.txt").read_text())
    assert shown["SLURM_VERSION"].startswith(f"{version}."), shown
    assert shown["SelectType"] == release.select_type
    assert shown["TopologyPlugin"] == (release.topology_tree_plugin if cluster.spec.topology
                                       else release.topology_flat_plugin)
    assert shown["AuthType"] in release.auth_types
    signal_key, signal_value = release.preempt_user_signal
    assert signal_value in shown[signal_key].split(","), shown[signal_key]
    assert "enable_configless" in shown["SlurmctldParameters"].split(",")


PLUGIN_DIR = "usr/lib/x86_64-linux-gnu/slurm-wlm"


@pytest.mark.parametrize("version", versions.SUPPORTED)
def test_the_version_table_matches_the_plugins_and_commands_of_each_release(version):
    """What the table says a release has, its Debian build has: plugin files and --json."""
    release = versions.release(version)
    slurmd = {i.name: i for i in ImageStore().build(["slurmd"], version)}["slurmd"]
    plugins = {p.stem for p in (slurmd.rootfs / PLUGIN_DIR).glob("*.so")}

    def plugin(name: str) -> str:  # "auth/munge" -> "auth_munge"
        return name.replace("/", "_")

    assert {p for p in plugins if p.startswith("auth_")} - {"auth_none"} == {plugin(a) for a in release.auth_types}
    assert plugin(release.select_type) in plugins
    assert {plugin(release.topology_tree_plugin), plugin(release.topology_flat_plugin)} <= plugins
    containers = {"JobContainerType": "job_container_", "NamespaceType": "namespace_"}
    for key, prefix in containers.items():
        assert any(p.startswith(prefix) for p in plugins) == (key == release.job_container_key), (key, plugins)
    assert {p for p in plugins if p.startswith("mpi_") and p.count("_") == 1} - {"mpi_none", "mpi_cray"} == \
        {f"mpi_{t}" for t in release.mpi_types}, plugins
    parsers = {p.removeprefix("data_parser_").replace("_", ".") for p in plugins if p.startswith("data_parser_")}
    assert parsers == (set(release.rest_parsers) if release.rest_data_parser else set())
    restd = {i.name: i for i in ImageStore().build(["slurmrestd"], version)}["slurmrestd"]
    openapi = {p.stem.removeprefix("openapi_") for p in (restd.rootfs / PLUGIN_DIR).glob("openapi_*.so")}
    assert release.rest_openapi_plugin.removeprefix("openapi/").replace(".", "_") in openapi, openapi
    if release.rest_data_parser is None:  # one openapi plugin per data parser (and a db one each)
        assert openapi == {p.replace(".", "_") for p in release.rest_parsers} | \
            {"db" + p.replace(".", "_") for p in release.rest_parsers}, openapi
    # The commands need a reachable config even for --help; their usage text is in the binary.
    for command in ("scontrol", "sinfo", "squeue", "sacctmgr"):
        binary = (slurmd.rootfs / "usr/bin" / command).read_bytes()
        assert (b"--json" in binary) == (command in release.json_commands), command


@pytest.mark.parametrize("version", versions.SUPPORTED)
def test_slurmrestd_serves_the_data_parser_the_renderer_names(version, tmp_path):
    """slurmrestd's image started as the rendered pod starts it: the table's plugin loads and
    its data parser answers; a parser of the release that is not loaded does not."""
    release = versions.release(version)
    doc = example_without_accounting()
    doc["spec"]["slurm"]["version"] = version
    doc["spec"]["restApi"] = {"enabled": True}
    objects = render(load_cluster(doc), ClusterKeys.generate())
    conf = tmp_path / "etc-slurm"
    conf.mkdir()
    for name, text in _config_map(objects, "demo-slurm-config").items():
        (conf / name).write_text(text)
    deployment = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "demo-restapi")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if e["name"].startswith("SLURMK8S_RESTD_")}
    restd = {i.name: i for i in ImageStore().build(["slurmrestd"], version)}["slurmrestd"]
    served = release.rest_data_parser or release.rest_openapi_plugin.removeprefix("openapi/")
    other = next(p for p in release.rest_parsers if p != served)
    log = tmp_path / "slurmrestd.log"
    proc = subprocess.run([str(ROOT / "tests/fixtures/slurmrestd-probe.sh"), str(restd.rootfs), str(conf), str(log),
                           served, other], capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert proc.stdout.splitlines() == [f"{served} served", f"{other} absent"], \
        proc.stdout + proc.stderr + log.read_text()
    assert f"plugins {release.rest_openapi_plugin}" in log.read_text()
    # Run without the renderer's variables (e.g. docker run), the image picks its own plugin:
    # openapi/slurmctld with every data parser, or the newest openapi/v0.0.N.
    bare = {k: v for k, v in os.environ.items() if not k.startswith("SLURMK8S_RESTD_")}
    proc = subprocess.run([str(ROOT / "tests/fixtures/slurmrestd-probe.sh"), str(restd.rootfs), str(conf), str(log),
                           *release.rest_parsers], capture_output=True, text=True, timeout=60, env=bare)
    expected = release.rest_parsers if release.rest_data_parser else (served,)
    assert proc.stdout.splitlines() == [f"{p} {'served' if p in expected else 'absent'}" for p in release.rest_parsers], \
        proc.stdout + proc.stderr + log.read_text()


@pytest.mark.parametrize("version", [v for v, r in versions.RELEASES.items() if not r.topology_places_dynamic_nodes])
def test_where_the_tree_does_not_place_dynamic_nodes_no_job_would_run(version, tmp_path):
    """Why spec.topology is refused on these releases: with node-1 in topology.conf and a
    reconfigure after it registered, slurmctld still finds no switch for it."""
    _, proc, work = _image_cluster(version, tmp_path, topology=True)
    logs = "\n".join(f"--- {f.name}\n{f.read_text()}" for f in sorted(work.glob("*.log")))
    assert "node ready after reconfigure: yes" in proc.stdout, proc.stdout + logs
    assert "job on demo-controller-0" not in proc.stdout, proc.stdout
    assert "Requested node configuration is not available" in proc.stderr, proc.stderr
    ctld = (work / "ctld.log").read_text()
    assert 'lookup failure for node "node-1"' in ctld and "never runnable in partition cpu" in ctld, ctld


def _ctld_files(objects: list[dict], cluster: str, dest: Path) -> None:
    """The files the controller pod's slurmctld container mounts from the slurm-config ConfigMap
    outside /etc/slurm (projected items), under ``dest`` at their paths, with their modes."""
    sts = next(o for o in objects if o["kind"] == "StatefulSet" and o["metadata"]["name"] == f"{cluster}-controller")
    pod = sts["spec"]["template"]["spec"]
    data = _config_map(objects, f"{cluster}-slurm-config")
    volumes = {v["name"]: v for v in pod["volumes"]}
    ctld = next(c for c in pod["containers"] if c["name"] == "slurmctld")
    for mount in ctld["volumeMounts"]:
        for source in volumes.get(mount["name"], {}).get("projected", {}).get("sources", []):
            if source.get("configMap", {}).get("name") != f"{cluster}-slurm-config":
                continue
            for item in source["configMap"]["items"]:
                path = dest / mount["mountPath"].lstrip("/") / item["path"]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(data[item["key"]])
                path.chmod(item["mode"])


# 22.05's slurmd starts the login shell without namespaces (no clone to fail), and its REST API
# (openapi/v0.0.38, no data parsers) takes another job document.
@pytest.mark.parametrize("version", [v for v in versions.SUPPORTED if versions.release(v).rest_data_parser])
def test_a_request_naming_the_login_environment_twice_leaves_an_unprivileged_slurmd_running(version, tmp_path):
    """job_submit.lua rewrites the first SLURM_GET_USER_ENV entry only, and slurmd acts on any
    SLURM_GET_USER_ENV=1. A REST (or libslurm) request may name it again: the rendered
    PrologSlurmctld, mounted as the controller pod mounts it, turns the rest into =0, so slurmd,
    with the capabilities of its pod, neither exits nor starts a login shell, and the job (an
    array's tasks too) runs with the environment it was submitted with. Jobs from sbatch
    --export=NONE and srun (no stored environment) run as before."""
    doc = example_without_accounting()
    doc["spec"]["slurm"]["version"] = version
    cluster = load_cluster(doc)
    objects = render(cluster, ClusterKeys.generate())
    conf = tmp_path / "etc-slurm"
    conf.mkdir()
    for name, text in _config_map(objects, f"{cluster.name}-slurm-config").items():
        (conf / name).write_text(text)
    ctld_files = tmp_path / "ctld-files"
    _ctld_files(objects, cluster.name, ctld_files)
    (tmp_path / "munge.key").write_bytes(base64.b64decode(_config_map(objects, f"{cluster.name}-munge-key")["munge.key"]))
    built = {i.name: i for i in ImageStore().build(["slurmctld", "slurmd", "slurmrestd"], version)}
    work = tmp_path / "run"
    work.mkdir()
    release = versions.release(version)
    parser = release.rest_data_parser
    proc = subprocess.run([str(ROOT / "tests/fixtures/login-env-cluster.sh"), str(built["slurmctld"].rootfs),
                           str(built["slurmd"].rootfs), str(built["slurmrestd"].rootfs), str(conf),
                           str(tmp_path / "munge.key"), str(work), parser, str(ctld_files)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SLURMK8S_DRAIN_REASON": TERMINATING_DRAIN_REASON})
    logs = "\n".join(f"--- {f.name}\n{f.read_text()}" for f in sorted(work.glob("*.log")))
    out = proc.stdout
    why = out + proc.stderr + logs
    # The slurmd of the test has no CAP_SYS_ADMIN (bit 21), as in its pod.
    cap_eff = re.search(r"^slurmd CapEff: ([0-9a-f]+)$", out, re.M)
    assert cap_eff and not int(cap_eff[1], 16) & (1 << 21), why
    # The request sbatch --export=NONE sends: job_submit.lua's rewrite.
    assert "job single: COMPLETED\n" in out and "single.out: SLURM_GET_USER_ENV=0\n" in out, why
    # Twice, and three times in an array of two tasks: PrologSlurmctld's rewrite of the rest.
    for name in ("twice", "array-1", "array-2"):
        assert f"{name}.out: SLURM_GET_USER_ENV=0\n" in out and f"{name}.out: done\n" in out, why
    assert "job twice: COMPLETED\n" in out and "job array: COMPLETED\n" in out, why
    assert "SLURM_GET_USER_ENV=1" not in out, why
    # sbatch --export=NONE itself, and a job with no stored environment.
    assert "job plain: COMPLETED\n" in out and "plain.out: SLURM_GET_USER_ENV=0\n" in out, why
    assert "srun: ran\n" in out, why
    slurmd_log = (work / "slurmd.log").read_text()
    assert "slurmd: running\n" in out and "fatal" not in slurmd_log, why
    # slurmd never even tried to load a login environment.
    assert "local environment" not in slurmd_log, why
