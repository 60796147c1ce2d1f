"""The ``slurmk8s`` command.

Over 500 lines because every product command is a thin click wrapper here (its
options are its --help, which users read as the reference), each calling into
the package that does the work; most of the lines are option declarations and
their help, `simulate`'s two dozen above all.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from . import __version__, log
from .api import InvalidSpec
from .api.cluster import PROJECT_REPOSITORY
from .api.crd import all_crds, crd_filename, dump_yaml
from .leader import LEASE_SECONDS_MAX, LEASE_SECONDS_MIN, lease_name
from .manifest import clusters, policies
from .render import ClusterKeys, render
from .simulate.params import Latencies
from .slurm.control import AGENT_PORT, METRICS_PORT

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

    from .api.cluster import SlurmCluster
    from .api.lending import NodeLendingPolicy

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

#: The entry point group of the commands that are not the product's: the
#: sandbox's `sandbox` and `images` (sandbox/pyproject.toml), a distribution
#: of its own: a production install has neither its code nor its entry points.
COMMANDS_GROUP = "slurmk8s.commands"
#: The sandbox's commands, named here so that an installation without the
#: sandbox says where they are instead of "no such command".
SANDBOX_COMMANDS = ("sandbox", "images")
_NO_SANDBOX = ("it is the sandbox's, which this installation does not have (it is not in the wheel: "
               "the sandbox runs from a checkout, pip install -e ./sandbox)")


class _Commands(click.Group):
    """The product's commands, and those of the ``slurmk8s.commands`` entry
    points whose code is there (decision record 22): this module never
    imports the sandbox. The product's commands are found without looking at
    entry points."""

    def _plugged(self) -> dict[str, EntryPoint]:
        from importlib.metadata import entry_points

        return {ep.name: ep for ep in entry_points(group=COMMANDS_GROUP) if ep.name not in self.commands}

    def list_commands(self, ctx: click.Context) -> list[str]:
        plugged = [n for n, ep in self._plugged().items() if isinstance(_load(ep), click.Command)]
        return sorted([*self.commands, *plugged])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.commands:
            return self.commands[name]
        ep = self._plugged().get(name)
        if ep is None:
            return _unavailable(name, _NO_SANDBOX) if name in SANDBOX_COMMANDS else None
        found = _load(ep)
        return found if isinstance(found, click.Command) else _unavailable(name, found)


def _load(ep: EntryPoint) -> click.Command | str:
    """The command an entry point names, or why it cannot be loaded here."""
    try:
        return ep.load()
    except ModuleNotFoundError as exc:
        if exc.name and ep.module.startswith(exc.name):
            return _NO_SANDBOX
        return f"the sandbox needs {exc.name}, which is not installed: pip install -e ./sandbox (hack/setup.sh does)"


def _unavailable(name: str, why: str) -> click.Command:
    @click.command(name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
                   add_help_option=False, hidden=True)
    def unavailable() -> None:
        click.echo(f"slurmk8s {name}: {why}", err=True)
        sys.exit(1)
    return unavailable


@click.group(cls=_Commands, context_settings=CONTEXT)
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


def _storage_class(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A StorageClass name (a DNS subdomain), or a usage error saying what one is."""
    if value is not None:
        from pydantic import TypeAdapter, ValidationError

        from .api.fields import DnsSubdomain

        try:
            TypeAdapter(DnsSubdomain).validate_python(value)
        except ValidationError:
            raise click.BadParameter(f"{value!r} is not a StorageClass name (a DNS subdomain: lower-case letters, "
                                     "digits, '-' and '.')", ctx=ctx, param=param) from None
    return value


#: The operator's setting, for the commands that show what it would do.
SHARED_STORAGE_CLASS_OPTION = click.option(
    "--shared-storage-class", default=None, metavar="CLASS", callback=_storage_class,
    help="The StorageClass of a shared volume's claim when the spec names none: the operator's "
         "--shared-storage-class (the chart's sharedStorage.storageClassName). Without it, a shared volume "
         "with size and no storageClassName is reported, as the operator without one refuses it.")


def _with_storage_classes(found: list[SlurmCluster], shared_storage_class: str | None) -> list[SlurmCluster]:
    """The clusters as the operator would take them with ``--shared-storage-class``; without it,
    each shared volume that names no class is logged as a warning (the claim is rendered without one)."""
    from .api.storageclass import unclassed, with_storage_class

    if shared_storage_class is not None:
        return [with_storage_class(c, shared_storage_class) for c in found]
    for c in found:
        for i in unclassed(c):
            log.get().warning(
                f"spec.sharedStorage.volumes[{i}].storageClassName is not set: an operator without "
                "--shared-storage-class (the chart's sharedStorage.storageClassName) refuses this cluster, and a "
                "cluster's default StorageClass usually refuses a ReadWriteMany claim; name a class, or pass "
                "--shared-storage-class to check as your operator would", cluster=f"{c.namespace}/{c.name}")
    return found


