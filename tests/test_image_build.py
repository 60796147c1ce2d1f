"""Builds every image of images/ with buildah (cached in the default image cache, so
minutes only the first time) and checks each exported root file system from the
inside, with chroot: the entrypoint, the Slurm release the tag names, and what
each component runs."""

from __future__ import annotations

import base64
import subprocess
import time
from pathlib import Path

import pytest

from slurmk8s import __version__
from slurmk8s.manifest import clusters
from slurmk8s.render import ClusterKeys, render
from slurmk8s.sandbox import images as rules
from slurmk8s.sandbox.imagestore import Image, ImageStore

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


@pytest.mark.parametrize("name", sorted(SLURM_VERSION_OF))
def test_the_image_has_the_slurm_release_its_tag_names(built, name):
    image = built[name]
    argv, prefix = SLURM_VERSION_OF[name]
    proc = chroot(image, *argv)
    assert proc.returncode == 0, proc.stderr
    release = image.meta["slurmVersion"]
    assert proc.stdout.strip().startswith(f"{prefix}{release}."), proc.stdout
    assert f"ghcr.io/slurmk8s/{name}:{release}" in image.meta["tags"]


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


def test_a_job_runs_on_slurmctld_and_slurmd_started_from_the_images(built, tmp_path):
    """The images' entrypoints as a runtime starts them: each in an overlay root over the
    exported rootfs, with the renderer's slurm.conf and munge key mounted."""
    cluster = next(clusters(str(ROOT / "examples/slurmcluster.yaml")))
    objects = render(cluster, ClusterKeys.generate())
    conf = tmp_path / "etc-slurm"
    conf.mkdir()
    for o in objects:
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == f"{cluster.name}-slurm-config":
            for name, text in o["data"].items():
                (conf / name).write_text(text)
        if o["kind"] == "Secret" and o["metadata"]["name"] == f"{cluster.name}-munge-key":
            (tmp_path / "munge.key").write_bytes(base64.b64decode(o["data"]["munge.key"]))
    assert (conf / "slurm.conf").exists() and (tmp_path / "munge.key").exists()
    work = tmp_path / "run"
    work.mkdir()
    proc = subprocess.run([str(ROOT / "tests/fixtures/image-cluster.sh"), str(built["slurmctld"].rootfs),
                           str(built["slurmd"].rootfs), str(conf), str(tmp_path / "munge.key"), str(work)],
                          capture_output=True, text=True, timeout=180)
    logs = "\n".join(f"--- {f.name}\n{f.read_text()}" for f in sorted(work.glob("*.log")))
    out = proc.stdout
    assert "node ready: yes" in out, out + proc.stderr + logs
    assert "node-1 idle" in out, out + logs
    assert "job on demo-controller-0 in debian 12" in out, out + proc.stderr + logs
    assert "pmix rank 0" in out, out + proc.stderr + logs
    slurmd_log = (work / "slurmd.log").read_text()
    assert "deleted node node-1 from slurmctld" in slurmd_log, logs
    assert "can not load PMIx library" not in slurmd_log
