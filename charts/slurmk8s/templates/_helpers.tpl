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

{{/* Labels that select the operator's pods; never change them after a release exists. */}}
{{- define "slurmk8s.selectorLabels" -}}
app.kubernetes.io/name: {{ include "slurmk8s.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels on every object the chart creates. */}}
{{- define "slurmk8s.labels" -}}
helm.sh/chart: {{ include "slurmk8s.chart" . }}
{{ include "slurmk8s.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: slurmk8s
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The ServiceAccount the operator runs as. */}}
{{- define "slurmk8s.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "slurmk8s.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag of the controller image; the tag defaults to the chart's appVersion. */}}
{{- define "slurmk8s.image" -}}
{{- if regexMatch "@|:[^/]*$" .Values.image.repository }}
{{- fail (printf "image.repository %q holds a tag or digest: set image.repository to the part before it and image.tag to the tag" .Values.image.repository) }}
{{- end }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
The permissions the operator needs inside each namespace it watches: exactly
the kinds `slurmk8s render` produces for a SlurmCluster, plus the SlurmClusters
themselves, their worker pods and Events. Used by the ClusterRole when every
namespace is watched, otherwise by one Role per watched namespace.
No pods/exec: slurmctld is reached through the cluster's authenticated agent
Service. No wildcards.
*/}}
{{- define "slurmk8s.namespacedRules" -}}
# Watch SlurmClusters and reconcile them; kopf patches its finalizer and
# progress annotations onto the object.
- apiGroups: ["slurmk8s.dev"]
  resources: ["slurmclusters"]
  verbs: ["get", "list", "watch", "patch", "update"]
# Report phase, conditions and configHash in .status.
- apiGroups: ["slurmk8s.dev"]
  resources: ["slurmclusters/status"]
  verbs: ["get", "patch", "update"]
# Rendered objects carry an ownerReference to their SlurmCluster with
# blockOwnerDeletion, which the OwnerReferencesPermissionEnforcement
# admission plugin allows only with update on the owner's finalizers.
- apiGroups: ["slurmk8s.dev"]
  resources: ["slurmclusters/finalizers"]
  verbs: ["update"]
# Rendered ConfigMaps (slurm.conf, gres.conf, users), Services (controller,
# workers, login, restapi) and PersistentVolumeClaims (StateSaveLocation,
# shared storage): create, apply changes, prune what a spec change drops.
- apiGroups: [""]
  resources: ["configmaps", "services", "persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
# Secrets: the generated munge, JWT and SSH host key Secrets are created once
# and never updated (immutable, slurmk8s.dev/create-only); login users' SSH
# keys are read by the name the SlurmCluster gives. Everything is by name, so
# no list or watch: the operator cannot enumerate other workloads' Secrets.
# delete prunes a key Secret that a spec change drops.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create", "delete"]
# Worker pods: drain-first scale-in deletes a worker pod only once its Slurm
# node is drained; patch sets the slurmk8s.dev/slurm-busy label that the
# busy-worker PodDisruptionBudget selects. No pods/exec, no pods/eviction.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# slurmctld and worker StatefulSets, login and slurmrestd Deployments.
- apiGroups: ["apps"]
  resources: ["statefulsets", "deployments"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
# PodDisruptionBudgets that protect busy workers and login pods.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
# Events about reconciliation, drains and errors on the SlurmCluster, as
# kopf posts them (core API).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
# The same Events through events.k8s.io, which newer clients use.
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/* Arguments of the controller image's entrypoint, i.e. of `slurmk8s`. */}}
{{- define "slurmk8s.args" -}}
- --log-level
- {{ .Values.logLevel | quote }}
- --log-format
- {{ .Values.logFormat | quote }}
- operator
- --metrics-port
- {{ .Values.metrics.port | int | quote }}
- --health-port
- {{ .Values.health.port | int | quote }}
{{- if .Values.watchNamespaces }}
{{- range .Values.watchNamespaces }}
- --namespace
- {{ . | quote }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
{{- end }}