FILE_OPTION = click.option(
    "-f", "--filename", "filename", required=True, metavar="FILE",
    type=click.Path(exists=True, dir_okay=False, allow_dash=True),
    help="Manifest with one or more SlurmCluster documents ('-' reads stdin).")


@main.command("render")
@FILE_OPTION
@SHARED_STORAGE_CLASS_OPTION
@click.option("--keys-dir", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Read the munge, JWT and SSH host keys from DIR, generating any that are "
                   "missing. Without it every run generates new keys.")
def render_cmd(filename: str, keys_dir: Path | None, shared_storage_class: str | None) -> None:
    """Print every Kubernetes object of the clusters in FILE as one YAML stream.

    Like `helm template`: nothing is sent to a cluster. Pipe it to
    `kubectl apply -f -`, or read it to see what the operator would create.
    Secrets carry real keys: treat the output as secret.
    """
    try:
        found = _with_storage_classes(list(clusters(filename)), shared_storage_class)
    except InvalidSpec as exc:
        _fail(exc)
    if not found:
        raise click.UsageError(f"{filename} holds no SlurmCluster document")
    keys = load_keys(keys_dir)
    objs = [o for c in found for o in render(c, keys)]
    click.echo(dump_yaml(objs), nl=False)


@main.command("validate")
@FILE_OPTION
@SHARED_STORAGE_CLASS_OPTION
def validate_cmd(filename: str, shared_storage_class: str | None) -> None:
    """Check the SlurmClusters and NodeLendingPolicies in FILE; exit 1 with
    every problem, by field path."""
    try:
        found: list[SlurmCluster | NodeLendingPolicy] = [
            *_with_storage_classes(list(clusters(filename)), shared_storage_class), *policies(filename)]
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
                         help="Serve the liveness probe on PORT at /healthz (it also says who leads)."),
            click.option("--lease-namespace", envvar="POD_NAMESPACE", default=None, metavar="NS",
                         help="Leader election: of the replicas, only the one holding the Lease in NS acts; "
                              "the others stand by and take over within 15 s of the leader's loss "
                              "(default $POD_NAMESPACE, which the chart sets)."),
            click.option("--no-leader-election", is_flag=True,
                         help="Act without a Lease. Run exactly one replica then: two would both act."),
            click.option("--lease-duration", type=click.IntRange(LEASE_SECONDS_MIN, LEASE_SECONDS_MAX), default=15,
                         show_default=True, metavar="SECONDS",
                         help="How long a standby waits without seeing a renewal before it takes the Lease; the "
                              "leader renews every 2/15 of it and stops acting past 2/3 of it without a renewal "
                              "(client-go's 15/10/2 s)."),
            # The operator, its webhook and the bridge judge a SlurmCluster by one rule with one setting.
            click.option("--trusted-repository", "trusted_repositories", multiple=True, metavar="REPOSITORY",
                         help=f"An image repository a privileged slurmd (spec.slurmConfig.cgroups) may come from "
                              f"(repeatable; default {PROJECT_REPOSITORY}): your registry's copy of the project's "
                              "images. A SlurmCluster with cgroups and another spec.slurm.image.repository is "
                              "invalid. Give the operator and the bridge the same list (the chart does): the "
                              "bridge takes back the nodes lent to a cluster it finds invalid."),
        ]):
            f = option(f)
        return f
    return decorate


