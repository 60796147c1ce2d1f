"""The sandbox's commands, ``slurmk8s sandbox ...`` and ``slurmk8s images ...``.

They are the sandbox's, not the product's: the ``slurmk8s.commands`` entry
points of pyproject.toml add them to the ``slurmk8s`` command
(``slurmk8s.cli.main``) where this code is installed, which a production
install (the wheel, the controller image) is not (decision record 22).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from slurmk8s import versions
from slurmk8s.api import InvalidSpec
from slurmk8s.cli import CONTEXT, FILE_OPTION, _fail

STATE_DIR_OPTION = click.option(
    "--state-dir", type=click.Path(file_okay=False, path_type=Path), envvar="SLURMK8S_SANDBOX_DIR",
    default=None, show_default="/var/lib/slurmk8s/sandbox",
    help="Where the sandbox keeps its state, keys and storage.")


def _sandbox(state_dir: Path | None):
    from . import DEFAULT_STATE_DIR, Sandbox

    return Sandbox(state_dir or DEFAULT_STATE_DIR, progress=lambda msg: click.echo(f"sandbox: {msg}", err=True))


@click.group(context_settings=CONTEXT)
def sandbox() -> None:
    """Run a SlurmCluster on this machine: real Slurm, no Docker, no Kubernetes.

    Each pod runs as processes in its own network, UTS, PID and mount
    namespaces, started through the images' own entrypoints, with Debian's
    Slurm binaries. Needs root on Debian bookworm (hack/setup.sh installs
    the packages).

    \b
      slurmk8s sandbox up -f examples/slurmcluster.yaml
      slurmk8s sandbox ssh -- sinfo
      slurmk8s sandbox down
    """


@sandbox.command("up")
@FILE_OPTION
@STATE_DIR_OPTION
@click.option("--subnet", default="10.253.0.0/24", show_default=True,
              help="Private subnet for the pods' addresses (the host takes the first one).")
@click.option("--timeout", default=300, show_default=True, help="Seconds to wait for every node to be idle, once the images are built.")
@click.option("--lendable-nodes", default=2, show_default=True, type=click.IntRange(0, 16),
              help="GPU nodes of Kubernetes' own (no node set uses them), labelled slurmk8s.dev/lendable=true "
                   "and slurmk8s.dev/lendable-to=<the cluster's namespace> for a NodeLendingPolicy there to "
                   "lend. Fixed when the sandbox is first created.")
@click.option("--gpus-per-node", default=8, show_default=True, type=click.IntRange(1, 64),
              help="GPU devices of each node the cluster's GPU workers run on: workers are packed onto them "
                   "(two 4-GPU workers share an 8-GPU node), each pod given its own devices under the host's "
                   "numbers, as the NVIDIA device plugin does. Fixed when the sandbox is first created.")
@click.option("--slurm-version", default=None, type=click.Choice(versions.SUPPORTED),
              help="Run this Slurm release instead of the one FILE's spec.slurm.version names "
                   "(every Slurm image is built for it on its Debian suite).")
@click.option("--image", "extra_images", multiple=True, metavar="NAME",
              help="Also build and push images/NAME, for a workload applied later (e.g. ldap); `all`: every "
                   "image of images/. Always built: the images FILE's pods and the chart name, and "
                   "prometheus and serve (examples/monitoring/, examples/serving.yaml).")
def sandbox_up(filename: str, state_dir: Path | None, subnet: str, timeout: int, lendable_nodes: int,
               gpus_per_node: int, slurm_version: str | None, extra_images: tuple[str, ...]) -> None:
    """Start the cluster in FILE and wait until it is Ready and every Slurm node idle.

    The sandbox is a small Kubernetes on this machine: an API server that
    enforces authentication and RBAC, and a kubelet that runs each pod under
    runc from the images built from images/: those its pods will run (FILE's,
    the chart's, and --image's) are built first where missing or out of
    date, independent ones at once (minutes the first time, then seconds; see
    `slurmk8s images --help`), and pushed to the sandbox's registry. slurmk8s is installed into it with its Helm chart
    (charts/slurmk8s, release slurmk8s-system/slurmk8s): the operator and
    the node-lending bridge run as pods under the chart's ServiceAccounts and
    RBAC. Besides the nodes the cluster's pods run on, it has
    --lendable-nodes idle GPU nodes that a NodeLendingPolicy
    (examples/nodelendingpolicy.yaml) can lend to Slurm. FILE is applied
    through the API, as with `kubectl apply -f FILE`, and the operator does
    the rest. Run it again after editing FILE to apply the change (the chart
    is upgraded too); after a crash it starts again whatever is not running.
    kubectl and helm work too:

    \b
      kubectl --kubeconfig "$(slurmk8s sandbox status -o json | jq -r .kubeconfig)" get slurmclusters
    """
    from slurmk8s.manifest import clusters_in, read_documents, with_slurm_version

    from . import SandboxFailed
    from .images import SANDBOX_WORKLOADS, ImageError, image_names
    from .imagestore import ImageStore

    try:
        docs = [d for d in read_documents(filename) if isinstance(d, dict)]
        if slurm_version:
            docs = with_slurm_version(docs, slurm_version)
        found = list(clusters_in(docs))
    except InvalidSpec as exc:
        _fail(exc)
    if len(found) != 1:
        raise click.UsageError(f"{filename} must hold exactly one SlurmCluster (found {len(found)})")
    try:
        image_names(extra_images, ImageStore().names())
    except ImageError as exc:
        raise click.BadParameter(str(exc), param_hint="--image") from None
    box = _sandbox(state_dir)
    try:
        state = box.up(found[0], docs, subnet=subnet, timeout=timeout, lendable=lendable_nodes,
                       gpus_per_node=gpus_per_node, extra_images=[*SANDBOX_WORKLOADS, *extra_images])
    except SandboxFailed as exc:
        click.echo(f"sandbox: {exc}", err=True)
        sys.exit(1)
    click.echo(f"Sandbox {state.cluster} is up.")
    click.echo(f"  kubectl:  kubectl --kubeconfig {box.kubeconfig} get slurmclusters,pods")
    if state.login:
        click.echo(f"  Log in:   slurmk8s sandbox ssh        ({state.login['user']}@{state.login['host']})")
    if state.shared_storage:
        s = state.shared_storage
        click.echo(f"  Shared:   {s['mountPath']} in the pods is {s['hostPath']} here")
    click.echo("  Status:   slurmk8s sandbox status")
    click.echo("  Stop:     slurmk8s sandbox down")


@sandbox.command("kubelet", hidden=True)
@STATE_DIR_OPTION
def sandbox_kubelet(state_dir: Path | None) -> None:
    """Run the sandbox's kubelet in the foreground (`sandbox up` starts it)."""
    import signal
    import threading

    from . import DEFAULT_STATE_DIR
    from .kubelet import run_for_sandbox

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    run_for_sandbox(state_dir or DEFAULT_STATE_DIR, stop, progress=lambda msg: click.echo(msg, err=True))


