{{/*
Names, labels and the image reference shared by every template of the chart.
*/}}

{{/* The chart name, or .Values.nameOverride. */}}
{{- define "slurmk8s.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every object name: .Values.fullnameOverride, else the release
name, suffixed with the chart name unless the release name already holds it.
Kubernetes names are at most 63 characters for some kinds, so it is cut there.
*/}}
{{- define "slurmk8s.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* chart-version, as the helm.sh/chart label wants it. */}}
{{- define "slurmk8s.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels that select one component's pods, given (list $ component) where the
component is "operator" or "bridge"; never change them after a release exists.
*/}}
{{- define "slurmk8s.componentSelectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "slurmk8s.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* Labels on every object of one component, given (list $ component). */}}
{{- define "slurmk8s.componentLabels" -}}
{{- $ := index . 0 -}}
helm.sh/chart: {{ include "slurmk8s.chart" $ }}
{{ include "slurmk8s.componentSelectorLabels" . }}
app.kubernetes.io/version: {{ $.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: slurmk8s
app.kubernetes.io/managed-by: {{ $.Release.Service }}
{{- end }}

{{/* Labels that select the operator's pods. */}}
{{- define "slurmk8s.selectorLabels" -}}
{{- include "slurmk8s.componentSelectorLabels" (list . "operator") }}
{{- end }}

{{/* Labels on the operator's objects. */}}
{{- define "slurmk8s.labels" -}}
{{- include "slurmk8s.componentLabels" (list . "operator") }}
{{- end }}

{{/*
The name of a ServiceAccount, given (list serviceAccountValues defaultName):
its name value, else defaultName when the chart creates it, else "default".
*/}}
{{- define "slurmk8s.serviceAccountNameOf" -}}
{{- $sa := index . 0 }}
{{- if $sa.create }}
{{- default (index . 1) $sa.name }}
{{- else }}
{{- default "default" $sa.name }}
{{- end }}
{{- end }}

{{/* The ServiceAccount the operator runs as. */}}
{{- define "slurmk8s.serviceAccountName" -}}
{{- include "slurmk8s.serviceAccountNameOf" (list .Values.serviceAccount (include "slurmk8s.fullname" .)) }}
{{- end }}

{{/* repository:tag of the controller image; the tag defaults to the chart's appVersion. */}}
{{- define "slurmk8s.image" -}}
{{- if regexMatch "@|:[^/]*$" .Values.image.repository }}
{{- fail (printf "image.repository %q holds a tag or digest: set image.repository to the part before it and image.tag to the tag" .Values.image.repository) }}
{{- end }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
The namespaces whose SlurmClusters the operator watches, as a JSON list (read
it with fromJsonArray): watchNamespaces, or the release namespace when that
is empty; an empty list means every namespace (watchAllNamespaces).
*/}}
{{- define "slurmk8s.namespaces" -}}
{{- if .Values.watchAllNamespaces }}
{{- if .Values.watchNamespaces }}
{{- fail (printf "watchAllNamespaces is true and watchNamespaces lists %s: empty watchNamespaces to watch every namespace, or set watchAllNamespaces=false to watch only those" (join ", " .Values.watchNamespaces)) }}
{{- end }}
{{- toJson list }}
{{- else if .Values.watchNamespaces }}
{{- toJson .Values.watchNamespaces }}
{{- else }}
{{- toJson (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{/*
What the operator does inside each namespace it watches, exactly as
slurmk8s/operator/permissions.py declares it (tests/test_chart.py compares them): the
SlurmClusters themselves, the kinds `slurmk8s render` produces, their pods
and Events. Used by one Role per watched namespace, or by a ClusterRole with
watchAllNamespaces. No pods/exec: slurmctld is reached through the cluster's
authenticated agent Service. No update but on slurmclusters/finalizers (the
operator writes with server-side apply and merge patches), no wildcards.
*/}}
{{- define "slurmk8s.namespacedRules" -}}
# kopf lists and watches SlurmClusters, and patches its finalizer and its
# bookkeeping annotations onto them.
- apiGroups: ["slurmk8s.dev"]
  resources: ["slurmclusters"]
  verbs: ["list", "watch", "patch"]
# Report phase, conditions and configHash in .status.
- apiGroups: ["slurmk8s.dev"]
  resources: ["slurmclusters/status"]
  verbs: ["patch"]
# Rendered objects carry an ownerReference to their SlurmCluster with
# blockOwnerDeletion, which the OwnerReferencesPermissionEnforcement
# admission plugin allows only with update on the owner's finalizers.
- apiGroups: ["slurmk8s.dev"]
  resources: ["slurmclusters/finalizers"]
  verbs: ["update"]
# Rendered ConfigMaps (slurm.conf, gres.conf, users), Services (controller,
# workers, login, restapi) and PersistentVolumeClaims (shared storage): listed
# by the cluster's label, applied (server-side apply is a patch, and also
# needs create when it creates the object), deleted when a spec change drops
# them and at teardown.
- apiGroups: [""]
  resources: ["configmaps", "services", "persistentvolumeclaims"]
  verbs: ["list", "create", "patch", "delete"]
# The generated munge, JWT, SSH host key and agent token Secrets: read by
# name every round, created once and never updated (immutable), deleted at
# teardown. No list or watch: the operator cannot enumerate other workloads'
# Secrets.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create", "delete"]
# A ConfigMap the spec names (spec.identity.ldap.ca.configMap), read by name
# to check it is labelled for that use before it is mounted. Never listed.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get"]
# The cluster's pods, listed by its label: drain annotations and the
# slurmk8s.dev/slurm-busy label the busy-worker PodDisruptionBudget selects
# are patched on; drain-first scale-in deletes a worker only once drained.
# No pods/exec, no pods/eviction.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "patch", "delete"]
# slurmctld and worker StatefulSets (scaled with a patch), login and
# slurmrestd Deployments.
- apiGroups: ["apps"]
  resources: ["statefulsets", "deployments"]
  verbs: ["list", "create", "patch", "delete"]
# PodDisruptionBudgets that protect busy workers and login pods.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["list", "create", "patch", "delete"]
# The NetworkPolicy that admits only the operator and the bridge to each
# cluster's Slurm agent port.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["list", "create", "patch", "delete"]
# Events about reconciliation, drains and errors on the SlurmCluster, as kopf
# posts them (core API, created once each); listed (reason FailedCreate)
# while a workload is short of pods, to say why its pods were refused.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "list"]
{{- end }}

{{/*
Arguments of the controller image's entrypoint, i.e. of `slurmk8s`, for one
long-running command, given (list $ command componentValues namespaces):
the global options first, then the command with the component's metrics and
health ports, `--namespace N` per namespace, or `--all-namespaces` when the
list is empty, and `--interval`.
*/}}
{{- define "slurmk8s.commandArgs" -}}
{{- $ := index . 0 }}
{{- $values := index . 2 -}}
- --log-level
- {{ $.Values.logLevel | quote }}
- --log-format
- {{ $.Values.logFormat | quote }}
- {{ index . 1 }}
- --metrics-port
- {{ $values.metrics.port | int | quote }}
- --health-port
- {{ $values.health.port | int | quote }}
{{- range index . 3 }}
- --namespace
- {{ . | quote }}
{{- else }}
- --all-namespaces
{{- end }}
- --interval
- {{ $values.interval | toString | quote }}
- --lease-namespace
- {{ $.Release.Namespace | quote }}
- --lease-duration
- {{ $.Values.leaderElection.leaseDurationSeconds | int | quote }}
{{- end }}

{{/*
Where a privileged slurmd's image may come from: the operator (and its
webhook) and the bridge judge a SlurmCluster by one rule, with this one
setting, so that a cluster the operator runs is one the bridge can load.
*/}}
{{- define "slurmk8s.trustedRepositoryArgs" -}}
{{- range .Values.trustedRepositories }}
- --trusted-repository
- {{ . | quote }}
{{- end }}
{{- end }}

{{/*
The class of a shared claim whose spec names none; without it such a
SlurmCluster is refused. The operator's rounds and the webhook, wherever it
runs, judge with the same value.
*/}}
{{- define "slurmk8s.sharedStorageClassArgs" -}}
{{- with .Values.sharedStorage.storageClassName }}
- --shared-storage-class
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* The operator's arguments. */}}
{{- define "slurmk8s.args" -}}
{{- include "slurmk8s.commandArgs" (list . "operator" .Values (include "slurmk8s.namespaces" . | fromJsonArray)) }}
{{- /* Who the NetworkPolicy of each cluster's Slurm agent admits: this release's operator and bridge pods. */}}
- --release-namespace
- {{ .Release.Namespace | quote }}
- --release-name
- {{ .Release.Name | quote }}
{{- include "slurmk8s.trustedRepositoryArgs" . }}
{{- include "slurmk8s.sharedStorageClassArgs" . }}
{{- if include "slurmk8s.webhook.inOperator" . }}
- --webhook-port
- {{ .Values.webhook.port | quote }}
{{- include "slurmk8s.webhook.certArgs" (list . "--webhook-") }}
{{- end }}
{{- end }}

{{/*
The Deployment of one component (operator or bridge): `replicas` of which
one leads, rolling updates, probes on /healthz, the top-level image and
security contexts; with more than one replica, spreading over nodes and a
PodDisruptionBudget; the Role for its Lease.
Given a dict:
  ctx        the root context ($)
  component  "operator" or "bridge": the container's name and the component label
  name       the Deployment's name
  values     the component's values: replicas, metrics.port, health.port, resources,
             nodeSelector, tolerations, affinity, podAnnotations, podLabels,
             priorityClassName
  prefix     where those values live, for error messages ("" or "bridge.")
  serviceAccountName, args (rendered YAML list)
*/}}
{{- define "slurmk8s.deployment" -}}
{{- $ := .ctx }}
{{- $v := .values }}
{{- if eq (int $v.metrics.port) (int $v.health.port) }}
{{- fail (printf "%smetrics.port and %shealth.port are both %d: give them different ports" .prefix .prefix (int $v.metrics.port)) }}
{{- end }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .name }}
  namespace: {{ $.Release.Namespace }}
  labels:
    {{- include "slurmk8s.componentLabels" (list $ .component) | nindent 4 }}
spec:
  # One replica acts (the holder of the component's Lease); the others stand
  # by. So an upgrade rolls: the new pods start as standbys, and the old
  # leader releases the Lease as it stops.
  replicas: {{ $v.replicas }}
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 0
      maxSurge: 1
  selector:
    matchLabels:
      {{- include "slurmk8s.componentSelectorLabels" (list $ .component) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "slurmk8s.componentLabels" (list $ .component) | nindent 8 }}
        {{- with $v.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $v.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ .serviceAccountName }}
      automountServiceAccountToken: true
      {{- with $.Values.image.pullSecrets }}
      imagePullSecrets:
        {{- range . }}
        - name: {{ . | quote }}
        {{- end }}
      {{- end }}
      {{- with $v.priorityClassName }}
      priorityClassName: {{ . | quote }}
      {{- end }}
      {{- with $.Values.podSecurityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: {{ .component }}
          image: {{ include "slurmk8s.image" $ | quote }}
          imagePullPolicy: {{ $.Values.image.pullPolicy }}
          args:
            {{- .args | nindent 12 }}
          env:
            # Where the pod itself runs (the release namespace: its Lease's).
            - name: POD_NAMESPACE
              valueFrom:
                fieldRef:
                  fieldPath: metadata.namespace
            # Its name in the Lease (holderIdentity), with a random suffix.
            - name: POD_NAME
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
          ports:
            - name: metrics
              containerPort: {{ $v.metrics.port }}
              protocol: TCP
            - name: health
              containerPort: {{ $v.health.port }}
              protocol: TCP
            {{- if .webhook }}
            - name: webhook
              containerPort: {{ $.Values.webhook.port }}
              protocol: TCP
            {{- end }}
          livenessProbe:
            httpGet:
              path: /healthz
              port: health
            initialDelaySeconds: 15
            periodSeconds: 20
            timeoutSeconds: 5
            failureThreshold: 3
          readinessProbe:
            httpGet:
              path: /healthz
              port: health
            initialDelaySeconds: 5
            periodSeconds: 10
            timeoutSeconds: 5
            failureThreshold: 3
          {{- with $v.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $.Values.securityContext }}
          securityContext:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          volumeMounts:
            # The root filesystem is read-only; Python and kopf may write temporary files.
            - name: tmp
              mountPath: /tmp
            {{- if and .webhook $.Values.webhook.certManager.enabled }}
            # cert-manager's Secret; otherwise the operator keeps the certificate itself.
            - name: webhook-cert
              mountPath: /etc/slurmk8s/webhook
              readOnly: true
            {{- end }}
      volumes:
        - name: tmp
          emptyDir:
            sizeLimit: 64Mi
        {{- if and .webhook $.Values.webhook.certManager.enabled }}
        - name: webhook-cert
          secret:
            secretName: {{ include "slurmk8s.webhook.tlsSecret" $ }}
            defaultMode: 0400
        {{- end }}
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- if gt (int $v.replicas) 1 }}
      # The standby on another node than the leader where one exists: losing
      # a node loses one replica.
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: kubernetes.io/hostname
          whenUnsatisfiable: ScheduleAnyway
          labelSelector:
            matchLabels:
              {{- include "slurmk8s.componentSelectorLabels" (list $ .component) | nindent 14 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- if gt (int $v.replicas) 1 }}
---
# A node drain (kubectl drain, a node-pool upgrade) evicts one replica at a
# time: the other holds or takes the Lease meanwhile.
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ .name }}
  namespace: {{ $.Release.Namespace }}
  labels:
    {{- include "slurmk8s.componentLabels" (list $ .component) | nindent 4 }}
spec:
  maxUnavailable: 1
  selector:
    matchLabels:
      {{- include "slurmk8s.componentSelectorLabels" (list $ .component) | nindent 6 }}
{{- end }}
{{- if $.Values.rbac.create }}
---
# The component's Lease in the release namespace: leader election.
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ .name }}-lease
  namespace: {{ $.Release.Namespace }}
  labels:
    {{- include "slurmk8s.componentLabels" (list $ .component) | nindent 4 }}