def _release_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A Helm release name, or a usage error saying what one is (it names the Leases)."""
    if value is not None:
        try:
            lease_name("operator", value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    return value


def _lease_namespace(namespace: str | None, off: bool) -> str | None:
    """Where the Lease is (None: no election), or a usage error saying what to pass."""
    if off:
        return None
    if not namespace:
        raise click.UsageError("leader election needs a namespace for its Lease: pass --lease-namespace NS "
                               "(in a pod, $POD_NAMESPACE), or --no-leader-election to run a single replica")
    return namespace


def _webhook_cert_options(prefix: str):
    """Where the webhook's certificate comes from: a mounted directory, or a Secret this
    process keeps (decision record 53). ``prefix``: "webhook-" on the operator, "" on
    ``slurmk8s webhook``."""
    def decorate(f):
        for option in reversed([
            click.option(f"--{prefix}cert-dir", type=click.Path(file_okay=False), default=None, metavar="DIR",
                         help="Where the webhook's tls.crt and tls.key are: a kubernetes.io/tls Secret mounted "
                              f"(cert-manager's). Without it and without --{prefix}secret: /etc/slurmk8s/webhook."),
            click.option(f"--{prefix}secret", default=None, metavar="NAME",
                         help="Keep the webhook's CA and serving certificate in this Secret (which must exist) "
                              "and renew them before they expire; with "
                              f"--{prefix}configuration and --{prefix}service."),
            click.option(f"--{prefix}configuration", default=None, metavar="NAME",
                         help="The ValidatingWebhookConfiguration whose caBundle is kept equal to the Secret's CA."),
            click.option(f"--{prefix}service", default=None, metavar="NAME",
                         help="The webhook's Service, whose names the serving certificate is for."),
            click.option(f"--{prefix}namespace", envvar="POD_NAMESPACE", default=None, metavar="NS",
                         help="Namespace of that Secret and Service (default $POD_NAMESPACE, which the chart sets)."),
        ]):
            f = option(f)
        return f
    return decorate


def _kept_certificate(prefix: str, cert_dir: str | None, secret: str | None, configuration: str | None,
                      service: str | None, namespace: str | None):
    """The certificate the process keeps (KeptCertificate), None for one mounted, or a usage error."""
    from .operator.webhookmain import KeptCertificate

    given = [secret, configuration, service]
    if not any(given):
        return None
    if not all(given):
        raise click.UsageError(f"to keep the webhook's certificate, pass --{prefix}secret, "
                               f"--{prefix}configuration and --{prefix}service together")
    if cert_dir:
        raise click.UsageError(f"pass --{prefix}cert-dir (a mounted certificate) or --{prefix}secret (one this "
                               "process keeps), not both")
    if not namespace:
        raise click.UsageError(f"--{prefix}secret needs the namespace it is in: --{prefix}namespace NS "
                               "(in a pod, $POD_NAMESPACE)")
    assert secret and configuration and service
    return KeptCertificate(namespace, secret, configuration, service)


@main.command("operator")
@_controller_options("SlurmClusters", "Watch")
@click.option("--interval", type=click.FloatRange(1, 3600), default=10.0, show_default=True, metavar="SECONDS",
              help="Seconds between rounds for each SlurmCluster (besides rounds on every change).")
@click.option("--release-namespace", default=None, metavar="NS",
              help="Namespace of the operator and bridge pods (the Helm release's). With --release-name, "
                   "each cluster gets a NetworkPolicy that admits only them to its Slurm agent.")
@click.option("--release-name", default=None, metavar="NAME", callback=_release_name,
              help="The Helm release (their app.kubernetes.io/instance label). It also names the Lease: "
                   "slurmk8s-operator-NAME (without it, slurmk8s-operator).")
@click.option("--webhook-port", type=click.IntRange(1, 65535), default=None, metavar="PORT",
              help="Serve the validating admission webhook for SlurmClusters and NodeLendingPolicies on PORT "
                   "(HTTPS, POST /validate), so that `kubectl apply` of a spec the operator would refuse is "
                   "refused at once. The chart registers it (webhook.enabled).")
@_webhook_cert_options("webhook-")
@click.option("--shared-storage-class", default=None, metavar="CLASS", callback=_storage_class,
              help="The StorageClass of a shared volume's claim whose spec names none: one that provisions "
                   "ReadWriteMany volumes (NFS, EFS, Filestore, Azure Files). Without it such a SlurmCluster is "
                   "refused (by the webhook too), naming the field: a cluster's default class is usually block "
                   "storage, which leaves a ReadWriteMany claim Pending. The chart passes "
                   "sharedStorage.storageClassName.")
def operator_cmd(namespaces: tuple[str, ...], all_namespaces: bool, kubeconfig: str | None,
                 metrics_port: int | None, health_port: int | None, lease_namespace: str | None,
                 no_leader_election: bool, lease_duration: int, interval: float,
                 release_namespace: str | None, release_name: str | None,
                 trusted_repositories: tuple[str, ...], webhook_port: int | None,
                 webhook_cert_dir: str | None, webhook_secret: str | None, webhook_configuration: str | None,
                 webhook_service: str | None, webhook_namespace: str | None, shared_storage_class: str | None) -> None:
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

    Of several replicas only the one holding the Lease
    `slurmk8s-operator-<release>` acts; the others serve the webhook and stand by.

    \b
      slurmk8s operator --namespace hpc --metrics-port 8080 --health-port 8081
      slurmk8s operator --all-namespaces --kubeconfig ~/.kube/config
    """
    if bool(namespaces) == all_namespaces:
        raise click.UsageError("pass --namespace NS (repeatable) or --all-namespaces, not both and not neither")
    if bool(release_namespace) != bool(release_name):
        raise click.UsageError("pass both --release-namespace and --release-name, or neither")
    lease = _lease_namespace(lease_namespace, no_leader_election)
    from .operator.main import run
    from .render.manifests import AgentClients

    kept = _kept_certificate("webhook-", webhook_cert_dir, webhook_secret, webhook_configuration, webhook_service,
                             webhook_namespace)
    clients = AgentClients(release_namespace, release_name) if release_namespace and release_name else None
    try:
        run(namespaces=namespaces, all_namespaces=all_namespaces, kubeconfig=kubeconfig,
            metrics_port=metrics_port, health_port=health_port, interval=interval, agent_clients=clients,
            trusted_repositories=trusted_repositories or (PROJECT_REPOSITORY,), webhook_port=webhook_port,
            webhook_cert_dir=webhook_cert_dir, webhook_kept=kept, lease_namespace=lease,
            lease_seconds=lease_duration, release_name=release_name, shared_storage_class=shared_storage_class)
    except KeyboardInterrupt:
        pass