@sandbox.command("status")
@STATE_DIR_OPTION
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def sandbox_status(state_dir: Path | None, output: str) -> None:
    """Show the pods, their addresses and their Slurm node states."""
    import json

    from . import SandboxFailed

    try:
        st = _sandbox(state_dir).status()
    except SandboxFailed as exc:
        click.echo(str(exc), err=True)
        sys.exit(1)
    if output == "json":
        click.echo(json.dumps(st, indent=2))
        return
    click.echo(f"{'POD':<30} {'NODE':<16} {'IP':<15} {'PHASE':<8} {'READY':<6} SLURM")
    for p in st["pods"]:
        click.echo(f"{p['name']:<30} {p['node'] or '-':<16} {p['ip'] or '-':<15} {p['phase'] or '-':<8} "
                   f"{'yes' if p['ready'] else 'no':<6} {p['slurmState'] or '-'}")
    click.echo(f"\n{'NODE':<20} {'GPUS':<5} {'LENDING':<12} SLURM")
    for n in st["kubernetesNodes"]:
        lending = n["lending"] or ("lendable" if n["lendable"] else "-")
        click.echo(f"{n['name']:<20} {n['gpus'] or '-':<5} {lending:<12} {n['slurmState'] or '-'}")
    click.echo()
    for name, proc in st["processes"].items():
        click.echo(f"{name}: {'running' if proc['running'] else 'NOT RUNNING'} (pid {proc['pid']}, log {proc['log']})")
    for name, c in sorted(st["components"].items()):
        click.echo(f"{name}: pod {c['pod']} {'ready' if c['ready'] else 'NOT READY'}, "
                   f"{'leading' if c['leader'] else 'no leader yet'} of {len(c['replicas'])} replicas, "
                   f"{c['restarts']} restarts, ServiceAccount {c['serviceAccount']}, metrics {c['metrics'] or '-'}")
    click.echo(f"kubeconfig: {st['kubeconfig']}")
    if st["login"]:
        click.echo(f"\nlogin: {st['login']['user']}@{st['login']['host']} (slurmk8s sandbox ssh)")
    if st["sharedStorage"]:
        click.echo(f"shared storage: {st['sharedStorage']['mountPath']} = {st['sharedStorage']['hostPath']}")


