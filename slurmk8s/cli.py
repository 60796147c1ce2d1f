"""The ``slurmk8s`` command."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from . import __version__, log
from .api import InvalidSpec
from .api.crd import all_crds, crd_filename, dump_yaml
from .manifest import clusters
from .render import ClusterKeys, render

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
KEY_FILES = {"munge_key": "munge.key", "jwt_key": "jwt_hs256.key", "ssh_host_key": "ssh_host_ed25519_key"}


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
    """Keys from ``directory``; any missing ones are generated and written there."""
    fresh = ClusterKeys.generate()
    if directory is None:
        log.get().info("generated fresh cluster keys; pass --keys-dir to keep them between renders")
        return fresh
    directory.mkdir(parents=True, exist_ok=True)
    values = {}
    for attr, filename in KEY_FILES.items():
        path = directory / filename
        if path.exists():
            values[attr] = path.read_bytes()
        else:
            values[attr] = getattr(fresh, attr)
            path.write_bytes(values[attr])
            path.chmod(0o600)
            log.get().info("generated key", path=str(path))
    return ClusterKeys(**values)


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
    """Check the SlurmClusters in FILE; exit 1 with every problem, by field path."""
    try:
        found = list(clusters(filename))
    except InvalidSpec as exc:
        _fail(exc)
    if not found:
        raise click.UsageError(f"{filename} holds no SlurmCluster document")
    for c in found:
        click.echo(f"SlurmCluster {c.namespace}/{c.name} is valid")


@main.command("crd")
@click.option("--write", "write_dir", type=click.Path(file_okay=False, path_type=Path),
              metavar="DIR", help="Write one file per CRD into DIR instead of printing them.")
def crd_cmd(write_dir: Path | None) -> None:
    """Print the CustomResourceDefinitions, generated from the typed API models.

    The chart's copies are made with: slurmk8s crd --write charts/slurmk8s/crds
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


if __name__ == "__main__":
    main()