@main.command("bridge")
@_controller_options("NodeLendingPolicies", "Act on")
@click.option("--interval", type=click.FloatRange(0.2, 600), default=2.0, show_default=True, metavar="SECONDS",
              help="Seconds between timed rounds (Slurm is read each round; it has no watch). Nodes, pods, "
                   "policies and clusters are watched: a change that matters starts a round at once.")
@click.option("--release-name", default=None, metavar="NAME", callback=_release_name,
              help="The Helm release; it names the Lease: slurmk8s-bridge-NAME (without it, slurmk8s-bridge).")
def bridge_cmd(namespaces: tuple[str, ...], all_namespaces: bool, kubeconfig: str | None,
               metrics_port: int | None, health_port: int | None, lease_namespace: str | None,
               no_leader_election: bool, lease_duration: int, trusted_repositories: tuple[str, ...],
               interval: float, release_name: str | None) -> None:
    """Run the node-lending bridge until stopped.

    Lends idle Kubernetes GPU nodes to Slurm partitions as NodeLendingPolicies
    say, and takes them back when Kubernetes needs them: the node is
    drained in Slurm, its jobs get the policy's signal and grace period to
    checkpoint, then are requeued (eligible again at once) and the node is
    handed back. Nodes, pods, policies and clusters are watched (list
    once, then watch); Slurm is read each round. Every node's lending state is kept on the Node itself, so
    the bridge can be stopped or killed at any time and picks up where it
    left off. Slurm is reached only through each cluster's agent.

    Of several replicas only the one holding the Lease
    `slurmk8s-bridge-<release>` acts; the others stand by.

    \b
      slurmk8s bridge --all-namespaces --metrics-port 8090 --health-port 8091
      slurmk8s bridge --namespace hpc --kubeconfig ~/.kube/config --interval 5
    """
    if bool(namespaces) == all_namespaces:
        raise click.UsageError("pass --namespace NS (repeatable) or --all-namespaces, not both and not neither")
    lease = _lease_namespace(lease_namespace, no_leader_election)
    from .bridge.main import run

    run(namespaces=namespaces, all_namespaces=all_namespaces, kubeconfig=kubeconfig,
        metrics_port=metrics_port, health_port=health_port, interval=interval, lease_namespace=lease,
        lease_seconds=lease_duration, release_name=release_name,
        trusted_repositories=trusted_repositories or (PROJECT_REPOSITORY,))


@main.command("webhook")
@click.option("--port", type=click.IntRange(1, 65535), required=True, metavar="PORT",
              help="Serve the validating admission webhook on PORT (HTTPS: POST /validate, GET /healthz).")
@click.option("--trusted-repository", "trusted_repositories", multiple=True, metavar="REPOSITORY",
              help=f"As the operator's (default {PROJECT_REPOSITORY}): give both the same list (the chart does).")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False),
              help="Kubeconfig to use, to keep the certificate (--secret). Default: the pod's service account "
                   "inside a cluster, else $KUBECONFIG or ~/.kube/config.")
@_webhook_cert_options("")
@click.option("--shared-storage-class", default=None, metavar="CLASS", callback=_storage_class,
              help="As the operator's: give both the same (the chart does).")