@sandbox.command("ssh", context_settings={"ignore_unknown_options": True})
@STATE_DIR_OPTION
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def sandbox_ssh(state_dir: Path | None, command: tuple[str, ...]) -> None:
    """Open SSH to the login pod as the cluster's first user; run COMMAND if given.

    \b
      slurmk8s sandbox ssh
      slurmk8s sandbox ssh -- sbatch /shared/train.sh
    """
    from . import SandboxFailed

    try:
        argv = _sandbox(state_dir).ssh_argv(list(command) or None)
    except SandboxFailed as exc:
        click.echo(str(exc), err=True)
        sys.exit(1)
    os.execvp(argv[0], argv)


@sandbox.command("logs")
@STATE_DIR_OPTION
@click.argument("pod")
@click.option("--tail", type=int, default=None, help="Only the last N lines.")
@click.option("-c", "--container", default=None, help="Which container (default: the pod's first).")
def sandbox_logs(state_dir: Path | None, pod: str, tail: int | None, container: str | None) -> None:
    """Print the log of POD: a container's entrypoint and daemons, and the pod's own messages."""
    try:
        click.echo(_sandbox(state_dir).logs(pod, tail=tail, container=container))
    except KeyError as exc:
        click.echo(exc.args[0], err=True)
        sys.exit(1)


@sandbox.command("fault")
@STATE_DIR_OPTION
@click.argument("kind", type=click.Choice(["gpu", "shared-readonly"]))
@click.argument("pod")
@click.option("--clear", is_flag=True, help="Remove the fault again.")
def sandbox_fault(state_dir: Path | None, kind: str, pod: str, clear: bool) -> None:
    """Break something in a running slurmd POD, for the health checks to find.

    \b
    gpu              its highest-numbered /dev/nvidiaN disappears (a GPU fallen off the bus)
    shared-readonly  its shared volumes are remounted read-only

    The node's next health check (spec.healthCheck.intervalSeconds) drains it
    with `slurmk8s: health: <check>`; after --clear, the next one resumes it.
    """
    try:
        for line in _sandbox(state_dir).fault(pod, kind, clear):
            click.echo(f"in {pod}: {line}")
    except (KeyError, ValueError) as exc:
        click.echo(exc.args[0], err=True)
        sys.exit(1)


@sandbox.command("down")
@STATE_DIR_OPTION
@click.option("--purge", is_flag=True, help="Also delete the keys, the controller state and the shared storage.")
def sandbox_down(state_dir: Path | None, purge: bool) -> None:
    """Stop every pod and remove their runc containers, namespaces, veths and bridge. Idempotent.

    Data a PersistentVolume would keep (slurmctld state, shared storage) and
    the cluster keys stay for the next `up`, unless --purge.
    """
    removed = _sandbox(state_dir).down(purge=purge)
    click.echo("Removed: " + ", ".join(removed) if removed else "Nothing was running.")


@click.group(context_settings=CONTEXT)
def images() -> None:
    """Build the images of images/ without Docker, for the sandbox's runtime.

    Each Dockerfile is built unchanged with buildah on a Debian base that
    mmdebstrap bootstraps from the archive apt is configured with (the Slurm
    release picks the suite), tagged as the renderer and the chart name the
    images, and exported as a root file system plus its OCI config into the
    cache ($SLURMK8S_IMAGE_CACHE, default /var/cache/slurmk8s/images). An
    image whose inputs did not change is not built again; the others are
    built at once, each as soon as its base is there ($SLURMK8S_IMAGE_JOBS at
    a time, default one per core and at least 2). Needs root and buildah, mmdebstrap (hack/setup.sh
    installs them).

    \b
      slurmk8s images build              # every image, for the default Slurm release
      slurmk8s images build slurmd login
      slurmk8s images list
      slurmk8s images prune              # what earlier builds left, and unused node images
      slurmk8s images push --registry 127.0.0.1:5000 --authfile auth.json --ca-file ca.crt
    """


CACHE_OPTION = click.option(
    "--cache-dir", type=click.Path(file_okay=False, path_type=Path), envvar="SLURMK8S_IMAGE_CACHE", default=None,
    show_default="/var/cache/slurmk8s/images", help="Where built images are exported.")


@images.command("build")
@click.argument("names", nargs=-1)
@click.option("--slurm-version", default=None, show_default=versions.DEFAULT,
              type=click.Choice(versions.SUPPORTED),
              help="The Slurm release of the Slurm images; it picks the Debian suite they are built on.")
@click.option("--refresh-base", is_flag=True,
              help="Bootstrap the Debian base again (to take in security updates); every image is then rebuilt.")
