{{/* The release's name for its objects. */}}
{{- define "docstream.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "docstream.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one role: (dict "root" $ "role" "worker"). */}}
{{- define "docstream.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{- define "docstream.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
The roles: values key, the command (also the component label), and the
drains its process runs on SIGTERM.
*/}}
{{- define "docstream.roles" -}}
serve: {command: serve, drains: [publisherTimeoutS, exportTimeoutS]}
worker: {command: worker, drains: [subscriberTimeoutS]}
bboxWorker: {command: bbox-worker, drains: [subscriberTimeoutS]}
intake: {command: intake, drains: [subscriberTimeoutS]}
extractorServe: {command: extractor-serve, drains: []}
{{- end -}}

{{/*
terminationGracePeriodSeconds of a role: its longest drain, plus the
margin to flush and exit. (dict "root" $ "drains" list)
*/}}
{{- define "docstream.grace" -}}
{{- $longest := 0 -}}
{{- range .drains -}}
{{- $longest = max $longest (index $.root.Values.drain .) -}}
{{- end -}}
{{- add $longest $.root.Values.drain.marginS -}}
{{- end -}}

{{/* A topic's name as docstream's settings make it. */}}
{{- define "docstream.topic" -}}
{{- $prefix := index .root.Values.settings "DOCSTREAM_TOPIC_PREFIX" | default "" -}}
{{- printf "%s%s" $prefix (index .root.Values.settings .var | default .default) -}}
{{- end -}}

{{/* Where each secret's file is mounted, by values key. */}}
{{- define "docstream.secretVariables" -}}
databaseUrl: DATABASE_URL
kafkaSaslPassword: DOCSTREAM_KAFKA_SASL_PASSWORD
kafkaOauthClientSecret: DOCSTREAM_KAFKA_OAUTH_CLIENT_SECRET
callbackSecret: DOCSTREAM_CALLBACK_SECRET
s3SecretAccessKey: DOCSTREAM_FILES_S3_SECRET_ACCESS_KEY
{{- end -}}

{{/* The environment every docstream container gets. */}}
{{- define "docstream.env" -}}
{{- range $name, $value := .Values.settings }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
- name: DOCSTREAM_HTTP_ADDR
  value: "0.0.0.0:8080"
- name: DOCSTREAM_METRICS_ADDR
  value: "0.0.0.0:9464"
- name: DOCSTREAM_SUBSCRIBER_DRAIN_TIMEOUT_S
  value: {{ .Values.drain.subscriberTimeoutS | quote }}
- name: DOCSTREAM_PUBLISHER_DRAIN_TIMEOUT_S
  value: {{ .Values.drain.publisherTimeoutS | quote }}
- name: DOCSTREAM_EXPORT_DRAIN_TIMEOUT_S
  value: {{ .Values.drain.exportTimeoutS | quote }}
- name: DOCSTREAM_REBALANCE_DRAIN_TIMEOUT_S
  value: {{ .Values.drain.rebalanceTimeoutS | quote }}
- name: DOCSTREAM_FILES_DIR
  value: /var/lib/docstream/files
{{- with .Values.files.s3 }}
{{- if .bucket }}
- name: DOCSTREAM_FILES_S3_BUCKET
  value: {{ .bucket | quote }}
- name: DOCSTREAM_FILES_S3_ENDPOINT
  value: {{ .endpoint | quote }}
- name: DOCSTREAM_FILES_S3_ACCESS_KEY_ID
  value: {{ .accessKeyId | quote }}
{{- end }}
{{- end }}
{{- if .Values.kafka.properties.secretName }}
- name: DOCSTREAM_KAFKA_PROPERTIES_FILE
  value: /etc/docstream/kafka-properties/{{ .Values.kafka.properties.key }}
{{- end }}
{{- $variables := include "docstream.secretVariables" . | fromYaml }}
{{- range $key, $secret := .Values.secrets }}
{{- if $secret.secretName }}
- name: {{ index $variables $key }}_FILE
  value: /etc/docstream/secrets/{{ $key }}/{{ $secret.key }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The volumes every docstream pod mounts, and where. */}}
{{- define "docstream.volumes" -}}
- name: tmp
  emptyDir: {}
- name: files
{{- if .Values.files.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.files.existingClaim }}
{{- else }}
  emptyDir: {}
{{- end }}
{{- range $key, $secret := .Values.secrets }}
{{- if $secret.secretName }}
- name: secret-{{ $key | kebabcase }}
  secret:
    secretName: {{ $secret.secretName }}
    items:
      - key: {{ $secret.key }}
        path: {{ $secret.key }}
{{- end }}
{{- end }}
{{- if .Values.kafka.properties.secretName }}
- name: kafka-properties
  secret:
    secretName: {{ .Values.kafka.properties.secretName }}
    items:
      - key: {{ .Values.kafka.properties.key }}
        path: {{ .Values.kafka.properties.key }}
{{- end }}
{{- if .Values.kafka.certificatesSecret }}
- name: kafka-certificates
  secret:
    secretName: {{ .Values.kafka.certificatesSecret }}
{{- end }}
{{- if .Values.postgres.certificatesSecret }}
- name: postgres-certificates
  secret:
    secretName: {{ .Values.postgres.certificatesSecret }}
    # libpq accepts a key owned by root and readable by its group (fsGroup).
    defaultMode: 0440
{{- end }}
{{- end -}}

{{- define "docstream.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: files
  mountPath: /var/lib/docstream/files
{{- range $key, $secret := .Values.secrets }}
{{- if $secret.secretName }}
- name: secret-{{ $key | kebabcase }}
  mountPath: /etc/docstream/secrets/{{ $key }}
  readOnly: true
{{- end }}
{{- end }}
{{- if .Values.kafka.properties.secretName }}
- name: kafka-properties
  mountPath: /etc/docstream/kafka-properties
  readOnly: true
{{- end }}
{{- if .Values.kafka.certificatesSecret }}
- name: kafka-certificates
  mountPath: /etc/docstream/kafka
  readOnly: true
{{- end }}
{{- if .Values.postgres.certificatesSecret }}
- name: postgres-certificates
  mountPath: /etc/docstream/postgres
  readOnly: true
{{- end }}
{{- end -}}
