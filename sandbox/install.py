"""The product, installed in the sandbox the way a platform engineer installs
it: the Helm chart (``charts/slurmk8s``), through the real Helm engine
(``helm-python-sdk``), into the sandbox's API server with the administrator's
kubeconfig. The operator and the bridge then run as the chart's Deployments'
pods, under the chart's ServiceAccounts and RBAC, like on any cluster.

``values`` is pure; ``install`` is the thin call into Helm.
"""

from __future__ import annotations

from pathlib import Path

from .apiserver.storage import SHARED_CLASS

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "slurmk8s"
RELEASE = "slurmk8s"
RELEASE_NAMESPACE = "slurmk8s-system"
#: Where examples/monitoring/prometheus.yaml runs Prometheus.
MONITORING_NAMESPACE = "monitoring"


class InstallFailed(RuntimeError):
    """Helm refused or failed the install; the message says why."""


def values(cluster_namespace: str, operator_interval: float = 3, bridge_interval: float = 1) -> dict:
    """The chart values the sandbox installs with: the operator and the bridge
    watch the SlurmCluster's namespace; rounds are shorter than the chart's
    defaults so the sandbox reacts quickly; logs are for people. The
    Prometheus of ``examples/monitoring/`` (namespace ``monitoring``) may
    scrape the operator and the bridge through the chart's NetworkPolicies. A
    shared volume that names no StorageClass gets the stand-in's ReadWriteMany
    class, as a site names its NFS or EFS class (its default refuses them)."""
    return {
        "watchNamespaces": [cluster_namespace],
        "sharedStorage": {"storageClassName": SHARED_CLASS},
        "interval": operator_interval,
        "logFormat": "console",
        "bridge": {"interval": bridge_interval},
        "networkPolicy": {"metricsFrom": [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": MONITORING_NAMESPACE}}}]},
    }


def _helm():
    try:
        import helm_python
    except ImportError:
        raise InstallFailed("the sandbox installs the chart with the Helm engine of the helm-python-sdk package: "
                            "pip install -e ./sandbox in the checkout (hack/setup.sh does)") from None
    return helm_python


def next_step(status: str | None) -> str:
    """What ``helm upgrade --install`` must do for a release in ``status``
    (None: no release). Pure. An install or upgrade that was interrupted
    (its process killed) leaves the release pending, and Helm refuses every
    further operation on it ("another operation is in progress"): a pending
    install is removed and installed again, a pending upgrade is rolled back
    first, as an administrator would."""
    if status is None or status == "uninstalled":
        return "install"
    if status == "pending-install":
        return "reinstall"
    if status in ("pending-upgrade", "pending-rollback"):
        return "rollback"
    return "upgrade"  # deployed, failed, superseded


def install(kubeconfig: Path, chart_values: dict, *, chart: Path = CHART, release: str = RELEASE,
            namespace: str = RELEASE_NAMESPACE, timeout: int = 120) -> dict:
    """``helm upgrade --install``: install the release, or upgrade it when it
    exists (a newer chart or other values; unchanged, Helm changes nothing).
    Returns Helm's release summary."""
    helm = _helm()
    with helm.Config(kubeconfig_path=str(kubeconfig), namespace=namespace) as cfg:
        try:
            found = [r for r in cfg.list(all_states=True) if r.get("name") == release]
            step = next_step(found[0].get("status") if found else None)
            if step == "reinstall":
                cfg.uninstall(release, ignore_not_found=True)
            elif step == "rollback":
                cfg.rollback(release)
            if step in ("install", "reinstall"):
                return cfg.install(str(chart), release, chart_values, namespace=namespace, create_namespace=True,
                                   timeout=timeout)
            return cfg.upgrade(str(chart), release, chart_values, namespace=namespace, timeout=timeout)
        except helm.HelmError as exc:
            raise InstallFailed(f"helm could not install {chart} as release {namespace}/{release}: {exc}") from None


def uninstall(kubeconfig: Path, *, release: str = RELEASE, namespace: str = RELEASE_NAMESPACE) -> dict | None:
    """``helm uninstall``; None when there is no such release."""
    helm = _helm()
    with helm.Config(kubeconfig_path=str(kubeconfig), namespace=namespace) as cfg:
        return cfg.uninstall(release, ignore_not_found=True)
