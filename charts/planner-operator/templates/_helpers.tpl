{{/* Names, labels and the cross-field checks of the values. */}}

{{- define "planner-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-planner-operator, or the release name when it already contains the chart name. */}}
{{- define "planner-operator.fullname" -}}
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

{{/* Name of cluster-scoped objects (ClusterRole, bindings, webhook configuration): with the
watched namespace in namespace-scoped mode, so that one release per namespace does not collide. */}}
{{- define "planner-operator.clusterName" -}}
{{- $fullname := include "planner-operator.fullname" . }}
{{- if .Values.watchNamespace }}
{{- printf "%s-%s" $fullname .Values.watchNamespace | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $fullname }}
{{- end }}
{{- end }}

{{- define "planner-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "planner-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "planner-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "planner-operator.labels" -}}
helm.sh/chart: {{ include "planner-operator.chart" . }}
{{ include "planner-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: planner-operator
{{- end }}

{{- define "planner-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "planner-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false: the existing ServiceAccount the operator runs as" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "planner-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "planner-operator.leaseName" -}}
{{- default (printf "%s-leader" (include "planner-operator.fullname" .)) .Values.leaderElection.leaseName }}
{{- end }}

{{- define "planner-operator.webhookServiceName" -}}
{{- printf "%s-webhook" (include "planner-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "planner-operator.webhookConfigName" -}}
{{- include "planner-operator.clusterName" . }}
{{- end }}

{{/* Secret the generated certificates are kept in. */}}
{{- define "planner-operator.generatedSecretName" -}}
{{- default (printf "%s-webhook-cert" (include "planner-operator.fullname" .)) .Values.webhook.certificate.generated.secretName }}
{{- end }}

{{/* Secret mounted in certManager and secret modes. */}}
{{- define "planner-operator.mountedSecretName" -}}
{{- if eq .Values.webhook.certificate.mode "certManager" }}
{{- printf "%s-webhook-tls" (include "planner-operator.fullname" .) }}
{{- else }}
{{- .Values.webhook.certificate.secret.name }}
{{- end }}
{{- end }}

{{/* Where the mounted certificate is read from (certManager and secret modes). */}}
{{- define "planner-operator.certDir" -}}
/etc/planner-operator/webhook-certs
{{- end }}

{{/* "true" when the operator keeps the caBundle of the webhook configuration current: generated
certificates, or an existing Secret without a caBundle value (the Secret's ca.crt is used). */}}
{{- define "planner-operator.patchesCaBundle" -}}
{{- $mode := .Values.webhook.certificate.mode }}
{{- if and .Values.webhook.enabled (or (eq $mode "generated") (and (eq $mode "secret") (not .Values.webhook.certificate.secret.caBundle))) }}true{{ end }}
{{- end }}

{{/* API group of ClusterTopologies, from clusterTopologyApiVersion (group/version). */}}
{{- define "planner-operator.clusterTopologyGroup" -}}
{{- (split "/" .Values.clusterTopologyApiVersion)._0 }}
{{- end }}

{{/* Cross-field checks that values.schema.json cannot phrase clearly; rendered by deployment.yaml. */}}
{{- define "planner-operator.validate" -}}
{{- if and .Values.webhook.enabled (eq .Values.webhook.certificate.mode "secret") (not .Values.webhook.certificate.secret.name) }}
{{- fail "webhook.certificate.secret.name is required when webhook.certificate.mode is secret: the name of a kubernetes.io/tls Secret in the release namespace with tls.crt and tls.key (and ca.crt, or set webhook.certificate.secret.caBundle)" }}
{{- end }}
{{- if not (regexMatch "^https?://[^\\s/]+" .Values.prometheus.url) }}
{{- fail (printf "prometheus.url %q is not an http:// or https:// URL; e.g. http://prometheus-operated.monitoring.svc:9090" .Values.prometheus.url) }}
{{- end }}
{{- if and .Values.webhook.url (not (regexMatch "^https://[^\\s/]+" .Values.webhook.url)) }}
{{- fail (printf "webhook.url %q is not an https:// URL (the API server calls webhooks over TLS only); e.g. https://127.0.0.1:9443" .Values.webhook.url) }}
{{- end }}
{{- if and .Values.watchNamespace (not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" .Values.watchNamespace)) }}
{{- fail (printf "watchNamespace %q is not a namespace name: lowercase letters, digits and '-', starting and ending with a letter or digit" .Values.watchNamespace) }}
{{- end }}
{{- if and (not .Values.leaderElection.enabled) (gt (int .Values.replicaCount) 1) }}
{{- fail (printf "leaderElection.enabled is false with replicaCount %d: every replica would reconcile and they would fight over the same objects; set replicaCount to 1 or enable leader election" (int .Values.replicaCount)) }}
{{- end }}
{{- end }}
