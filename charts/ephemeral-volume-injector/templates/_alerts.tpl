{{/*
The alerts, as the groups of a Prometheus rule file; each has a runbook in docs/alerts.md.
Rendered into the PrometheusRule (metrics.prometheusRule.enabled) and, with the default values,
committed as the plain rule file monitoring/alerts.yaml (tests/chart checks that the two agree;
monitoring/render-alerts.py writes it). Thresholds: metrics.prometheusRule.thresholds.
*/}}
{{- define "evi.alertGroups" -}}
{{- $t := .Values.metrics.prometheusRule.thresholds -}}
{{- /* The API server's name for our webhooks: volumes.<prefix> and <kind>.<prefix>. */ -}}
{{- $webhooks := printf "name=~\".+\\\\.%s\"" (include "evi.prefix" . | regexQuoteMeta | replace "\\" "\\\\") -}}
{{- $runbook := .Values.metrics.prometheusRule.runbookUrl -}}
groups:
  - name: ephemeral-volume-injector
    rules:
      - alert: EphemeralVolumeInjectorNoReadyReplica
        expr: (sum(evi_ready) or vector(0)) < 1
        for: 2m
        labels:
          severity: critical
        annotations:
          summary: No replica of the webhook is ready, or none is scraped.
          description: >-
            No ready replica has reported for 2 minutes. Pods that ask for volumes are refused
            (failurePolicy Fail) or created without them (Ignore).
          {{- with $runbook }}
          runbook_url: {{ printf "%s#ephemeralvolumeinjectornoreadyreplica" . }}
          {{- end }}
      - alert: EphemeralVolumeInjectorAdmissionErrors
        expr: |-
          (
            (sum(rate(apiserver_admission_webhook_rejection_count{{ "{" }}{{ $webhooks }},error_type="calling_webhook_error"}[5m])) or vector(0))
            + (sum(rate(apiserver_admission_webhook_fail_open_count{{ "{" }}{{ $webhooks }}}[5m])) or vector(0))
          )
          / sum(rate(apiserver_admission_webhook_admission_duration_seconds_count{{ "{" }}{{ $webhooks }}}[5m]))
          > {{ $t.errorRatio }}
        for: 5m
        labels:
          severity: critical
        annotations:
          summary: The API server fails to call the webhook.
          description: >-
            {{`{{ $value | humanizePercentage }}`}} of the API server's calls to the webhook
            failed (timeout, TLS, connection or 5xx) over 5 minutes.
          {{- with $runbook }}
          runbook_url: {{ printf "%s#ephemeralvolumeinjectoradmissionerrors" . }}
          {{- end }}
      - alert: EphemeralVolumeInjectorPodRefusals
        expr: |-
          sum by (reason) (increase(evi_denials_total[10m])) >= {{ $t.refusals }}
          and on ()
          sum(increase(evi_denials_total[10m])) / sum(increase(evi_admission_requests_total[10m])) > {{ $t.refusalRatio }}
        labels:
          severity: warning
        annotations:
          summary: Many pods refused (or admitted without volumes) for one reason.
          description: >-
            {{`{{ $value | humanize }}`}} pods were refused for reason {{`{{ $labels.reason }}`}}
            in 10 minutes (admitted-on-error: admitted without their volumes under onError warn).
            evi_pod_denials_by_owner_total tells by which kind of controller.
          {{- with $runbook }}
          runbook_url: {{ printf "%s#ephemeralvolumeinjectorpodrefusals" . }}
          {{- end }}
      - alert: EphemeralVolumeInjectorWorkloadRefusals
        expr: |-
          sum by (kind) (increase(evi_workload_reviews_total{result!~"allowed|invalid"}[10m])) >= {{ $t.refusals }}
          and on ()
          sum(increase(evi_workload_reviews_total{result!~"allowed|invalid"}[10m])) / sum(increase(evi_workload_reviews_total[10m])) > {{ $t.refusalRatio }}
        labels:
          severity: warning
        annotations:
          summary: Many workloads (Jobs, Deployments, …) refused for their pod template.
          description: >-
            {{`{{ $value | humanize }}`}} {{`{{ $labels.kind }}`}} objects were refused (or admitted
            with a warning under onError warn) in 10 minutes because their pods would be.
          {{- with $runbook }}
          runbook_url: {{ printf "%s#ephemeralvolumeinjectorworkloadrefusals" . }}
          {{- end }}
      - alert: EphemeralVolumeInjectorSlowAdmission
        expr: |-
          histogram_quantile(0.99, sum by (le) (rate(evi_admission_duration_seconds_bucket[5m])))
          > {{ $t.latencyP99Seconds }}
        for: 10m
        labels:
          severity: warning
        annotations:
          summary: The webhook's p99 decision time is high.
          description: >-
            The 99th percentile of the webhook's own time per review (decode, decide, encode)
            is {{`{{ $value | humanizeDuration }}`}} over 5 minutes.
          {{- with $runbook }}
          runbook_url: {{ printf "%s#ephemeralvolumeinjectorslowadmission" . }}
          {{- end }}
      - alert: EphemeralVolumeInjectorCertificateExpiring
        expr: evi_certificate_expiry_seconds < {{ $t.certificateExpirySeconds | int64 }}
        for: 10m
        labels:
          severity: warning
        annotations:
          summary: A certificate of the webhook expires soon and has not been renewed.
          description: >-
            The {{`{{ $labels.certificate }}`}} certificate a replica serves with expires in
            {{`{{ $value | humanizeDuration }}`}}.
          {{- with $runbook }}
          runbook_url: {{ printf "%s#ephemeralvolumeinjectorcertificateexpiring" . }}
          {{- end }}
      - alert: EphemeralVolumeInjectorClusterChecksDegraded
        expr: evi_cluster_checks_degraded == 1
        for: 10m
        labels:
          severity: warning
        annotations:
          summary: The webhook cannot list the cluster's CSIDrivers and StorageClasses.
          description: >-
            A replica has had no CSIDriver and StorageClass lists for 10 minutes: it admits
            volumes it cannot check (checks in warn).
          {{- with $runbook }}
          runbook_url: {{ printf "%s#ephemeralvolumeinjectorclusterchecksdegraded" . }}
          {{- end }}
      - alert: EphemeralVolumeInjectorConfigReloadFailed
        expr: evi_config_last_reload_successful == 0
        for: 5m
        labels:
          severity: warning
        annotations:
          summary: A new configuration was refused; the previous one stays in force.
          description: >-
            A replica refused the last change of its configuration ConfigMap 5 minutes ago or
            more, and still enforces the configuration before it.
          {{- with $runbook }}
          runbook_url: {{ printf "%s#ephemeralvolumeinjectorconfigreloadfailed" . }}
          {{- end }}
{{- end -}}