def webhook_cmd(port: int, trusted_repositories: tuple[str, ...], kubeconfig: str | None, cert_dir: str | None,
                secret: str | None, configuration: str | None, service: str | None, namespace: str | None,
                shared_storage_class: str | None) -> None:
    """Serve the validating admission webhook for SlurmClusters and NodeLendingPolicies, alone.

    The same webhook the operator serves with --webhook-port, in a process of
    its own: the chart runs it so with webhook.hostNetwork, on the nodes'
    network, where a control plane that cannot reach pod addresses reaches
    it, while the operator stays on the pod network. It reads and changes
    nothing in the cluster but, with --secret, its own certificate.

    \b
      slurmk8s webhook --port 9443 --cert-dir /etc/slurmk8s/webhook
      slurmk8s webhook --port 9443 --secret ops-slurmk8s-webhook-certs \\
          --configuration ops-slurmk8s-slurmk8s-system --service ops-slurmk8s-webhook
    """
    from .operator.webhookmain import DEFAULT_CERT_DIR, run

    kept = _kept_certificate("", cert_dir, secret, configuration, service, namespace)
    try:
        run(port, trusted_repositories or (PROJECT_REPOSITORY,),
            cert_dir=None if kept else (cert_dir or DEFAULT_CERT_DIR), kept=kept, kubeconfig=kubeconfig,
            shared_storage_class=shared_storage_class)
    except RuntimeError as exc:
        click.echo(f"webhook: {exc}", err=True)
        sys.exit(1)


@main.command("agent")
@click.option("--listen", default=f"0.0.0.0:{AGENT_PORT}", show_default=True, metavar="HOST:PORT",
              help="Address and port to serve on.")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path),
              default="/run/slurmk8s/agent/token", show_default=True, envvar="SLURMK8S_AGENT_TOKEN_FILE",
              help="File holding the bearer token (the mounted <cluster>-agent-token Secret).")
@click.option("--config-dir", type=click.Path(file_okay=False, path_type=Path), default="/etc/slurm",
              show_default=True, help="The Slurm config directory slurmctld reads; its hash is served.")
@click.option("--checkpoint-root", default=None, metavar="DIR",
              help="The cluster's checkpoint directory (shared storage, mounted read-only): model versions "
                   "jobs publish below it are served at /v1/published, for the bridge's rollouts.")
@click.option("--metrics-listen", default=f"0.0.0.0:{METRICS_PORT}", show_default=True, metavar="HOST:PORT",
              help="Where to serve Slurm's metrics (GET /metrics, no token; docs/metrics.md); 'off': nowhere.")
@click.option("--metrics-interval", default=15.0, show_default=True, type=click.FloatRange(min=1),
              help="Seconds between two readings of Slurm for the metrics (each is a squeue, a node "
                   "listing and an sdiag, and a sacctmgr with accounting), however often they are scraped.")
def agent_cmd(listen: str, token_file: Path, config_dir: Path, checkpoint_root: str | None, metrics_listen: str,
              metrics_interval: float) -> None:
    """Serve the Slurm agent: the operator's authenticated way to change Slurm.

    Runs beside slurmctld (a sidecar in its pod, with the munge key and
    /etc/slurm mounted) and offers only what the operator and the bridge
    need: list nodes and jobs, drain (reasons start with `slurmk8s:`),
    undrain (only slurmk8s's own drains), signal the jobs on a node, requeue
    a job and make it eligible at once, delete a node, reconfigure, and the
    hash of the config files it sees. Each runs through the local Slurm
    commands. Every request but GET /healthz needs the bearer token.

    It also serves Slurm's own metrics (nodes, GPUs, jobs, queue wait,
    scheduler, slurmdbd) for Prometheus on --metrics-listen, read once per
    --metrics-interval whoever scrapes.
    """
    import threading

    from prometheus_client.registry import CollectorRegistry

    from .metricsserver import serve_metrics
    from .slurm import SlurmClient
    from .slurm.agent import make_server, parse_listen, read_token
    from .slurm.metrics import SlurmMetrics

    try:
        token = read_token(token_file)
        slurm = SlurmClient(config_dir=config_dir, checkpoint_root=checkpoint_root)
        server = make_server(listen, slurm, token, checkpoint_root)
        if metrics_listen != "off":
            host, port = parse_listen(metrics_listen)
            registry = CollectorRegistry(auto_describe=False)
            collector = SlurmMetrics(slurm, interval=metrics_interval)
            registry.register(collector)
            serve_metrics(port, host, registry)
            threading.Thread(target=collector.run, args=(threading.Event(),), daemon=True,
                             name="slurm-metrics").start()
    except (ValueError, OSError) as exc:
        click.echo(f"agent: {exc}", err=True)
        sys.exit(1)
    log.get("slurmk8s.agent").info("serving the Slurm agent", url=server.url, config_dir=str(config_dir),
                                   metrics=metrics_listen)
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


