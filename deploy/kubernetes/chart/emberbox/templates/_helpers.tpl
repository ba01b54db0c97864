{{/* Names of the release's objects, at most 63 characters (DNS labels). */}}
{{- define "emberbox.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "emberbox.fullname" -}}
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

{{- define "emberbox.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object of the release. */}}
{{- define "emberbox.commonLabels" -}}
helm.sh/chart: {{ include "emberbox.chart" . }}
app.kubernetes.io/name: {{ include "emberbox.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels of the node's objects. */}}
{{- define "emberbox.labels" -}}
{{ include "emberbox.commonLabels" . }}
app.kubernetes.io/component: node
{{- end }}

{{/* The node pods' labels the DaemonSet and the Service select by. */}}
{{- define "emberbox.selectorLabels" -}}
app.kubernetes.io/name: {{ include "emberbox.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node
{{- end }}

{{- define "emberbox.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "emberbox.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "emberbox.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The CloudNativePG cluster's name; the operator names its Secret <name>-app. */}}
{{- define "emberbox.cnpgName" -}}
{{- printf "%s-pg" (include "emberbox.fullname" .) | trunc 50 | trimSuffix "-" }}
{{- end }}

{{/*
The Secret and key EMBERBOX_STORE is read from, by the precedence values.yaml
states: the operator's app Secret, the chart's own, or the operator's.
*/}}
{{- define "emberbox.storeSecretName" -}}
{{- if .Values.postgres.cnpg.enabled }}
{{- printf "%s-app" (include "emberbox.cnpgName" .) }}
{{- else if .Values.postgres.external.url }}
{{- printf "%s-postgres" (include "emberbox.fullname" .) }}
{{- else }}
{{- required "postgres: set postgres.existingSecret, postgres.external.url or postgres.cnpg.enabled" .Values.postgres.existingSecret }}
{{- end }}
{{- end }}

{{- define "emberbox.storeSecretKey" -}}
{{- if .Values.postgres.cnpg.enabled }}uri{{ else }}url{{ end }}
{{- end }}

{{/* The Secret holding the cluster CA (ca.crt, ca.key). */}}
{{- define "emberbox.caSecretName" -}}
{{- default (printf "%s-cluster-ca" (include "emberbox.fullname" .)) .Values.cluster.ca.existingSecret }}
{{- end }}