@CACHE_OPTION
def images_build(names: tuple[str, ...], slurm_version: str | None, refresh_base: bool,
                 cache_dir: Path | None) -> None:
    """Build NAMES (default: every image of images/), reusing what is cached."""
    import time

    from .images import DEFAULT_SLURM, ImageError
    from .imagestore import ImageBuildFailed, ImageStore

    start = time.monotonic()
    store = ImageStore(cache_dir)
    try:
        built = store.build(names, slurm_version or DEFAULT_SLURM, refresh_base=refresh_base,
                            progress=lambda msg: click.echo(f"images: {msg}", err=True))
    except (ImageError, ImageBuildFailed) as exc:
        click.echo(f"images: {exc}", err=True)
        sys.exit(1)
    for image in built:
        click.echo(f"{' '.join(image.meta['tags'])}\t{image.rootfs}")
    click.echo(f"images: {len(built)} image(s) ready in {time.monotonic() - start:.0f}s", err=True)


@images.command("list")
@CACHE_OPTION
def images_list(cache_dir: Path | None) -> None:
    """The references the cache holds an image for: the build's key, the exact
    Slurm package version it carries (- for none), its root file system."""
    from .imagestore import ImageStore

    for image in ImageStore(cache_dir).list():
        click.echo(f"{image.ref}\t{image.key[:12]}\tslurm {image.slurm_package or '-'}\t{image.rootfs}")


@images.command("prune")
@CACHE_OPTION
def images_prune(cache_dir: Path | None) -> None:
    """Free the disk of what earlier builds left.

    \b
    - exports no reference names any more, unless a running container stands on one;
    - in buildah's storage, the working containers of builds that died and the
      images no tag names (earlier builds; the layer cache of the current ones stays);
    - the sandbox nodes' pulled images, as a kubelet's image garbage collection
      does: those unused for a day, and the least recently used others while the
      disk has under 16 GiB free;
    - in the sandboxes' registry storage, the manifests no tag names and their
      blobs (not while a registry serves).

    The test command (hack/test.sh) runs it after its builds.
    """
    from . import publish, registry
    from .imagestore import ImageStore
    from .kubelet import image_cache
    from .pulls import prune as prune_node_images

    def say(msg: str) -> None:
        click.echo(f"images: {msg}", err=True)

    removed = ImageStore(cache_dir).prune(progress=say, storage=True)
    say(f"removed {len(removed)} earlier export(s)")
    count, freed = prune_node_images(image_cache())
    say(f"removed {count} node image(s) ({freed / 2**30:.1f} GiB) from {image_cache()}")
    say(registry.collect(publish.storage()))


@images.command("push")
@click.option("--registry", required=True, metavar="HOST[:PORT][/PREFIX]",
              help="Where to push: each image goes to HOST[:PORT][/PREFIX]/<name>:<tag>, as the chart's "
                   "image.repository names it (ghcr.io/slurmk8s/slurmd:22.05 -> HOST:PORT/slurmd:22.05).")
@click.option("--release", "release", default=None, show_default=versions.DEFAULT,
              type=click.Choice(versions.SUPPORTED), help="The Slurm release whose images are pushed.")
@click.option("--all-releases", is_flag=True, help="Push the images of every supported Slurm release.")
@click.option("--authfile", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Credentials, in containers-auth.json or Docker's config.json format "
                   '({"auths": {"HOST:PORT": {"auth": base64 of user:password}}}); default: buildah\'s '
                   "($REGISTRY_AUTH_FILE, else ${XDG_RUNTIME_DIR}/containers/auth.json).")
@click.option("--ca-file", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="The CA certificate (PEM) the registry's certificate is checked with, for a private CA "
                   "such as the sandbox registry's (<its directory>/tls/ca.crt); default: the system's.")
@CACHE_OPTION
def images_push(registry: str, release: str | None, all_releases: bool, authfile: Path | None,
                ca_file: Path | None, cache_dir: Path | None) -> None:
    """Push the images of a Slurm release, as last built, to a registry.

    Pushes with `buildah push` the images `slurmk8s images build` made for
    the release (every image of images/; the Slurm-free ones of the default
    release), over TLS, and prints each reference with its digest. A layer
    the registry already has is not sent again, so pushing unchanged images
    is quick. An image that was never built, or is gone from buildah's
    storage, stops the push before anything is sent: build it first.

    \b
      slurmk8s images push --registry 127.0.0.1:5000 --authfile auth.json --ca-file ca.crt
      slurmk8s images push --registry registry.example.org/hpc --all-releases
    """
    from .images import DEFAULT_SLURM, ImageError
    from .imagestore import ImageBuildFailed, ImageStore

    if all_releases and release:
        raise click.UsageError("--release and --all-releases exclude each other: give one")
    releases = list(versions.SUPPORTED) if all_releases else [release or DEFAULT_SLURM]
    try:
        pushed = ImageStore(cache_dir).push(registry, releases, authfile=authfile, ca_file=ca_file,
                                            progress=lambda msg: click.echo(f"images: {msg}", err=True))
    except (ImageError, ImageBuildFailed) as exc:
        click.echo(f"images: {exc}", err=True)
        sys.exit(1)
    for ref, digest in pushed:
        click.echo(f"{ref}@{digest}")