def _label(ctx, param, values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{v!r} is not KEY=VALUE", ctx, param)
        out[key] = value
    return out


_TIMES = ("Latencies default to hack/bench_lending.py's medians measured on the sandbox with the real bridge "
          "and Slurm (lend 0.89 s; reclaim of an idle node: schedulable 0.16 s, pod Running 0.71 s; of a busy "
          "node 0.26 s / 0.84 s; resume 0.75 s).")


@main.command("simulate")
@click.option("--nodes", type=click.IntRange(1, 100000), default=64, show_default=True,
              help="GPU nodes in the cluster, Slurm's own and Kubernetes' together.")
@click.option("--gpus-per-node", type=click.IntRange(1, 64), default=8, show_default=True,
              help="GPUs on every node.")
@click.option("--slurm-nodes", type=click.IntRange(0, 100000), default=None,
              help="How many of the nodes Slurm owns outright; the rest serve Kubernetes and are the ones a "
                   "policy may lend.  [default: half of --nodes]")
@click.option("--jobs", "jobs_file", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              metavar="FILE", help="Training jobs, CSV with columns submit_time (or timestamp), duration (seconds) "
                                   "and num_gpus; submit_time in seconds or a timestamp such as 2017-10-09 "
                                   "07:01:55 (UTC). Other columns are ignored: the Philly trace reads as is.")
@click.option("--serving-pods", "pods_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              metavar="FILE", help="Serving demand as pods: CSV start,end,gpus (seconds from the window's start, "
                                   "or timestamps).")
@click.option("--serving-requests", "requests_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              metavar="FILE", help="Serving demand as an LLM request trace, CSV TIMESTAMP,ContextTokens,"
                                   "GeneratedTokens (the Azure LLM inference traces), turned into replicas: each "
                                   "--autoscale-window of the trace needs ceil(tokens/s x scale / "
                                   "(--tokens-per-gpu-second x --target-utilisation) / --gpus-per-replica) pods; "
                                   "scale makes the busiest window need --serving-peak-gpus; the trace's span is "
                                   "stretched over the simulated window.")
@click.option("--serving-rate", "rates_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              metavar="FILE", help="Serving demand as a request-rate series, CSV t_s (seconds from the window's "
                                   "start, a midnight; or timestamps, placed by their time of day) and rate_rps "
                                   "(requests per second), one row per window (ServeGen's aggregates), replayed "
                                   "at its own clock, not stretched: each window needs ceil(rate x scale / "
                                   "(--requests-per-gpu-second x --target-utilisation) / --gpus-per-replica) pods; "
                                   "scale makes the busiest window need --serving-peak-gpus. A window of rate 0 "
                                   "(or under 1% of the median rate) is a gap in the record, not an idle service: "
                                   "it keeps the rate of the window before. The series must cover the window "
                                   "(--days).")
@click.option("--policy", "policy_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              metavar="FILE", help="A NodeLendingPolicy YAML, validated as the bridge validates it; repeat for "
                                   "several. Its SlurmCluster (clusterRef) is simulated with the policy's "
                                   "partition taking lent nodes. With spec.forecast the policy lends with "
                                   "foresight (decision record 40): quantilePercent, headroomSeconds, "
                                   "reserveSeconds, and the seasonal settings seasonalDays (also forecast from "
                                   "the same time of day on that many past days; default 7, 0: off) and "
                                   "seasonalWeeks (and from the same time of the week, that many weeks back; "
                                   "default 4, 0: off). The simulated clock starts on a Monday at midnight UTC.")
@click.option("--compare", is_flag=True, help="Also run the static split (nothing lent) and the oracle (knows "
                                              "future serving demand: lends a node only for jobs that end before "
                                              "serving needs it, at no latency; the upper bound), and print ratios.")
@click.option("--start", default=None, metavar="TIME", help="The window's start (a timestamp, or seconds as the "
                                                            "jobs file has them).  [default: the first submission]")
@click.option("--days", type=click.FloatRange(0.001, 3650), default=None,
              help="The window's length; jobs submitted in it are simulated, and the simulation ends with it. "
                   "[default: to the last submission]")
@click.option("--json", "json_file", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Write the figures as JSON: {inputs, runs: [{name, queueing_delay_mean_s, "
                   "queueing_delay_p95_s, jct_mean_s, gpu_hours_used, gpu_hours_available, serving_pending_p99_s, "
                   "serving_pending_max_s, reclaims, lost_gpu_hours, ...}]}.")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Write PNG plots into DIR: utilisation over time (serving / own Slurm / lent), the CDF of "
                   "queueing delay per run, lent nodes over time. Needs matplotlib: pip install 'slurmk8s[plot]'.")
@click.option("--node-label", "node_labels", multiple=True, callback=_label, metavar="KEY=VALUE",
              help="A label on every simulated Kubernetes node, beyond those the policy's nodeSelector asks for.")
@click.option("--tokens-per-gpu-second", type=click.FloatRange(1, None, min_open=False), default=2500.0,
              show_default=True, help="--serving-requests: tokens (prompt + generated) one GPU serves per second.")
@click.option("--target-utilisation", type=click.FloatRange(0.01, 1.0), default=0.6, show_default=True,
              help="--serving-requests, --serving-rate: the fraction of that throughput the autoscaler runs "
                   "replicas at.")
@click.option("--requests-per-gpu-second", type=click.FloatRange(0.001, None), default=5.0, show_default=True,
              help="--serving-rate: requests one GPU serves per second (with --serving-peak-gpus it only "
                   "rounds: the rate is scaled to the peak).")
@click.option("--gpus-per-replica", type=click.IntRange(1, 64), default=1, show_default=True,
              help="--serving-requests, --serving-rate: GPUs each serving pod asks for.")
@click.option("--autoscale-window", type=click.FloatRange(1, None), default=60.0, show_default=True,
              metavar="SECONDS", help="--serving-requests: the autoscaler's averaging window, in the request "
                                      "trace's own seconds.")
@click.option("--serving-peak-gpus", type=click.IntRange(1, None), default=None,
              help="--serving-requests, --serving-rate: GPUs serving needs in the trace's busiest window (the "
                   "request rate is scaled to it).  [default: all GPUs of the Kubernetes nodes]")
@click.option("--serving-daily-cycle", is_flag=True,
              help="--serving-requests: repeat the trace's hour every hour, times a profile of the day (a raised "
                   "cosine, 0.35 of the peak at 04:00, the peak at 16:00: an assumption, not a measurement; "
                   "slurmk8s/simulate/traces.py), instead of stretching the hour over the window.")
@click.option("--lend-seconds", type=click.FloatRange(0, None), default=Latencies.lend, show_default=True,
              help="slurmd pod created -> its node registered in Slurm. " + _TIMES)
@click.option("--reclaim-seconds", type=click.FloatRange(0, None), default=Latencies.reclaim, show_default=True,
              help="Node handed back (untainted) -> Kubernetes schedules pods on it.")
@click.option("--pod-start-seconds", type=click.FloatRange(0, None), default=Latencies.pod_start, show_default=True,
              help="Serving pod bound -> Running (the measured 0.71 s to Running less 0.16 s to schedulable).")
@click.option("--requeue-seconds", type=click.FloatRange(0, None), default=Latencies.requeue, show_default=True,
              help="A requeued or cancelled job's end on its node (the measured busy 0.26 s less idle 0.16 s).")
@click.option("--restart-seconds", type=click.FloatRange(0, None), default=Latencies.restart, show_default=True,
              help="Restart overhead: a requeued job starting again -> doing work (measured resume). Real "
                   "training jobs reloading a model take longer: set yours.")
@click.option("--checkpoint-seconds", type=click.FloatRange(0, None), default=Latencies.checkpoint, show_default=True,
              help="A signalled job's checkpoint takes this long; requeued before it is written, the job loses "
                   "all its work, after it only the work since the signal. A workload property, not measured.")
@click.option("--interval", type=click.FloatRange(0.1, 3600), default=Latencies.interval, show_default=True,
              metavar="SECONDS",
              help="Seconds between the bridge's periodic rounds (beside the round 50 ms after every change "
                   "it watches); time-based rules (idleAfterSeconds, grace, windows) fire on these.")
@click.option("--queue-depth", type=click.IntRange(1, 100000), default=100, show_default=True,
              help="Pending jobs Slurm's scheduler looks at per pass (Slurm's default_queue_depth).")
@click.option("--time-limits", type=click.Choice(["runtime", "none"]), default="runtime", show_default=True,
              help="The jobs' time limits, which Slurm's backfill plans with: runtime (each job's limit is its "
                   "runtime: EASY backfill, a reservation for the first job that cannot start) or none (no "
                   "reservation in sight: every job that fits starts, in submission order).")
@click.option("--progress/--no-progress", default=True, show_default=True, help="A progress bar per run on stderr.")
def simulate_cmd(nodes: int, gpus_per_node: int, slurm_nodes: int | None, jobs_file: Path, pods_file: Path | None,
                 requests_file: Path | None, rates_file: Path | None, policy_files: tuple[str, ...], compare: bool, start: str | None,
                 days: float | None, json_file: Path | None, plot_dir: Path | None, node_labels: dict[str, str],
                 tokens_per_gpu_second: float, target_utilisation: float, requests_per_gpu_second: float,
                 gpus_per_replica: int,
                 autoscale_window: float, serving_peak_gpus: int | None, serving_daily_cycle: bool, lend_seconds: float,
                 reclaim_seconds: float, pod_start_seconds: float, requeue_seconds: float, restart_seconds: float,
                 checkpoint_seconds: float, interval: float, queue_depth: int, time_limits: str,
                 progress: bool) -> None:
    """What lending policies would have done on a trace, with the bridge's own decisions.

    A discrete-event simulation of GPU nodes, a Kubernetes serving workload
    and a Slurm training queue (FIFO with backfill, gang allocation). At every
    bridge round it calls the bridge's own decide() with each policy, as the
    bridge does, and applies its actions. Prints one table: training queueing
    delay and JCT, GPU-hours used, serving pods' pending time, reclaims and
    work lost, with ratios against the static split and the oracle.

    \b
      slurmk8s simulate --nodes 64 --slurm-nodes 32 --days 30
        --jobs philly.csv --serving-requests azure_llm_conv.csv
        --policy examples/simulate/idle-5m.yaml --compare
        --json out.json --plot out/
    """
    from .simulate.compare import _stderr_progress, load_inputs, run_all, summaries
    from .simulate.engine import Shape
    from .simulate.report import plot, table, write_json
    from .simulate.traces import RequestModel, TraceError, parse_when

    if sum(f is not None for f in (pods_file, requests_file, rates_file)) != 1:
        raise click.UsageError("give the serving demand: exactly one of --serving-pods FILE, --serving-requests FILE "
                               "or --serving-rate FILE")
    slurm_nodes = nodes // 2 if slurm_nodes is None else slurm_nodes
    if slurm_nodes > nodes:
        raise click.BadParameter(f"{slurm_nodes} is more than --nodes {nodes}", param_hint="--slurm-nodes")
    pols = []
    try:
        for f in policy_files:
            found = list(policies(f))
            if not found:
                raise click.BadParameter(f"{f} holds no NodeLendingPolicy document", param_hint="--policy")
            pols += found
    except InvalidSpec as exc:
        _fail(exc)
    try:
        t0 = parse_when(start) if start is not None else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--start") from None
    shape = Shape(nodes, gpus_per_node, slurm_nodes)
    model = RequestModel(tokens_per_gpu_second, target_utilisation, gpus_per_replica, autoscale_window,
                         serving_peak_gpus if serving_peak_gpus is not None else shape.kube_nodes * gpus_per_node,
                         serving_daily_cycle, requests_per_gpu_second)
    try:
        inputs = load_inputs(shape, jobs_file, pods_file, requests_file, t0, days, model, rates_file)
    except TraceError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    if not inputs.jobs:
        raise click.UsageError(f"no job of {jobs_file} is submitted in the window; check --start and --days")
    lat = Latencies(lend=lend_seconds, reclaim=reclaim_seconds, pod_start=pod_start_seconds, requeue=requeue_seconds,
                    restart=restart_seconds, checkpoint=checkpoint_seconds, interval=interval)
    click.echo(f"{len(inputs.jobs):,} jobs and {len(inputs.pods):,} serving pods over {inputs.span / 86400:.1f} days; "
               f"{nodes} nodes x {gpus_per_node} GPUs, {slurm_nodes} Slurm's own", err=True)
    try:
        results = run_all(inputs, pols, compare, lat, node_labels, queue_depth, time_limits == "runtime",
                          progress=_stderr_progress(inputs.span) if progress else (lambda name: None))
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    runs = summaries(results)
    click.echo(table(runs))
    if json_file is not None:
        write_json(json_file, runs, {**inputs.described, "latencies": lat.__dict__, "queue_depth": queue_depth,
                                     "time_limits": time_limits})
        click.echo(f"wrote {json_file}", err=True)
    if plot_dir is not None:
        try:
            files = plot(plot_dir, results)
        except ModuleNotFoundError:
            click.echo("error: --plot needs matplotlib: pip install 'slurmk8s[plot]' (or pip install matplotlib)", err=True)
            sys.exit(1)
        click.echo("wrote " + ", ".join(map(str, files)), err=True)


if __name__ == "__main__":
    main()
