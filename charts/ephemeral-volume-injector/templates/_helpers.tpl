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

{{/*
The TLS mode, checked once here (values.schema.json checks it too, but a chart used with
--skip-schema-validation should fail as clearly): helm, selfManaged, certManager or existingSecret.
*/}}
{{- define "evi.tlsMode" -}}
{{- $mode := .Values.tls.mode -}}
{{- if not (has $mode (list "helm" "selfManaged" "certManager" "existingSecret")) -}}
{{- fail (printf "tls.mode must be helm, selfManaged, certManager or existingSecret, not %q" $mode) -}}
{{- end -}}
{{- $mode -}}
{{- end -}}

{{/* "true" when the webhook keeps its own CA and certificate (tls.mode=selfManaged): no Secret
is mounted, it writes the caBundle itself and needs RBAC for both. */}}
{{- define "evi.selfManaged" -}}
{{- if eq (include "evi.tlsMode" .) "selfManaged" }}true{{ end -}}
{{- end -}}

{{- define "evi.tlsSecretName" -}}
{{- $mode := include "evi.tlsMode" . -}}
{{- if eq $mode "existingSecret" -}}
{{- required "tls.existingSecret is required when tls.mode is existingSecret" .Values.tls.existingSecret -}}
{{- else if eq $mode "selfManaged" -}}
{{- /* Another name than the helm mode's kubernetes.io/tls Secret: a Secret's type cannot change. */ -}}
{{- printf "%s-certs" (include "evi.fullname" .) -}}
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
Called with the chart's context for pods, or with a dict for a workload's pod template:
  root: the chart's context; meta: the CEL path of the template's metadata
  (object.spec.template.metadata); guard: has() checks that the template and its metadata
  exist, so that the expression never fails to evaluate (an error would apply failurePolicy).
*/}}
{{- define "evi.matchExpression" -}}
{{- $root := . -}}{{- $meta := "object.metadata" -}}{{- $guard := "" -}}
{{- if hasKey . "meta" }}{{ $root = .root }}{{ $meta = .meta }}{{ $guard = .guard }}{{ end -}}
{{- $prefix := include "evi.prefix" $root -}}
{{- $annotations := printf "%s.annotations" $meta -}}
{{- $hasAnnotations := printf "has(%s)" $annotations -}}
{{- $labels := printf "%s.labels" $meta -}}
{{- $hasLabels := printf "has(%s)" $labels -}}
{{- if $guard }}
{{- $hasAnnotations = printf "%s && has(%s)" $guard $annotations -}}
{{- $hasLabels = printf "(%s && has(%s))" $guard $labels -}}
{{- end -}}
{{- /* The API server iterates a map of annotations in time that grows with the square of their
number (48,000 cost it ~4 s): a pod with more than 4,096 is sent without looking, and the
webhook, whose work is linear in the review's bytes, decides it. */ -}}
{{- $terms := list (printf "(%s && (size(%s) > 4096 || %s.exists(k, k.startsWith('%s/'))))" $hasAnnotations $annotations $annotations $prefix) -}}
{{- range $root.Values.config.rules -}}
{{- $parts := list -}}
{{- if .namespaces -}}
{{- $ns := list -}}
{{- range .namespaces }}{{ $ns = append $ns (printf "'%s'" .) }}{{ end -}}
{{- $parts = append $parts (printf "request.namespace in [%s]" (join ", " $ns)) -}}
{{- end -}}
{{- with .podSelector -}}
{{- range $k, $v := .matchLabels -}}
{{- $parts = append $parts (printf "(%s && '%s' in %s && %s['%s'] == '%s')" $hasLabels $k $labels $labels $k $v) -}}
{{- end -}}
{{- range .matchExpressions -}}
{{- $vals := list -}}
{{- range .values }}{{ $vals = append $vals (printf "'%s'" .) }}{{ end -}}
{{- if eq .operator "In" -}}
{{- $parts = append $parts (printf "(%s && '%s' in %s && %s['%s'] in [%s])" $hasLabels .key $labels $labels .key (join ", " $vals)) -}}
{{- else if eq .operator "NotIn" -}}
{{- $parts = append $parts (printf "(!%s || !('%s' in %s) || !(%s['%s'] in [%s]))" $hasLabels .key $labels $labels .key (join ", " $vals)) -}}
{{- else if eq .operator "Exists" -}}
{{- $parts = append $parts (printf "(%s && '%s' in %s)" $hasLabels .key $labels) -}}
{{- else if eq .operator "DoesNotExist" -}}
{{- $parts = append $parts (printf "(!%s || !('%s' in %s))" $hasLabels .key $labels) -}}
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
The URL of the workload webhook when webhook.url is set: webhook.workloads.url, else
webhook.url with its path /mutate made /validate.
*/}}
{{- define "evi.validateUrl" -}}
{{- if .Values.webhook.workloads.url -}}
{{- .Values.webhook.workloads.url -}}
{{- else if hasSuffix "/mutate" .Values.webhook.url -}}
{{- regexReplaceAll "/mutate$" .Values.webhook.url "/validate" -}}
{{- else -}}
{{- fail (printf "webhook.url %q does not end in /mutate: set webhook.workloads.url to the workload webhook's URL (path /validate), or webhook.workloads.enabled=false" .Values.webhook.url) -}}
{{- end -}}
{{- end -}}

{{/*
Whether the webhook reads the cluster (CSIDriver and StorageClass watches): unless
config.clusterChecks is off. Then it needs its service-account token, RBAC and egress to the
API server.
*/}}
{{- define "evi.clusterChecks" -}}
{{- if or (ne (default "enforce" .Values.config.clusterChecks) "off") (include "evi.namespaceLabels" .) -}}true{{- end -}}
{{- end -}}

