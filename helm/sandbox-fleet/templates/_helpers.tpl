{{/*
Shared names, labels, image references and the cross-field checks of the values that JSON
Schema cannot express. Every template includes "sandbox-fleet.validate" through the labels,
so an inconsistent values set fails the whole render with one clear message.
*/}}

{{- define "sandbox-fleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-scoped base name; ≤40 characters so "-control-plane" suffixes stay within 63. */}}
{{- define "sandbox-fleet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sandbox-fleet.labels" -}}
{{- include "sandbox-fleet.validate" . -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "sandbox-fleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sandbox-fleet
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component (control-plane, host-agent, nats). Usage: include ... (list . "control-plane") */}}
{{- define "sandbox-fleet.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "sandbox-fleet.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "sandbox-fleet.componentLabels" -}}
{{ include "sandbox-fleet.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* Image reference: repository@digest when a digest is pinned, else repository:tag (default appVersion). */}}
{{- define "sandbox-fleet.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "sandbox-fleet.controlPlane.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-control-plane" (include "sandbox-fleet.fullname" .)) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The agent never talks to the Kubernetes API: its own account, no token mounted. */}}
{{- define "sandbox-fleet.hostAgent.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- printf "%s-host-agent" (include "sandbox-fleet.fullname" .) -}}
{{- else -}}
default
{{- end -}}
{{- end -}}

{{- define "sandbox-fleet.leaseName" -}}
{{- default (printf "%s-leader" (include "sandbox-fleet.fullname" .)) .Values.controlPlane.leaderElection.leaseName -}}
{{- end -}}

{{/* "true" when the chart owns the leader Lease (leader-lease.yaml): no such Lease yet, or this
release's. Empty when a Lease of the same name exists that the release does not own. */}}
{{- define "sandbox-fleet.ownsLease" -}}
{{- $live := lookup "coordination.k8s.io/v1" "Lease" .Release.Namespace (include "sandbox-fleet.leaseName" .) -}}
{{- if or (not $live) (eq (dig "metadata" "annotations" "meta.helm.sh/release-name" "" $live) .Release.Name) -}}
true
{{- end -}}
{{- end -}}

{{/* NATS URL shared by control plane and agents: the in-chart server or the external cluster. */}}
{{- define "sandbox-fleet.natsUrl" -}}
{{- if .Values.nats.embedded -}}
{{- printf "nats://%s-nats.%s.svc:4222" (include "sandbox-fleet.fullname" .) .Release.Namespace -}}
{{- else -}}
{{- .Values.nats.external.url -}}
{{- end -}}
{{- end -}}

{{- define "sandbox-fleet.tls.serverSecret" -}}
{{- default (printf "%s-grpc-tls" (include "sandbox-fleet.fullname" .)) .Values.tls.existingSecret -}}
{{- end -}}
{{- define "sandbox-fleet.tls.runnerCASecret" -}}
{{- default (printf "%s-runner-ca" (include "sandbox-fleet.fullname" .)) .Values.tls.runnerClientCASecret -}}
{{- end -}}
{{- define "sandbox-fleet.tls.adminCASecret" -}}
{{- default (printf "%s-admin-ca" (include "sandbox-fleet.fullname" .)) .Values.tls.adminClientCASecret -}}
{{- end -}}

{{- define "sandbox-fleet.sandboxImageRef" -}}
{{- default (printf "sandbox-fleet/sandbox:%s" .Chart.AppVersion) .Values.hostAgent.sandboxImage.ref -}}
{{- end -}}

{{/*
Cross-field rules (values.schema.json covers types, ranges and unknown keys). Renders nothing;
fails the render with the reason.
*/}}
{{- define "sandbox-fleet.validate" -}}
{{- if not .Values.nats.embedded -}}
{{- $_ := required "nats.external.url is required when nats.embedded is false (install the official NATS chart with JetStream, R3 and sync_interval: always, and point this at it)" .Values.nats.external.url -}}
{{- else -}}
{{- if .Values.nats.external.url -}}
{{- fail "nats.external.url is set but nats.embedded is true: choose one (set nats.embedded=false to use the external cluster)" -}}
{{- end -}}
{{- if gt (int .Values.store.replicas) 1 -}}
{{- fail (printf "store.replicas=%d needs a replicated NATS cluster, but nats.embedded runs a single node: use nats.embedded=false with nats.external.url, or store.replicas=1" (int .Values.store.replicas)) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.hostAgent.natsCredentialsHostPath .Values.hostAgent.natsCredentialsSecret -}}
{{- fail "hostAgent.natsCredentialsHostPath and hostAgent.natsCredentialsSecret are exclusive: set at most one" -}}
{{- end -}}
{{- if eq (int .Values.controlPlane.grpcPort) (int .Values.controlPlane.opsPort) -}}
{{- fail "controlPlane.grpcPort and controlPlane.opsPort must differ" -}}
{{- end -}}
{{- include "sandbox-fleet.validateAttestation" . -}}
{{- end -}}

{{/*
R-H1/R-H2: with an empty allow-list no host can ever become READY, so an install that would admit
nothing fails here, naming the value to set — unless attestation.allowEmptyPolicy says so on purpose.
A pinned sandbox image id the policy refuses would leave every chart-managed host UNATTESTED.
*/}}
{{- define "sandbox-fleet.validateAttestation" -}}
{{- $a := .Values.attestation -}}
{{- if not $a.allowEmptyPolicy -}}
{{- if not $a.allowedImageDigests -}}
{{- fail "attestation.allowedImageDigests is empty, so no host could ever become READY and take work: list the sandbox image id(s) hosts may run (sha256:..., the Id of `docker image inspect IMAGE`), or set attestation.allowEmptyPolicy=true to install with every host UNATTESTED" -}}
{{- end -}}
{{- if not $a.allowedAgentShas -}}
{{- fail "attestation.allowedAgentShas is empty: list the exact git SHA(s) of the host-agent builds allowed to register (the agent image's org.opencontainers.image.revision label / SANDBOXFLEET_BUILD_SHA), or set attestation.allowEmptyPolicy=true" -}}
{{- end -}}
{{- end -}}
{{- with .Values.hostAgent.sandboxImage.id -}}
{{- if and $.Values.hostAgent.enabled $a.allowedImageDigests (not (has . $a.allowedImageDigests)) -}}
{{- fail (printf "hostAgent.sandboxImage.id %s is not in attestation.allowedImageDigests: the chart's host agents would never become READY (add it to the list)" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
