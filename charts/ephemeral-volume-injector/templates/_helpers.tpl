{{- define "evi.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "evi.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "evi.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "evi.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "evi.selectorLabels" -}}
app.kubernetes.io/name: {{ include "evi.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "evi.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "evi.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "evi.tlsSecretName" -}}
{{- if eq .Values.tls.mode "existingSecret" -}}
{{- required "tls.existingSecret is required when tls.mode is existingSecret" .Values.tls.existingSecret -}}
{{- else -}}
{{- printf "%s-tls" (include "evi.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "evi.prefix" -}}
{{- default "ephemeral-volumes.io" .Values.config.annotationPrefix -}}
{{- end -}}

{{/*
CEL for matchConditions: true for pods that carry an annotation under the prefix, or that a
configured rule would match (namespace list and label selector). Only those reach the webhook.
*/}}
{{- define "evi.matchExpression" -}}
{{- $prefix := include "evi.prefix" . -}}
{{- $terms := list (printf "(has(object.metadata.annotations) && object.metadata.annotations.exists(k, k.startsWith('%s/')))" $prefix) -}}
{{- range .Values.config.rules -}}
{{- $parts := list -}}
{{- if .namespaces -}}
{{- $ns := list -}}
{{- range .namespaces }}{{ $ns = append $ns (printf "'%s'" .) }}{{ end -}}
{{- $parts = append $parts (printf "request.namespace in [%s]" (join ", " $ns)) -}}
{{- end -}}
{{- with .podSelector -}}
{{- $labels := "object.metadata.labels" -}}
{{- range $k, $v := .matchLabels -}}
{{- $parts = append $parts (printf "(has(%s) && '%s' in %s && %s['%s'] == '%s')" $labels $k $labels $labels $k $v) -}}
{{- end -}}
{{- range .matchExpressions -}}
{{- $vals := list -}}
{{- range .values }}{{ $vals = append $vals (printf "'%s'" .) }}{{ end -}}
{{- if eq .operator "In" -}}
{{- $parts = append $parts (printf "(has(%s) && '%s' in %s && %s['%s'] in [%s])" $labels .key $labels $labels .key (join ", " $vals)) -}}
{{- else if eq .operator "NotIn" -}}
{{- $parts = append $parts (printf "(!has(%s) || !('%s' in %s) || !(%s['%s'] in [%s]))" $labels .key $labels $labels .key (join ", " $vals)) -}}
{{- else if eq .operator "Exists" -}}
{{- $parts = append $parts (printf "(has(%s) && '%s' in %s)" $labels .key $labels) -}}
{{- else if eq .operator "DoesNotExist" -}}
{{- $parts = append $parts (printf "(!has(%s) || !('%s' in %s))" $labels .key $labels) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $parts -}}
{{- $terms = append $terms (printf "(%s)" (join " && " $parts)) -}}
{{- else -}}
{{- $terms = append $terms "true" -}}
{{- end -}}
{{- end -}}
{{- join " || " $terms -}}
{{- end -}}

{{/*
Whether the webhook reads the cluster (CSIDriver and StorageClass watches): unless
config.clusterChecks is off. Then it needs its service-account token, RBAC and egress to the
API server.
*/}}
{{- define "evi.clusterChecks" -}}
{{- if ne (default "enforce" .Values.config.clusterChecks) "off" -}}true{{- end -}}
{{- end -}}
