"""The pure rules of building and running images (sandbox.images) and the
image store's lookups, without building anything."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from sandbox import images as rules
from sandbox.images import IgnoreRules, ImageConfig, ImageError, Recipe, container_process
from sandbox.imagestore import ImageBuildFailed, ImageStore, context_listing
from slurmk8s import __version__, versions
from slurmk8s.manifest import clusters
from slurmk8s.render import ClusterKeys, names, render

ROOT = Path(__file__).resolve().parent.parent
NAMES = sorted(p.parent.name for p in ROOT.glob("images/*/Dockerfile"))
SLURM_IMAGES = ["login", "slurmctld", "slurmd", "slurmrestd"]


# --- what is built, and its names ---

def test_each_slurm_release_maps_to_one_suite():
    assert rules.suite_for("22.05").name == "bookworm"
    assert rules.suite_for("24.11").name == "trixie"
    assert rules.DEFAULT_SLURM in rules.SUITES
    with pytest.raises(ImageError, match="no Debian suite for Slurm 21.08.*22.05"):
        rules.suite_for("21.08")


def test_the_tags_are_the_names_the_renderer_gives_the_pods():
    cluster = next(clusters(str(ROOT / "examples/slurmcluster.yaml")))
    objects = render(cluster, ClusterKeys.generate())
    used = {c["image"] for o in objects if o["kind"] in ("StatefulSet", "Deployment")
            for c in o["spec"]["template"]["spec"]["containers"]}
    assert used, "the example renders no workloads"
    tagged = {t for n in NAMES for t in rules.tags(n, cluster.spec.slurm.version)}
    assert used <= tagged
    for n in SLURM_IMAGES:
        assert rules.tags(n, cluster.spec.slurm.version) == [names.image(cluster, n)]
    # The slurmctld pod's agent container runs the controller image, named by the Slurm release.
    assert names.image(cluster, "controller") in rules.tags("controller")


def test_the_controller_is_tagged_as_the_chart_names_it_and_serve_as_the_example():
    chart = yaml.safe_load((ROOT / "charts/slurmk8s/Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "charts/slurmk8s/values.yaml").read_text())
    assert chart["appVersion"] == __version__
    assert f"{values['image']['repository']}:{chart['appVersion']}" in rules.tags("controller")
    serving = list(yaml.safe_load_all((ROOT / "examples/serving.yaml").read_text()))
    images = {c["image"] for d in serving if d and d.get("kind") == "Deployment"
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == set(rules.tags("serve"))


def test_serve_holds_no_slurm_and_is_built_once():
    assert rules.tags("serve", "22.05") == [f"ghcr.io/slurmk8s/serve:{__version__}"]
    assert rules.recipes(["serve", "slurmd"], "22.05", NAMES) == [Recipe("serve", rules.DEFAULT_SLURM),
                                                                  Recipe("slurmd", "22.05")]


def test_recipes_default_to_every_image_and_refuse_unknown_ones():
    assert [r.name for r in rules.recipes([], "22.05", NAMES)] == NAMES
    with pytest.raises(ImageError, match="no image nginx: images/ has controller, ldap, login"):
        rules.recipes(["nginx"], "22.05", NAMES)
    with pytest.raises(ImageError, match="no Debian suite for Slurm 99.01"):
        rules.recipes(["slurmd"], "99.01", NAMES)


def test_a_recipe_builds_on_its_suites_base():
    r = Recipe("slurmd", "22.05")
    base = r.build_args["BASE_IMAGE"]
    assert list(r.build_args) == ["BASE_IMAGE", "SLURM_VERSION", "SSS_SUITE"]
    assert base == f"localhost/slurmk8s/base:bookworm-{rules.base_recipe(r.suite)[:12]}"
    assert r.tags == ["ghcr.io/slurmk8s/slurmd:22.05"]


def test_sssd_and_its_clients_come_from_the_suite_of_the_releases_sssd():
    # forky has no SSSD: 26.05's sssd image is built on trixie, and its Slurm images take trixie's client.
    assert Recipe("sssd", "26.05").suite.name == "trixie" and Recipe("slurmd", "26.05").suite.name == "forky"
    assert Recipe("slurmd", "26.05").build_args["SSS_SUITE"] == "trixie"
    assert Recipe("sssd", "22.05").suite.name == "bookworm" == Recipe("login", "22.05").build_args["SSS_SUITE"]
    assert "SSS_SUITE" not in Recipe("slurmdbd", "26.05").build_args


@pytest.mark.parametrize("ref, name", [
    ("ghcr.io/slurmk8s/slurmd:22.05", "slurmd"),
    ("ghcr.io/slurmk8s/controller:22.05", "controller"),
    (f"ghcr.io/slurmk8s/controller:{__version__}", "controller"),
    (f"ghcr.io/slurmk8s/serve:{__version__}", "serve"),
    ("ghcr.io/slurmk8s/slurmd:24.11", "slurmd"),
])
def test_a_reference_leads_back_to_its_recipe(ref, name):
    r = rules.recipe_for(ref, NAMES)
    assert r is not None and r.name == name and ref in r.tags


@pytest.mark.parametrize("ref", ["ghcr.io/slurmk8s/slurmd:23.02", "busybox", "registry.example.org/hpc/slurmd:22.05",
                                 "ghcr.io/slurmk8s/serve:22.05"])
def test_other_references_have_no_recipe(ref):
    assert rules.recipe_for(ref, NAMES) is None


@pytest.mark.parametrize("ref, normal", [
    ("busybox", "docker.io/library/busybox:latest"),
    ("debian:bookworm-slim", "docker.io/library/debian:bookworm-slim"),
    ("slurmk8s/slurmd:22.05", "docker.io/slurmk8s/slurmd:22.05"),
    ("ghcr.io/slurmk8s/slurmd", "ghcr.io/slurmk8s/slurmd:latest"),
    ("localhost/slurmk8s/base:bookworm", "localhost/slurmk8s/base:bookworm"),
    ("registry.example.org:5000/hpc/slurmd:22.05", "registry.example.org:5000/hpc/slurmd:22.05"),
    ("ghcr.io/a/b@sha256:" + "0" * 64, "ghcr.io/a/b@sha256:" + "0" * 64),
])
def test_references_are_normalized_as_runtimes_do(ref, normal):
    assert rules.normalize_ref(ref) == normal


@pytest.mark.parametrize("ref", ["", "UPPER/case", "a b", "ghcr.io/x:tag;rm -rf /", "x:" + "t" * 200, "../x"])
def test_a_bad_reference_is_refused(ref):
    with pytest.raises(ImageError, match="is not an image reference"):
        rules.normalize_ref(ref)


def test_the_base_is_minbase_of_the_suite_and_its_recipe_is_a_digest():
    suite = rules.suite_for("22.05")
    argv = rules.mmdebstrap_argv(suite, "/tmp/out.tar")
    assert argv[0] == "mmdebstrap" and "--variant=minbase" in argv and argv[-2:] == ["bookworm", "/tmp/out.tar"]
    other = rules.Suite("forky", ('--aptopt=Acquire::Check-Valid-Until "false"',))
    assert '--aptopt=Acquire::Check-Valid-Until "false"' in rules.mmdebstrap_argv(other, "o")
    assert rules.base_recipe(suite) != rules.base_recipe(other)
    assert rules.base_recipe(suite) == rules.base_recipe(rules.Suite("bookworm"))


# --- the build context and the key ---

@pytest.mark.parametrize("path, ignored", [
    ("slurmk8s/cli.py", False),
    ("pyproject.toml", False),
    ("images/common/slurmk8s-lib.sh", False),
    ("images/controller/entrypoint.sh", False),
    ("images/login/entrypoint.sh", True),
    (".venv/bin/python", True),
    (".git/HEAD", True),
    ("slurmk8s/__pycache__/cli.cpython-311.pyc", True),
    ("slurmk8s/render/x.pyc", True),
    ("tests/test_cli.py", True),
])
def test_the_controllers_dockerignore(path, ignored):
    rules_ = IgnoreRules.parse((ROOT / "images/controller/Dockerfile.dockerignore").read_text())
    assert rules_.ignored(path) is ignored


def test_dockerignore_patterns_follow_docker():
    r = IgnoreRules.parse("# comment\n*.md\n!README.md\n/build/\ndocs/**/draft-?.txt\n[ab]c\n")
    assert r.ignored("NOTES.md") and not r.ignored("README.md")
    assert not r.ignored("sub/NOTES.md")  # * does not cross /
    assert r.ignored("build/x/y") and not r.ignored("rebuild/x")
    assert r.ignored("docs/draft-1.txt") and r.ignored("docs/a/b/draft-2.txt") and not r.ignored("docs/draft-10.txt")
    assert r.ignored("ac") and not r.ignored("cc")


def test_a_walk_enters_an_ignored_directory_only_for_an_exception():
    r = IgnoreRules.parse("*\n!images/common/\n")
    assert r.may_hold_included("images") and r.may_hold_included("images/common")
    assert not r.may_hold_included(".venv") and not r.may_hold_included("images/login")


def _context(root: Path, ignore: str) -> list[str]:
    return list(context_listing(root, IgnoreRules.parse(ignore)))


def test_the_context_listing_has_what_copy_carries(tmp_path):
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "a.sh").write_text("echo a\n")
    (tmp_path / "keep" / "link").symlink_to("a.sh")
    (tmp_path / "drop").mkdir()
    (tmp_path / "drop" / "b").write_text("b\n")
    listing = _context(tmp_path, "*\n!keep/\n")
    assert [line.split()[-1] for line in listing] == ["keep", "keep/a.sh", "keep/link"]
    before = listing
    (tmp_path / "drop" / "b").write_text("changed\n")
    assert _context(tmp_path, "*\n!keep/\n") == before, "an ignored file changed the context"
    (tmp_path / "keep" / "a.sh").chmod(0o755)
    assert _context(tmp_path, "*\n!keep/\n") != before, "a mode change did not change the context"


def test_the_cache_key_changes_with_every_input():
    base = dict(dockerfile="FROM x\n", context=["file 0644 ab a"], base_image_id="sha256:1",
                build_args={"BASE_IMAGE": "b", "A": "1"}, tags=["t:1"], builder="buildah 1.28")
    key = rules.cache_key(**base)
    assert key == rules.cache_key(**{**base, "build_args": {"A": "1", "BASE_IMAGE": "b"}})
    for name, value in [("dockerfile", "FROM y\n"), ("context", ["file 0755 ab a"]), ("base_image_id", "sha256:2"),
                        ("build_args", {"BASE_IMAGE": "b"}), ("tags", ["t:2"]), ("builder", "buildah 1.29")]:
        assert rules.cache_key(**{**base, name: value}) != key, name


def test_buildah_steps_are_read_from_its_output():
    assert rules.parse_step("STEP 9/14: RUN install-packages.sh munge") == (9, 14, "RUN install-packages.sh munge")
    assert rules.parse_step("[1/2] STEP 3/11: COPY a b") == (3, 11, "stage 1/2: COPY a b")
    assert rules.parse_step("Get:1 http://deb.debian.org bookworm InRelease") is None


def test_a_failure_hint_says_what_to_do():
    assert "network" in rules.failure_hint(["Err:1 http://deb.debian.org bookworm InRelease",
                                            "  Temporary failure resolving 'deb.debian.org'"])
    assert "SLURM_PACKAGES" in rules.failure_hint(["E: Unable to locate package slurm-smd-slurmd"])
    assert "steps before it are cached" in rules.failure_hint(["exit status 2"])


# --- running an image: Kubernetes' rules over the image config ---

IMAGE = ImageConfig(entrypoint=("/entry",), cmd=("--default",), env=("PATH=/usr/bin", "A=image"),
                    working_dir="/work", user="10001:10001")


def test_the_image_config_is_read_from_the_oci_config():
    oci = {"config": {"Entrypoint": ["/e"], "Env": ["PATH=/bin"], "User": "65534:65534",
                      "ExposedPorts": {"6820/tcp": {}}, "Labels": {"a": "b"}}}
    c = ImageConfig.from_oci(oci)
    assert c == ImageConfig(entrypoint=("/e",), env=("PATH=/bin",), user="65534:65534",
                            exposed_ports=("6820/tcp",), labels={"a": "b"})
    assert ImageConfig.from_oci({}) == ImageConfig()


@pytest.mark.parametrize("command, args, argv", [
    (None, None, ("/entry", "--default")),          # the image's Entrypoint and Cmd
    (["/bin/sh", "-c"], None, ("/bin/sh", "-c")),   # command replaces Entrypoint and drops Cmd
    (None, ["agent", "--x"], ("/entry", "agent", "--x")),  # args replace Cmd
    (["/bin/echo"], ["hi"], ("/bin/echo", "hi")),
    ([], [], ("/entry", "--default")),               # empty lists count as unset
])
def test_command_and_args_over_entrypoint_and_cmd(command, args, argv):
    assert container_process(IMAGE, command=command, args=args).argv == argv


def test_the_containers_env_goes_over_the_images():
    p = container_process(IMAGE, env=[("B", "pod"), ("A", "pod")])
    assert p.env == ("PATH=/usr/bin", "A=pod", "B=pod")
    assert rules.merge_env(["X=1=2"], []) == ["X=1=2"]


def test_var_references_expand_against_the_containers_env():
    p = container_process(IMAGE, command=["/bin/echo", "$(NAME)", "$$(NAME)", "$(PATH)", "$(MISSING)"],
                          env=[("NAME", "demo")])
    assert p.argv == ("/bin/echo", "demo", "$(NAME)", "$(PATH)", "$(MISSING)")


def test_working_dir_and_user():
    assert container_process(IMAGE).cwd == "/work" and container_process(IMAGE).user == "10001:10001"
    assert container_process(ImageConfig(entrypoint=("/e",))).cwd == "/"
    assert container_process(IMAGE, working_dir="/tmp").cwd == "/tmp"
    assert container_process(IMAGE, run_as_user=0, run_as_group=0).user == "0:0"
    assert container_process(IMAGE, run_as_user=5).user == "5:10001"
    assert container_process(ImageConfig(entrypoint=("/e",)), run_as_group=7).user == "0:7"


def test_an_image_without_a_command_needs_one_from_the_pod():
    with pytest.raises(ImageError, match="set command"):
        container_process(ImageConfig())


PASSWD = "root:x:0:0:root:/root:/bin/bash\nslurmk8s:x:10001:10001::/nonexistent:/usr/sbin/nologin\n"
GROUP = "root:x:0:\nslurmk8s:x:10001:\nstaff:x:50:\n"


@pytest.mark.parametrize("user, ids", [
    ("", (0, 0)), ("10001", (10001, 10001)), ("10001:10001", (10001, 10001)), ("65534:65534", (65534, 65534)),
    ("4242", (4242, 0)), ("slurmk8s", (10001, 10001)), ("slurmk8s:staff", (10001, 50)), ("root:50", (0, 50)),
])
def test_the_images_user_resolves_in_its_own_passwd(user, ids):
    assert rules.resolve_user(user, PASSWD, GROUP) == ids


def test_an_unknown_user_name_is_refused():
    with pytest.raises(ImageError, match="not in its /etc/passwd"):
        rules.resolve_user("nobody", PASSWD, GROUP)
    with pytest.raises(ImageError, match="not in its /etc/group"):
        rules.resolve_user("root:wheel", PASSWD, GROUP)


# --- the store, without building ---

def _fake_export(cache: Path, name: str, key: str, tags: list[str]) -> Path:
    path = cache / name / key
    (path / "rootfs" / "usr/local/bin").mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"config": {"Entrypoint": ["/usr/local/bin/slurmk8s-entrypoint"],
                                                             "Env": ["PATH=/usr/bin"]}}))
    (path / "image.json").write_text(json.dumps({"name": name, "key": key, "tags": tags}))
    (cache / "refs").mkdir(exist_ok=True)
    for t in tags:
        from urllib.parse import quote
        (cache / "refs" / (quote(t, safe="") + ".json")).write_text(json.dumps({"ref": t, "name": name, "key": key}))
    return path


def test_lookup_finds_an_export_by_reference(tmp_path):
    path = _fake_export(tmp_path, "slurmd", "k1", ["ghcr.io/slurmk8s/slurmd:22.05"])
    store = ImageStore(tmp_path)
    image = store.lookup("ghcr.io/slurmk8s/slurmd:22.05")
    assert image is not None and image.rootfs == path / "rootfs" and image.name == "slurmd"
    assert image.config.entrypoint == ("/usr/local/bin/slurmk8s-entrypoint",)
    assert store.lookup("ghcr.io/slurmk8s/slurmctld:22.05") is None
    assert [i.ref for i in store.list()] == ["ghcr.io/slurmk8s/slurmd:22.05"]


def test_lookup_ignores_an_unfinished_export(tmp_path):
    path = _fake_export(tmp_path, "slurmd", "k1", ["ghcr.io/slurmk8s/slurmd:22.05"])
    (path / "image.json").unlink()
    assert ImageStore(tmp_path).lookup("ghcr.io/slurmk8s/slurmd:22.05") is None


def test_the_cache_dir_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURMK8S_IMAGE_CACHE", str(tmp_path))
    assert ImageStore().cache == tmp_path
    monkeypatch.delenv("SLURMK8S_IMAGE_CACHE")
    assert ImageStore().cache == Path("/var/cache/slurmk8s/images")


def test_ensure_refuses_a_reference_no_image_is_tagged_with(tmp_path):
    with pytest.raises(ImageError, match="no image of images/ is tagged 'busybox' and there is no registry"):
        ImageStore(tmp_path).ensure(["busybox"])
    assert not os.listdir(tmp_path), "a refused ensure wrote to the cache"


def test_the_image_directories_are_safe_names():
    assert all(rules.normalize_ref(t) == t for n in NAMES for t in rules.tags(n))


def test_a_failed_build_names_the_step_shows_the_tail_and_says_what_to_do(tmp_path):
    store = ImageStore(tmp_path)
    (tmp_path / "logs").mkdir()
    script = ("echo 'STEP 1/3: FROM base'; echo 'STEP 2/3: RUN apt-get install -y slurmd'; "
              "echo 'E: Unable to locate package slurmd'; exit 100")
    progress: list[str] = []
    with pytest.raises(ImageBuildFailed) as failed:
        store._run_logged("slurmd-22.05", ["bash", "-c", script], progress.append, what="slurmd")
    message = str(failed.value)
    assert "building slurmd failed at step 2/3 RUN apt-get install -y slurmd (exit status 100)" in message
    assert "    E: Unable to locate package slurmd" in message
    assert f"The whole output: {tmp_path}/logs/slurmd-22.05.log" in message
    assert "What to do: a package is not in the base's archive" in message
    assert [p.split(" (")[0] for p in progress] == ["slurmd: step 1/3 FROM base",
                                                    "slurmd: step 2/3 RUN apt-get install -y slurmd"]
    assert "Unable to locate package" in (tmp_path / "logs/slurmd-22.05.log").read_text()


def test_the_cli_refuses_an_unknown_image_or_release_before_building(tmp_path):
    from click.testing import CliRunner

    from slurmk8s.cli import main

    result = CliRunner().invoke(main, ["images", "build", "--cache-dir", str(tmp_path), "nginx"])
    assert result.exit_code == 1 and "no image nginx: images/ has controller" in result.output
    result = CliRunner().invoke(main, ["images", "build", "--cache-dir", str(tmp_path), "--slurm-version", "23.02"])
    assert result.exit_code == 2 and "'23.02' is not one of '22.05', '24.11', '26.05'" in result.output
    assert not os.listdir(tmp_path)


def test_prune_removes_only_the_exports_no_reference_names(tmp_path):
    current = _fake_export(tmp_path, "slurmd", "new", ["ghcr.io/slurmk8s/slurmd:22.05"])
    old = tmp_path / "slurmd" / "old"
    (old / "rootfs").mkdir(parents=True)
    (old / "image.json").write_text("{}")
    removed = ImageStore(tmp_path, repo=ROOT).prune()
    assert removed == [old] and not old.exists() and current.is_dir()
    assert ImageStore(tmp_path).lookup("ghcr.io/slurmk8s/slurmd:22.05").path == current


@pytest.mark.root
def test_prune_keeps_an_earlier_export_a_mounted_container_root_stands_on(tmp_path):
    assert os.geteuid() == 0, "the overlay mount needs root"
    cache = tmp_path / "cache"
    _fake_export(cache, "slurmd", "new", ["ghcr.io/slurmk8s/slurmd:22.05"])
    running = cache / "slurmd" / "running"
    (running / "rootfs").mkdir(parents=True)
    merged, upper, work = (tmp_path / d for d in ("merged", "upper", "work"))
    for d in (merged, upper, work):
        d.mkdir()
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={running / 'rootfs'},upperdir={upper},workdir={work}", str(merged)], check=True)
    messages: list[str] = []
    try:
        assert ImageStore(cache, repo=ROOT).prune(progress=messages.append) == []
    finally:
        subprocess.run(["umount", str(merged)], check=True)
    assert running.is_dir() and any("a mounted container root stands on it" in m for m in messages)
    assert ImageStore(cache, repo=ROOT).prune() == [running]


def test_an_image_without_a_dockerignore_is_refused(tmp_path):
    (tmp_path / "images/x").mkdir(parents=True)
    (tmp_path / "images/x/Dockerfile").write_text("FROM scratch\n")
    with pytest.raises(ImageError, match="Dockerfile.dockerignore is missing"):
        ImageStore(tmp_path / "cache", repo=tmp_path).key(Recipe("x", "22.05"), "sha256:1", "buildah")
    (tmp_path / "images/x/Dockerfile.dockerignore").write_text("*\n!images/x/\n")
    key = ImageStore(tmp_path / "cache", repo=tmp_path).key(Recipe("x", "22.05"), "sha256:1", "buildah")
    assert len(key) == 64


def test_every_image_that_installs_slurm_is_built_with_the_pinned_package_version():
    root = Path(__file__).resolve().parents[1]
    takes_pin = {p.parent.name for p in root.glob("images/*/Dockerfile") if "ARG SLURM_VERSION" in p.read_text()}
    assert rules.SLURM_PACKAGED == takes_pin
    for name in takes_pin:
        for version, release in versions.RELEASES.items():
            assert Recipe(name, version).build_args["SLURM_VERSION"] == release.slurm_package_version
    assert "SLURM_VERSION" not in Recipe("serve", versions.DEFAULT).build_args
    # Each pin is of its own release, and differs from the others.
    pins = [r.slurm_package_version for r in versions.RELEASES.values()]
    assert len(set(pins)) == len(pins)
    assert all(r.slurm_package_version.startswith(f"{v}.") for v, r in versions.RELEASES.items())


def test_images_list_reads_the_slurm_an_image_carries_from_its_dpkg_status():
    status = ("Package: munge\nStatus: install ok installed\nVersion: 0.5.15-2\n\n"
              "Package: slurmd\nStatus: deinstall ok config-files\nVersion: 22.05.8-4+deb12u3\n\n"
              "Package: slurm-client\nStatus: install ok installed\nVersion: 24.11.5-4+deb13u1\n"
              "Description: x\n continued: line\n")
    assert rules.slurm_package_version(status) == "24.11.5-4+deb13u1"  # slurmd was removed
    assert rules.slurm_package_version("Package: munge\nStatus: install ok installed\nVersion: 1\n") is None
