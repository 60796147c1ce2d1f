"""The ``slurmk8s`` command."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from . import __version__, log, versions
from .api import InvalidSpec
from .api.crd import all_crds, crd_filename, dump_yaml
from .manifest import clusters, policies
from .render import ClusterKeys, render

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="slurmk8s")
@click.option("--log-level", type=click.Choice(log.LEVELS), default="info", show_default=True,
              envvar="SLURMK8S_LOG_LEVEL", help="Least severe log messages shown (on stderr).")
@click.option("--log-format", type=click.Choice(["console", "json"]), default="console",
              show_default=True, envvar="SLURMK8S_LOG_FORMAT", help="Log line format.")
def main(log_level: str, log_format: str) -> None:
    """Slurm on Kubernetes.

    Declare a Slurm cluster as a SlurmCluster resource; slurmk8s renders and
    runs its slurmctld, slurmd, login and slurmrestd pods.

    \b
    Start here:
      slurmk8s validate -f examples/slurmcluster.yaml
      slurmk8s render   -f examples/slurmcluster.yaml | less
      slurmk8s crd      > crds.yaml
    """
    log.configure(log_level, log_format)


def _fail(exc: InvalidSpec) -> None:
    click.echo(str(exc), err=True)
    click.echo("Fix the fields above and run the command again.", err=True)
    sys.exit(1)


def load_keys(directory: Path | None) -> ClusterKeys:
    """Keys from ``directory`` (generating missing ones), or fresh keys."""
    if directory is None:
        log.get().info("generated fresh cluster keys; pass --keys-dir to keep them between renders")
        return ClusterKeys.generate()
    keys, written = ClusterKeys.from_dir(directory)
    for path in written:
        log.get().info("generated key", path=str(path))
    return keys


FILE_OPTION = click.option(
    "-f", "--filename", "filename", required=True, metavar="FILE",
    type=click.Path(exists=True, dir_okay=False, allow_dash=True),
    help="Manifest with one or more SlurmCluster documents ('-' reads stdin).")


@main.command("render")
@FILE_OPTION
@click.option("--keys-dir", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Read the munge, JWT and SSH host keys from DIR, generating any that are "
                   "missing. Without it every run generates new keys.")
def render_cmd(filename: str, keys_dir: Path | None) -> None:
    """Print every Kubernetes object of the clusters in FILE as one YAML stream.

    Like `helm template`: nothing is sent to a cluster. Pipe it to
    `kubectl apply -f -`, or read it to see what the operator would create.
    Secrets carry real keys: treat the output as secret.
    """
    try:
        found = list(clusters(filename))
    except InvalidSpec as exc:
        _fail(exc)
    if not found:
        raise click.UsageError(f"{filename} holds no SlurmCluster document")
    keys = load_keys(keys_dir)
    objs = [o for c in found for o in render(c, keys)]
    click.echo(dump_yaml(objs), nl=False)


@main.command("validate")
@FILE_OPTION
def validate_cmd(filename: str) -> None:
    """Check the SlurmClusters and NodeLendingPolicies in FILE; exit 1 with
    every problem, by field path."""
    try:
        found = [*clusters(filename), *policies(filename)]
    except InvalidSpec as exc:
        _fail(exc)
    if not found:
        raise click.UsageError(f"{filename} holds no SlurmCluster or NodeLendingPolicy document")
    for obj in found:
        click.echo(f"{obj.kind} {obj.namespace}/{obj.name} is valid")


@main.command("crd")
@click.option("--write", "write_dir", type=click.Path(file_okay=False, path_type=Path),
              metavar="DIR", help="Write one file per CRD into DIR instead of printing them.")
def crd_cmd(write_dir: Path | None) -> None:
    """Print the CustomResourceDefinitions, generated from the typed API models.

    The chart's copies are made with: slurmk8s crd --write charts/slurmk8s/files/crds
    """
    crds = all_crds()
    if write_dir is None:
        click.echo(dump_yaml(crds), nl=False)
        return
    write_dir.mkdir(parents=True, exist_ok=True)
    for obj in crds:
        path = write_dir / crd_filename(obj)
        path.write_text(dump_yaml([obj]))
        click.echo(f"wrote {path}", err=True)


def _controller_options(watched: str, verb: str):
    """The options the operator and the bridge share: namespaces, credentials, ports."""
    def decorate(f):
        for option in reversed([
            click.option("-n", "--namespace", "namespaces", multiple=True, metavar="NS",
                         help=f"{verb} {watched} in NS; repeat for several namespaces."),
            click.option("-A", "--all-namespaces", is_flag=True, help=f"{verb} {watched} in every namespace."),
            click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False),
                         help="Kubeconfig to use. Default: the pod's service account inside a cluster, "
                              "else $KUBECONFIG or ~/.kube/config."),
            click.option("--metrics-port", type=click.IntRange(1, 65535), default=None, metavar="PORT",
                         help="Serve Prometheus metrics on PORT at /metrics."),
            click.option("--health-port", type=click.IntRange(1, 65535), default=None, metavar="PORT",
                         help="Serve the liveness probe on PORT at /healthz."),
        ]):
            f = option(f)
        return f
    return decorate


@main.command("operator")
@_controller_options("SlurmClusters", "Watch")
@click.option("--interval", type=click.FloatRange(1, 3600), default=10.0, show_default=True, metavar="SECONDS",
              help="Seconds between rounds for each SlurmCluster (besides rounds on every change).")
@click.option("--release-namespace", default=None, metavar="NS",
              help="Namespace of the operator and bridge pods (the Helm release's). With --release-name, "
                   "each cluster gets a NetworkPolicy that admits only them to its Slurm agent.")
@click.option("--release-name", default=None, metavar="NAME",
              help="The Helm release (their app.kubernetes.io/instance label).")
def operator_cmd(namespaces: tuple[str, ...], all_namespaces: bool, kubeconfig: str | None,
                 metrics_port: int | None, health_port: int | None, interval: float,
                 release_namespace: str | None, release_name: str | None) -> None:
    """Run the SlurmCluster operator until stopped.

    For each SlurmCluster it renders the Kubernetes objects and applies what
    differs; scales in by draining Slurm nodes first (jobs get the node
    set's drain.gracePeriod, then are requeued); restarts worker pods one at
    a time on an image update; applies config changes with `scontrol
    reconfigure` once the controller pod sees them; and keeps
    status (phase, conditions, node counts) up to date. Slurm is reached
    only through each cluster's agent, beside slurmctld. Deleting a
    SlurmCluster drains its nodes and removes its objects; volumes stay
    unless spec.deletionPolicy is Delete.

    Runs standalone (no peering); run one replica.

    \b
      slurmk8s operator --namespace hpc --metrics-port 8080 --health-port 8081
      slurmk8s operator --all-namespaces --kubeconfig ~/.kube/config
    """
    if bool(namespaces) == all_namespaces:
        raise click.UsageError("pass --namespace NS (repeatable) or --all-namespaces, not both and not neither")
    if bool(release_namespace) != bool(release_name):
        raise click.UsageError("pass both --release-namespace and --release-name, or neither")
    from .operator.main import run
    from .render.manifests import AgentClients

    clients = AgentClients(release_namespace, release_name) if release_namespace and release_name else None
    try:
        run(namespaces=namespaces, all_namespaces=all_namespaces, kubeconfig=kubeconfig,
            metrics_port=metrics_port, health_port=health_port, interval=interval, agent_clients=clients)
    except KeyboardInterrupt:
        pass


@main.command("bridge")
@_controller_options("NodeLendingPolicies", "Act on")
@click.option("--interval", type=click.FloatRange(0.2, 600), default=2.0, show_default=True, metavar="SECONDS",
              help="Seconds between rounds. A reclaim starts at most this long after a GPU pod turns pending.")
def bridge_cmd(namespaces: tuple[str, ...], all_namespaces: bool, kubeconfig: str | None,
               metrics_port: int | None, health_port: int | None, interval: float) -> None:
    """Run the node-lending bridge until stopped.

    Lends idle Kubernetes GPU nodes to Slurm partitions as NodeLendingPolicies
    say, and takes them back when Kubernetes needs them: the node is
    drained in Slurm, its jobs get the policy's signal and grace period to
    checkpoint, then are requeued (eligible again at once) and the node is
    handed back. Every node's lending state is kept on the Node itself, so
    the bridge can be stopped or killed at any time and picks up where it
    left off. Slurm is reached only through each cluster's agent.

    Run one replica.

    \b
      slurmk8s bridge --all-namespaces --metrics-port 8090 --health-port 8091
      slurmk8s bridge --namespace hpc --kubeconfig ~/.kube/config --interval 5
    """
    if bool(namespaces) == all_namespaces:
        raise click.UsageError("pass --namespace NS (repeatable) or --all-namespaces, not both and not neither")
    from .bridge.main import run

    run(namespaces=namespaces, all_namespaces=all_namespaces, kubeconfig=kubeconfig,
        metrics_port=metrics_port, health_port=health_port, interval=interval)


@main.command("agent")
@click.option("--listen", default="0.0.0.0:6830", show_default=True, metavar="HOST:PORT",
              help="Address and port to serve on.")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path),
              default="/run/slurmk8s/agent/token", show_default=True, envvar="SLURMK8S_AGENT_TOKEN_FILE",
              help="File holding the bearer token (the mounted <cluster>-agent-token Secret).")
@click.option("--config-dir", type=click.Path(file_okay=False, path_type=Path), default="/etc/slurm",
              show_default=True, help="The Slurm config directory slurmctld reads; its hash is served.")
@click.option("--checkpoint-root", default=None, metavar="DIR",
              help="The cluster's checkpoint directory (shared storage, mounted read-only): model versions "
                   "jobs publish below it are served at /v1/published, for the bridge's rollouts.")
def agent_cmd(listen: str, token_file: Path, config_dir: Path, checkpoint_root: str | None) -> None:
    """Serve the Slurm agent: the operator's authenticated way to change Slurm.

    Runs beside slurmctld (a sidecar in its pod, with the munge key and
    /etc/slurm mounted) and offers only what the operator and the bridge
    need: list nodes and jobs, drain (reasons start with `slurmk8s:`),
    undrain (only slurmk8s's own drains), signal the jobs on a node, requeue
    a job and make it eligible at once, delete a node, reconfigure, and the
    hash of the config files it sees. Each runs through the local Slurm
    commands. Every request but GET /healthz needs the bearer token.
    """
    from .slurm import SlurmClient
    from .slurm.agent import make_server, read_token

    try:
        token = read_token(token_file)
        server = make_server(listen, SlurmClient(config_dir=config_dir), token, checkpoint_root)
    except (ValueError, OSError) as exc:
        click.echo(f"agent: {exc}", err=True)
        sys.exit(1)
    log.get("slurmk8s.agent").info("serving the Slurm agent", url=server.url, config_dir=str(config_dir))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@main.command("serve")
@click.option("--model-dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              envvar="SLURMK8S_MODEL_DIR", help="The model (checkpoint) directory whose LATEST names the version.")
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True, envvar="SLURMK8S_SERVE_PORT",
              help="Port to listen on.")
@click.option("--interval", type=click.FloatRange(0.1, 3600), default=2.0, show_default=True, metavar="SECONDS",
              help="Seconds between looks at LATEST.")
def serve_cmd(model_dir: Path, host: str, port: int, interval: float) -> None:
    """Serve the newest published model version of a checkpoint directory.

    Loads the version that MODEL_DIR/LATEST names (a directory beside it),
    loads the next one when LATEST changes, and answers GET / with its
    version, step and path. GET /healthz fails (503) until a model is
    loaded: the readinessProbe of examples/serving.yaml. Never writes.
    """
    from .serve import serve

    serve(model_dir, host, port, interval)


STATE_DIR_OPTION = click.option(
    "--state-dir", type=click.Path(file_okay=False, path_type=Path), envvar="SLURMK8S_SANDBOX_DIR",
    default=None, show_default="/var/lib/slurmk8s/sandbox",
    help="Where the sandbox keeps its state, keys and storage.")


def _sandbox(state_dir: Path | None):
    from .sandbox import DEFAULT_STATE_DIR, Sandbox

    return Sandbox(state_dir or DEFAULT_STATE_DIR, progress=lambda msg: click.echo(f"sandbox: {msg}", err=True))


@main.group()
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
@click.option("--timeout", default=300, show_default=True, help="Seconds to wait for every node to be idle.")
@click.option("--lendable-nodes", default=2, show_default=True, type=click.IntRange(0, 16),
              help="GPU nodes of Kubernetes' own (no node set uses them), labelled slurmk8s.dev/lendable=true "
                   "and slurmk8s.dev/lendable-to=<the cluster's namespace> for a NodeLendingPolicy there to "
                   "lend. Fixed when the sandbox is first created.")
@click.option("--slurm-version", default=None, type=click.Choice(versions.SUPPORTED),
              help="Run this Slurm release instead of the one FILE's spec.slurm.version names "
                   "(every Slurm image is built for it on its Debian suite).")
def sandbox_up(filename: str, state_dir: Path | None, subnet: str, timeout: int, lendable_nodes: int,
               slurm_version: str | None) -> None:
    """Start the cluster in FILE and wait until it is Ready and every Slurm node idle.

    The sandbox is a small Kubernetes on this machine: an API server that
    enforces authentication and RBAC, and a kubelet that runs each pod under
    runc from the images built from images/ (whatever image is missing or
    out of date is built first: minutes the first time, then seconds; see
    `slurmk8s images --help`). slurmk8s is installed into it with its Helm chart
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
    from .manifest import clusters_in, read_documents, with_slurm_version
    from .sandbox import SandboxFailed

    try:
        docs = [d for d in read_documents(filename) if isinstance(d, dict)]
        if slurm_version:
            docs = with_slurm_version(docs, slurm_version)
        found = list(clusters_in(docs))
    except InvalidSpec as exc:
        _fail(exc)
    if len(found) != 1:
        raise click.UsageError(f"{filename} must hold exactly one SlurmCluster (found {len(found)})")
    box = _sandbox(state_dir)
    try:
        state = box.up(found[0], docs,
                       subnet=subnet, timeout=timeout, lendable=lendable_nodes)
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

    from .sandbox import DEFAULT_STATE_DIR
    from .sandbox.kubelet import run_for_sandbox

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

    from .sandbox import SandboxFailed

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
        click.echo(f"{name}: pod {c['pod']} {'ready' if c['ready'] else 'NOT READY'}, {c['restarts']} restarts, "
                   f"ServiceAccount {c['serviceAccount']}, metrics {c['metrics'] or '-'}")
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
    from .sandbox import SandboxFailed

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


@main.group()
def images() -> None:
    """Build the images of images/ without Docker, for the sandbox's runtime.

    Each Dockerfile is built unchanged with buildah on a Debian base that
    mmdebstrap bootstraps from the archive apt is configured with (the Slurm
    release picks the suite), tagged as the renderer and the chart name the
    images, and exported as a root file system plus its OCI config into the
    cache ($SLURMK8S_IMAGE_CACHE, default /var/cache/slurmk8s/images). An
    image whose inputs did not change is not built again. Needs root and
    buildah, mmdebstrap (hack/setup.sh installs them).

    \b
      slurmk8s images build              # every image, for Slurm 22.05
      slurmk8s images build slurmd login
      slurmk8s images list
      slurmk8s images prune              # earlier builds no reference names
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

    from .sandbox.images import DEFAULT_SLURM, ImageError
    from .sandbox.imagestore import ImageBuildFailed, ImageStore

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
    """The references the cache holds an image for, with its root file system."""
    from .sandbox.imagestore import ImageStore

    for image in ImageStore(cache_dir).list():
        click.echo(f"{image.ref}\t{image.key[:12]}\t{image.rootfs}")


@images.command("prune")
@CACHE_OPTION
def images_prune(cache_dir: Path | None) -> None:
    """Remove exports no reference names any more (earlier builds of an image).

    Run it when no sandbox runs containers from an earlier build. buildah's
    own storage is pruned with `buildah rmi --prune` (which also drops its
    layer cache).
    """
    from .sandbox.imagestore import ImageStore

    removed = ImageStore(cache_dir).prune(progress=lambda msg: click.echo(f"images: {msg}", err=True))
    click.echo(f"images: removed {len(removed)} earlier build(s)", err=True)


if __name__ == "__main__":
    main()