{{/*
Whether a policy override selects namespaces by label: the webhook then watches Namespaces.
*/}}
{{- define "evi.namespaceLabels" -}}
{{- range .Values.config.policyOverrides -}}
{{- if .namespaceSelector -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Which namespaces the webhooks are called for: never kube-system, the release namespace or
webhook.excludeNamespaces; within webhook.namespaceSelector.
*/}}
{{- define "evi.namespaceSelector" -}}
{{- with .Values.webhook.namespaceSelector.matchLabels }}
matchLabels:
  {{- toYaml . | nindent 2 }}
{{- end }}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values:
      {{- toYaml (concat (list "kube-system" .Release.Namespace) .Values.webhook.excludeNamespaces | uniq) | nindent 6 }}
  {{- with .Values.webhook.namespaceSelector.matchExpressions }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* "true" when the workload webhook (ValidatingWebhookConfiguration) is rendered. */}}
{{- define "evi.workloadsWebhook" -}}
{{- if and .Values.webhook.workloads.enabled (semverCompare ">=1.28-0" .Capabilities.KubeVersion.Version) }}true{{ end -}}
{{- end -}}

{{/*
The serving certificate's names in every TLS mode, comma-separated: the Service's, the name
the API server checks first (<fullname>.<namespace>.svc), then its other forms; with
webhook.url, that URL's host too (a DNS name or an IP address).
*/}}
{{- define "evi.tlsNames" -}}
{{- $fullname := include "evi.fullname" . -}}
{{- $svc := printf "%s.%s.svc" $fullname .Release.Namespace -}}
{{- $names := list $svc (printf "%s.cluster.local" $svc) $fullname (printf "%s.%s" $fullname .Release.Namespace) -}}
{{- with .Values.webhook.url }}{{ $names = append $names ((urlParse .).host | splitList ":" | first) }}{{ end -}}
{{- join "," $names -}}
{{- end -}}

{{/* Whether a certificate name is an IP address (the URL host of webhook.url may be one). */}}
{{- define "evi.isIP" -}}
{{- if regexMatch "^[0-9.]+$" . }}true{{ end -}}
{{- end -}}

{{/*
A webhook's clientConfig, for both configurations: dict root (the chart's context), path
(/mutate or /validate), url (used instead of the Service when set) and caBundle (left out when
empty: cert-manager's CA injector or the webhook itself sets it).
*/}}
{{- define "evi.clientConfig" -}}
{{- if .url }}
url: {{ .url | quote }}
{{- else }}
service:
  name: {{ include "evi.fullname" .root }}
  namespace: {{ .root.Release.Namespace }}
  path: {{ .path }}
  port: {{ .root.Values.service.port }}
{{- end }}
{{- if .caBundle }}
caBundle: {{ .caBundle }}
{{- end }}
{{- end -}}

{{/* A webhook configuration's annotations: cert-manager's CA injector, in certManager mode. */}}
{{- define "evi.webhookAnnotations" -}}
{{- if eq (include "evi.tlsMode" .) "certManager" }}
annotations:
  cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/{{ include "evi.fullname" . }}-serving
{{- end }}
{{- end -}}

{{/*
selfManaged mode: the caBundle the webhook has set on this live configuration, so that a helm
upgrade keeps it (never blanks it). `helm template` (Argo CD) looks nothing up and renders none.
Called with (list $ kind name).
*/}}
{{- define "evi.liveCaBundle" -}}
{{- $root := index . 0 -}}
{{- $live := lookup "admissionregistration.k8s.io/v1" (index . 1) "" (index . 2) -}}
{{- $bundle := "" -}}
{{- if $live }}{{ range ($live.webhooks | default list) }}{{ if and (not $bundle) .clientConfig.caBundle }}{{ $bundle = .clientConfig.caBundle }}{{ end }}{{ end }}{{ end -}}
{{- $bundle -}}
{{- end -}}

{{/* The webhook's image: by digest when image.digest is set, else by tag. */}}
{{- define "evi.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/*
The install check's pods' labels: not the webhook's selector labels, so that neither its
Service, its PodDisruptionBudget nor its NetworkPolicy ever selects a check pod.
*/}}
{{- define "evi.checkInstallLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "evi.name" . }}-check-install
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: check-install
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The install check's pod spec (the hook Job's template and the helm test pod). */}}
{{- define "evi.checkInstallPodSpec" -}}
restartPolicy: Never
serviceAccountName: {{ printf "%s-check-install" (include "evi.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  seccompProfile:
    type: RuntimeDefault
containers:
  - name: check-install
    image: {{ include "evi.image" . | quote }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    args:
      - check-install
      - --namespace={{ .Values.checkInstall.namespace }}
      - --prefix={{ include "evi.prefix" . }}
      - --request={{ .Values.checkInstall.request }}
      - --timeout-seconds={{ .Values.checkInstall.timeoutSeconds }}
      {{- if not (include "evi.workloadsWebhook" .) }}
      - --skip-workloads
      {{- end }}
    # The last lines of its output (the cause) become the pod's termination message.
    terminationMessagePolicy: FallbackToLogsOnError
    resources:
      requests:
        cpu: 10m
        memory: 16Mi
      limits:
        memory: 64Mi
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      runAsNonRoot: true
      privileged: false
      capabilities:
        drop: [ALL]
      seccompProfile:
        type: RuntimeDefault
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