rules:
  # Creating the Lease the first time (a create cannot be limited to one name).
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["create"]
  # Reading it, renewing and releasing it (PUT): its own Lease only, named
  # after the release (slurmk8s/leader.py, lease_name).
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    resourceNames: [{{ printf "slurmk8s-%s-%s" .component $.Release.Name | quote }}]
    verbs: ["get", "update"]
  # Reading the Lease older versions held, which must be free before a
  # replica first leads (an upgrade never runs an old leader beside a new one).
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    resourceNames: [{{ printf "slurmk8s-%s" .component | quote }}]
    verbs: ["get"]
---
{{ include "slurmk8s.binding" (dict "ctx" $ "component" .component "kind" "Role"
  "name" (printf "%s-lease" .name) "namespace" $.Release.Namespace "serviceAccountName" .serviceAccountName) }}
{{- end }}
{{- end }}

{{/*
The ClusterIP Service in front of one component's metrics port, given a dict:
ctx, component, name, values (metrics.port and metrics.service.*).
*/}}
{{- define "slurmk8s.metricsService" -}}
{{- $ := .ctx }}
{{- $metrics := .values.metrics }}
apiVersion: v1
kind: Service
metadata:
  # A Service name is a DNS label: 63 characters at most.
  name: {{ .name | trunc 63 | trimSuffix "-" }}
  namespace: {{ $.Release.Namespace }}
  labels:
    {{- include "slurmk8s.componentLabels" (list $ .component) | nindent 4 }}
  {{- $annotations := dict }}
  {{- if $metrics.service.prometheusAnnotations }}
  {{- $_ := set $annotations "prometheus.io/scrape" "true" }}
  {{- $_ := set $annotations "prometheus.io/port" ($metrics.port | int | toString) }}
  {{- $_ := set $annotations "prometheus.io/path" "/metrics" }}
  {{- end }}
  {{- $annotations = merge (deepCopy $metrics.service.annotations) $annotations }}
  {{- with $annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  type: ClusterIP
  selector:
    {{- include "slurmk8s.componentSelectorLabels" (list $ .component) | nindent 4 }}
  ports:
    - name: metrics
      port: {{ $metrics.service.port }}
      targetPort: metrics
      protocol: TCP
{{- end }}

{{/* One component's ServiceAccount, given a dict: ctx, component, name, values (serviceAccount.*). */}}
{{- define "slurmk8s.serviceAccount" -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ .name }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "slurmk8s.componentLabels" (list .ctx .component) | nindent 4 }}
  {{- with .values.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
automountServiceAccountToken: true
{{- end }}

{{/*
A RoleBinding or ClusterRoleBinding of the Role or ClusterRole of the same
name to one ServiceAccount in the release namespace, given a dict: ctx,
component, kind (Role or ClusterRole), name, namespace (Roles only),
serviceAccountName.
*/}}
{{- define "slurmk8s.binding" -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: {{ .kind }}Binding
metadata:
  name: {{ .name }}
  {{- with .namespace }}
  namespace: {{ . }}
  {{- end }}
  labels:
    {{- include "slurmk8s.componentLabels" (list .ctx .component) | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: {{ .kind }}
  name: {{ .name }}
subjects:
  - kind: ServiceAccount
    name: {{ .serviceAccountName }}
    namespace: {{ .ctx.Release.Namespace }}
{{- end }}

{{/*
The bridge's object name prefix: <fullname>-bridge, the full name cut so the
suffix always fits (else a long full name would give the bridge the
operator's names).
*/}}
{{/* The webhook's Service (and, with webhook.hostNetwork, its Deployment and ServiceAccount). */}}
{{- define "slurmk8s.webhook.fullname" -}}
{{- printf "%s-webhook" (include "slurmk8s.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{/* The ValidatingWebhookConfiguration (cluster-scoped: the release namespace is in its name). */}}
{{- define "slurmk8s.webhook.configurationName" -}}
{{- printf "%s-%s" (include "slurmk8s.fullname" .) .Release.Namespace }}
{{- end }}

{{/* The Secret in which the process serving the webhook keeps its CA and certificate (decision record 53). */}}
{{- define "slurmk8s.webhook.keptSecret" -}}
{{- printf "%s-certs" (include "slurmk8s.webhook.fullname" .) }}
{{- end }}

{{/* The kubernetes.io/tls Secret cert-manager writes the serving certificate to. */}}
{{- define "slurmk8s.webhook.tlsSecret" -}}
{{- printf "%s-tls" (include "slurmk8s.webhook.fullname" .) }}
{{- end }}

{{/* Which component serves the webhook: its own Deployment on the host network, or the operator. */}}
{{- define "slurmk8s.webhook.component" -}}
{{- if .Values.webhook.hostNetwork }}webhook{{ else }}operator{{ end }}
{{- end }}

{{/* "true" when the operator's own pods serve the webhook, else empty. */}}
{{- define "slurmk8s.webhook.inOperator" -}}
{{- if and .Values.webhook.enabled (not .Values.webhook.hostNetwork) }}true{{ end }}
{{- end }}

{{/* The ServiceAccount of the pods that serve the webhook. */}}
{{- define "slurmk8s.webhook.serviceAccountName" -}}
{{- if .Values.webhook.hostNetwork }}
{{- include "slurmk8s.webhook.fullname" . }}
{{- else }}
{{- include "slurmk8s.serviceAccountName" . }}
{{- end }}
{{- end }}

{{/*
Where the webhook's certificate comes from, as arguments with the prefix
given ("--webhook-" for the operator, "--" for `slurmk8s webhook`):
cert-manager's Secret mounted, or the Secret the process keeps.
*/}}
{{- define "slurmk8s.webhook.certArgs" -}}
{{- $ := index . 0 }}
{{- $p := index . 1 }}
{{- if $.Values.webhook.certManager.enabled }}
- {{ $p }}cert-dir
- /etc/slurmk8s/webhook
{{- else }}
- {{ $p }}secret
- {{ include "slurmk8s.webhook.keptSecret" $ | quote }}
- {{ $p }}configuration
- {{ include "slurmk8s.webhook.configurationName" $ | quote }}
- {{ $p }}service
- {{ include "slurmk8s.webhook.fullname" $ | quote }}
{{- end }}
{{- end }}

{{/*
The webhook's own Deployment, with webhook.hostNetwork (decision record 53):
`slurmk8s webhook` on the nodes' network, where a control plane that cannot
reach pod addresses (EKS with an overlay CNI) reaches it, while the operator
stays on the pod network, so the Slurm agents' NetworkPolicies admit it as
before. Its ServiceAccount may only keep the certificate (nothing with
cert-manager: no token then). Placed as the operator's pods are; two on one
node would want the same host port, so the scheduler keeps them apart.
*/}}
{{- define "slurmk8s.webhook.deployment" -}}
{{- $name := include "slurmk8s.webhook.fullname" . }}
{{- $kept := not .Values.webhook.certManager.enabled }}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ $name }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "slurmk8s.componentLabels" (list . "webhook") | nindent 4 }}
automountServiceAccountToken: {{ $kept }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "slurmk8s.componentLabels" (list . "webhook") | nindent 4 }}
spec:
  replicas: {{ .Values.webhook.replicas }}
  strategy:
    type: RollingUpdate
    rollingUpdate:
      # A host port is taken until its pod is gone: replace one pod at a time.
      maxUnavailable: 1
      maxSurge: 0
  selector:
    matchLabels:
      {{- include "slurmk8s.componentSelectorLabels" (list . "webhook") | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "slurmk8s.componentLabels" (list . "webhook") | nindent 8 }}
        {{- with .Values.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with .Values.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      serviceAccountName: {{ $name }}
      automountServiceAccountToken: {{ $kept }}
      {{- with .Values.image.pullSecrets }}
      imagePullSecrets:
        {{- range . }}
        - name: {{ . | quote }}
        {{- end }}
      {{- end }}
      {{- with .Values.priorityClassName }}
      priorityClassName: {{ . | quote }}
      {{- end }}
      {{- with .Values.podSecurityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: webhook
          image: {{ include "slurmk8s.image" . | quote }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          args:
            - --log-level
            - {{ .Values.logLevel | quote }}
            - --log-format
            - {{ .Values.logFormat | quote }}
            - webhook
            - --port
            - {{ .Values.webhook.port | quote }}
            {{- include "slurmk8s.trustedRepositoryArgs" . | nindent 12 }}
            {{- include "slurmk8s.sharedStorageClassArgs" . | nindent 12 }}
            {{- include "slurmk8s.webhook.certArgs" (list . "--") | nindent 12 }}
          env:
            # The namespace of the Secret and Service it keeps the certificate for.
            - name: POD_NAMESPACE
              valueFrom:
                fieldRef:
                  fieldPath: metadata.namespace
          ports:
            - name: webhook
              containerPort: {{ .Values.webhook.port }}
              protocol: TCP
          # GET /healthz over TLS: ready once it serves a certificate.
          readinessProbe:
            httpGet:
              path: /healthz
              port: webhook
              scheme: HTTPS
            periodSeconds: 5
            timeoutSeconds: 5
            failureThreshold: 3
          livenessProbe:
            httpGet:
              path: /healthz
              port: webhook
              scheme: HTTPS
            initialDelaySeconds: 30
            periodSeconds: 20
            timeoutSeconds: 5
            failureThreshold: 3
          {{- with .Values.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with .Values.securityContext }}
          securityContext:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            {{- if not $kept }}
            - name: webhook-cert
              mountPath: /etc/slurmk8s/webhook
              readOnly: true
            {{- end }}
      volumes:
        - name: tmp
          emptyDir:
            sizeLimit: 16Mi
        {{- if not $kept }}
        - name: webhook-cert
          secret:
            secretName: {{ include "slurmk8s.webhook.tlsSecret" . }}
            defaultMode: 0400
        {{- end }}
      {{- with .Values.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- if gt (int .Values.webhook.replicas) 1 }}
---
# A node drain evicts one webhook pod at a time: the others answer meanwhile.
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ $name }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "slurmk8s.componentLabels" (list . "webhook") | nindent 4 }}
spec:
  maxUnavailable: 1
  selector:
    matchLabels:
      {{- include "slurmk8s.componentSelectorLabels" (list . "webhook") | nindent 6 }}
{{- end }}
{{- end }}

{{- define "slurmk8s.bridge.fullname" -}}
{{- printf "%s-bridge" (include "slurmk8s.fullname" . | trunc 56 | trimSuffix "-") }}
{{- end }}

{{/* The ServiceAccount the bridge runs as. */}}
{{- define "slurmk8s.bridge.serviceAccountName" -}}
{{- include "slurmk8s.serviceAccountNameOf" (list .Values.bridge.serviceAccount (include "slurmk8s.bridge.fullname" .)) }}
{{- end }}

{{/*
The namespaces whose NodeLendingPolicies the bridge acts on, as a JSON list
(read it with fromJsonArray): bridge.watchNamespaces, or the operator's
namespaces when that is unset (null). Empty: every namespace.
*/}}
{{- define "slurmk8s.bridge.namespaces" -}}
{{- $own := .Values.bridge.watchNamespaces }}
{{- if kindIs "invalid" $own }}
{{- include "slurmk8s.namespaces" . }}
{{- else if not $own }}
{{- fail "bridge.watchNamespaces is empty: list the namespaces of the bridge's NodeLendingPolicies, or leave it unset (null) to follow watchNamespaces (with watchAllNamespaces=true: every namespace)" }}
{{- else }}
{{- toJson $own }}
{{- end }}
{{- end }}

{{/* The bridge's arguments. */}}
{{- define "slurmk8s.bridge.args" -}}
{{- include "slurmk8s.commandArgs" (list . "bridge" .Values.bridge (include "slurmk8s.bridge.namespaces" . | fromJsonArray)) }}
{{- /* The release names the bridge's Lease. */}}
- --release-name
- {{ .Release.Name | quote }}
{{- include "slurmk8s.trustedRepositoryArgs" . }}
{{- end }}

{{/*
What the bridge does whichever namespaces it acts on, exactly as
slurmk8s/bridge/permissions.py declares it: Nodes are cluster-scoped, and a node's
idleness and the demand for it depend on GPU pods in every namespace. No
wildcards. Nodes and pods are listed once, then watched (decision record 23).
*/}}
{{- define "slurmk8s.bridge.clusterRules" -}}
# Lending state lives on the Node: the slurmk8s.dev/lending label, the
# lending annotations and the slurmk8s.dev/lent taint are written with merge
# patches (taint changes carry the resourceVersion). No create, no delete.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list", "watch", "patch"]
# Listing every pod: GPU pods on a node keep it from being lent, and pending
# GPU pods take lent nodes back. Creating, deleting and getting pods is
# confined to the policies' namespaces (below). No pods/exec, no eviction.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
{{- end }}

{{/*
What the bridge does inside each namespace whose NodeLendingPolicies it acts
on (a policy's SlurmCluster, agent token Secret, lent slurmd pods and
serving Deployments are all in the policy's namespace), exactly as
slurmk8s/bridge/permissions.py declares it. Used by one Role per namespace, or by a
ClusterRole when the bridge acts on every namespace.
*/}}
{{- define "slurmk8s.bridge.namespacedRules" -}}
# List, then watch, the NodeLendingPolicies; the bridge never changes their spec.
- apiGroups: ["slurmk8s.dev"]
  resources: ["nodelendingpolicies"]
  verbs: ["list", "watch"]
# Report the lent, lending and reclaiming nodes and the Ready condition in
# each policy's .status.
- apiGroups: ["slurmk8s.dev"]
  resources: ["nodelendingpolicies/status"]
  verbs: ["patch"]
# List, then watch, the SlurmClusters: the one a policy lends to (its
# partitions, slurmd image, config hash; read by name when the bridge does not
# watch), and the checkpoint directories whose published model versions roll
# serving Deployments. The operator, not the bridge, manages them.
- apiGroups: ["slurmk8s.dev"]
  resources: ["slurmclusters"]
  verbs: ["get", "list", "watch"]
# The lent slurmd pod has an ownerReference to its SlurmCluster with
# blockOwnerDeletion, which the OwnerReferencesPermissionEnforcement
# admission plugin allows only with update on the owner's finalizers.
- apiGroups: ["slurmk8s.dev"]
  resources: ["slurmclusters/finalizers"]
  verbs: ["update"]
# The lent slurmd pod (<cluster>-lent-<node>) is created on a lent node and
# deleted when the node is handed back; the controller pod is read by name
# for the agent's address.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "create", "delete"]
# The lent slurmd pod's PodDisruptionBudget (<cluster>-lent.<node>, owned by
# the pod): created while Slurm runs jobs on the node, so that an eviction
# (kubectl drain) waits for the bridge's graceful reclaim; deleted once no job
# is left. Listed, then watched, to know which exist. No get, update or patch.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["list", "watch", "create", "delete"]
# The <cluster>-agent-token Secret, read by name to authenticate to the
# cluster's Slurm agent. No list or watch: no other Secret can be enumerated.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
# Serving Deployments that follow a model directory are listed, and rolled
# (a pod-template annotation patch) when a job publishes a new model version.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "patch"]
# Events on policies and serving Deployments (core API). Each is created
# once, never updated, so no patch.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{/*
The NetworkPolicy of one component's own pods (operator or bridge; decision
record 47), given a dict:
  ctx         the root context ($)
  component   "operator" or "bridge"
  name        the policy's name (the component's Deployment's)
  values      the component's values: metrics.port, health.port
  webhook     whether its pods serve the webhook (webhook.port)
  namespaces  the namespaces of the SlurmClusters whose agents it calls (JSON
              list; empty: every namespace)
Ingress: the webhook's port from anywhere (or networkPolicy.webhookFrom), the
metrics port from networkPolicy.metricsFrom only, the health port from
networkPolicy.healthFrom only; traffic from the pod's own node (the kubelet's
probes) is never cut. Egress (networkPolicy.egress.enabled): the API server's
ports, each watched namespace's Slurm agent (controller pods, port 6830), and
networkPolicy.egress.extraRules.
*/}}
{{- define "slurmk8s.networkPolicy" -}}
{{- $ := .ctx }}
{{- $np := $.Values.networkPolicy }}
{{- $v := .values }}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ .name }}
  namespace: {{ $.Release.Namespace }}
  labels:
    {{- include "slurmk8s.componentLabels" (list $ .component) | nindent 4 }}
spec:
  podSelector:
    matchLabels:
      {{- include "slurmk8s.componentSelectorLabels" (list $ .component) | nindent 6 }}
  policyTypes:
    - Ingress
    {{- if $np.egress.enabled }}
    - Egress
    {{- end }}
  {{- if not (or .webhook $np.metricsFrom $np.healthFrom) }}
  # No pod may connect (the node's probes still do).
  ingress: []
  {{- else }}
  ingress:
    {{- if .webhook }}
    # The API server calls the webhook. Its source address is the control
    # plane's, which no provider makes predictable (managed control planes,
    # konnectivity, a node's address), so any address may connect unless
    # networkPolicy.webhookFrom lists the control plane's CIDRs. The server
    # itself bounds what one caller holds (decision record 42).
    - ports:
        - protocol: TCP
          port: {{ $.Values.webhook.port }}
      {{- with $np.webhookFrom }}
      from:
        {{- range . }}
        - ipBlock:
            cidr: {{ . | quote }}
        {{- end }}
      {{- end }}
    {{- end }}
    {{- with $np.metricsFrom }}
    # Prometheus: the scrapers networkPolicy.metricsFrom names, no one else.
    - ports:
        - protocol: TCP
          port: {{ $v.metrics.port }}
      from:
        {{- toYaml . | nindent 8 }}
    {{- end }}
    {{- with $np.healthFrom }}
    # /healthz for others than the kubelet (whose probes come from the
    # pod's own node, which no NetworkPolicy cuts).
    - ports:
        - protocol: TCP
          port: {{ $v.health.port }}
      from:
        {{- toYaml . | nindent 8 }}
    {{- end }}
  {{- end }}
  {{- if $np.egress.enabled }}
  egress:
    # The Kubernetes API server (every watch, read and write). Its Service
    # address is translated to the server's own before policy applies, so
    # these are the server's ports (443 on most managed clusters, 6443 on
    # kubeadm's); to any address unless networkPolicy.egress.apiServer.cidrs
    # lists them.
    - ports:
        {{- range $np.egress.apiServer.ports }}
        - protocol: TCP
          port: {{ . }}
        {{- end }}
      {{- with $np.egress.apiServer.cidrs }}
      to:
        {{- range . }}
        - ipBlock:
            cidr: {{ . | quote }}
        {{- end }}
      {{- end }}
    # The Slurm agent beside each watched SlurmCluster's slurmctld, at its
    # pod's address (never a name: no DNS).
    - ports:
        - protocol: TCP
          port: 6830
      to:
        {{- $namespaces := .namespaces | fromJsonArray }}
        - namespaceSelector:
            {{- if $namespaces }}
            matchExpressions:
              - key: kubernetes.io/metadata.name
                operator: In
                values:
                  {{- toYaml $namespaces | nindent 18 }}
            {{- else }}
            {}
            {{- end }}
          podSelector:
            matchLabels:
              app.kubernetes.io/name: slurm
              app.kubernetes.io/component: controller
    {{- with $np.egress.extraRules }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
{{- end }}
