"""The chart's webhook served in the stand-in as the operator serves it: the
chart's Service, ValidatingWebhookConfiguration, empty certificate Secret and
the RBAC to keep it, applied as rendered; the webhook server and its
certificate keeper (slurmk8s/operator/webhookmain.py) on this host, calling
the API with the operator ServiceAccount's own token; and a Ready pod the
Service selects, at 127.0.0.1 on the server's port."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path

import yaml

from slurmk8s.kube import Kube
from slurmk8s.operator.webhookmain import KeptCertificate, Webhook, start

from .conftest import Cluster, wait_for


class ChartWebhook:
    def __init__(self, cluster: Cluster, rendered: list[dict], namespace: str, workdir: Path,
                 pod_name: str = "operator", shared_storage_class: str | None = None):
        self.cluster, self.namespace = cluster, namespace
        self.shared_storage_class = shared_storage_class
        by_kind = {}
        for o in rendered:
            by_kind.setdefault(o["kind"], []).append(o)
        self.config = by_kind["ValidatingWebhookConfiguration"][0]
        hook = self.config["webhooks"][0]["clientConfig"]["service"]
        self.service = next(o for o in by_kind["Service"] if o["metadata"]["name"] == hook["name"])
        self.secret = next(o for o in by_kind["Secret"] if o["metadata"]["name"].endswith("-webhook-certs"))
        keeping = [o for o in rendered if o["metadata"]["name"].endswith("-webhook-certs")
                   and o["kind"] in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")]
        sa_name = next(o for o in keeping if o["kind"] == "RoleBinding")["subjects"][0]["name"]
        account = next(o for o in by_kind["ServiceAccount"] if o["metadata"]["name"] == sa_name)
        if namespace not in {n.metadata.name for n in cluster.core.list_namespace().items}:
            cluster.core.create_namespace({"metadata": {"name": namespace}})
        self.applied = [account, self.secret, self.service, *keeping, self.config]
        for obj in self.applied:
            cluster.kubectl("apply", "-f", "-", stdin=json.dumps(obj))
        # The operator's own token: the keeper may do only what the chart grants it.
        kubeconfig = copy.deepcopy(cluster.srv.kubeconfig())
        kubeconfig["users"][0]["user"]["token"] = cluster.srv.issue_token(namespace, sa_name)
        path = workdir / f"kubeconfig-{sa_name}"
        path.write_text(yaml.safe_dump(kubeconfig))
        self.kube = Kube.from_kubeconfig(str(path))
        self.kept = KeptCertificate(namespace, self.secret["metadata"]["name"], self.config["metadata"]["name"],
                                    self.service["metadata"]["name"])
        self.hooks: list[Webhook] = []
        self.serve(pod_name)

    def serve(self, pod_name: str) -> Webhook:
        """One more replica: a server, its keeper, and its Ready pod."""
        hook = start(0, kept=self.kept, kube=self.kube, addr="127.0.0.1",
                     shared_storage_class=self.shared_storage_class)
        self.hooks.append(hook)
        c = self.cluster
        c.core.create_namespaced_pod(self.namespace, {
            "metadata": {"name": pod_name, "labels": self.service["spec"]["selector"]},
            "spec": {"containers": [{"name": "operator", "image": "x",
                                     "ports": [{"name": "webhook", "containerPort": hook.port}]}]}})
        c.core.patch_namespaced_pod_status(pod_name, self.namespace, {"status": {
            "phase": "Running", "podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}})
        wait_for("the webhook configuration's caBundle", self.ca_bundle)
        return hook

    def live_config(self) -> dict:
        return self.cluster.kubectl_json("get", "validatingwebhookconfiguration", self.config["metadata"]["name"])

    def ca_bundle(self) -> bytes | None:
        """The configuration's caBundle (decoded), once every webhook of it has the same one."""
        bundles = {h["clientConfig"].get("caBundle") for h in self.live_config()["webhooks"]}
        one = bundles.pop() if len(bundles) == 1 else None
        return base64.b64decode(one) if one else None

    def secret_data(self) -> dict[str, bytes]:
        data = self.cluster.core.read_namespaced_secret(self.secret["metadata"]["name"], self.namespace).data or {}
        return {k: base64.b64decode(v) for k, v in data.items()}

    def stop(self) -> None:
        for hook in self.hooks:
            hook.stop()
        self.cluster.kubectl("delete", "validatingwebhookconfiguration", self.config["metadata"]["name"],
                             "--ignore-not-found")
