{{/* Names and labels shared by every template. */}}
{{- define "runwarden.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "runwarden.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "runwarden.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "runwarden.runnerNamespace" -}}
{{- .Values.runnerNamespace | default (printf "%s-runners" .Release.Namespace) -}}
{{- end -}}

{{/* An image by digest (images.digests.<key>) when one is set, else by tag. */}}
{{- define "runwarden.image" -}}
{{- $repo := printf "%s/%s" (.root.Values.images.registry | trimSuffix "/") .name -}}
{{- with index (.root.Values.images.digests | default dict) .key -}}
{{- printf "%s@%s" $repo . -}}
{{- else -}}
{{- $tag := .tag | default .root.Values.images.tag | default .root.Chart.AppVersion -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}
{{- end -}}

{{/*
A Go duration (the schema's pattern: 1h30m, 2s, 500ms) in nanoseconds, as a
float in a string, for comparing two durations: float64 (include ...).
*/}}
{{- define "runwarden.nanoseconds" -}}
{{- $unit := dict "ns" 1 "us" 1e3 "µs" 1e3 "ms" 1e6 "s" 1e9 "m" 6e10 "h" 3.6e12 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9.]+[^0-9.]+" . -1 -}}
{{- $n := regexFind "^[0-9.]+" . -}}
{{- $total = addf $total (mulf $n (index $unit (trimPrefix $n .))) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{- define "runwarden.webhookService" -}}
{{- printf "%s-webhook" (include "runwarden.fullname" .) -}}
{{- end -}}

{{/* The restricted Pod Security profile, for runwarden's own containers. */}}
{{- define "runwarden.containerSecurity" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
  seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{/*
The policy files: the shipped set (charts/runwarden/policies, kept equal to
policies/ by make generate) with the overrides from values.
*/}}
{{- define "runwarden.policyFiles" -}}
{{- range $path, $_ := .Files.Glob "policies/*.rego" }}
{{- if not (hasKey $.Values.webhook.policyOverrides (base $path)) }}
{{ base $path }}: |
  {{- $.Files.Get $path | nindent 2 }}
{{- end }}
{{- end }}
{{- range $name, $src := .Values.webhook.policyOverrides }}
{{ $name }}: |
  {{- $src | nindent 2 }}
{{- end }}
{{- end }}

{{/*
One webhook of the admission configurations, for the handler at .path of
the webhook Service, or at .url in dev mode: the same pods in both.
*/}}
{{- define "runwarden.webhook" -}}
{{- $root := .root }}
{{- $values := $root.Values.webhook }}
{{- $svc := include "runwarden.webhookService" $root }}
name: pods.runwarden.dev
admissionReviewVersions: [v1]
clientConfig:
  {{- if $values.devMode.enabled }}
  url: {{ .url }}
  {{- with $values.devMode.caBundle }}
  caBundle: {{ . }}
  {{- end }}
  {{- else }}
  service: {name: {{ $svc }}, namespace: {{ $root.Release.Namespace | quote }}, path: {{ .path }}, port: 443}
  {{- end }}
{{- if .validating }}
# Every pod of the runner namespace, and every way to change one: other
# pods get the shape rules, and no pod takes the runner label, or changes
# its image or adds a debug container, unchecked; every subresource that
# changes a pod's spec (pods/ephemeralcontainers, pods/resize on Kubernetes
# 1.33 and later). And every way into a running one (exec, attach,
# port-forward: no-exec-into-runners). A CONNECT carries the options
# (PodExecOptions, ...), which have no labels, so an objectSelector would
# never match it: the webhook reads the pod itself.
rules:
- {operations: [CREATE, UPDATE], apiGroups: [""], apiVersions: [v1], resources: [pods, pods/ephemeralcontainers, pods/resize]}
- {operations: [CONNECT], apiGroups: [""], apiVersions: [v1], resources: [pods/exec, pods/attach, pods/portforward]}
# An update that changes neither the spec nor the labels, annotations and
# owner references, nor the Job controller's finalizer but by the Job
# controller (which removes it from every pod it tracks), needs no decision,
# and must not wait for the webhook. Anyone else's addition or removal of
# that finalizer is decided: a pod that ends without it is not counted.
matchConditions:
- name: changes-what-is-checked
  expression: >-
    request.operation != 'UPDATE' || object.spec != oldObject.spec ||
    !((!has(object.metadata.labels) && !has(oldObject.metadata.labels)) ||
      (has(object.metadata.labels) && has(oldObject.metadata.labels) && object.metadata.labels == oldObject.metadata.labels)) ||
    !((!has(object.metadata.annotations) && !has(oldObject.metadata.annotations)) ||
      (has(object.metadata.annotations) && has(oldObject.metadata.annotations) && object.metadata.annotations == oldObject.metadata.annotations)) ||
    !((!has(object.metadata.ownerReferences) && !has(oldObject.metadata.ownerReferences)) ||
      (has(object.metadata.ownerReferences) && has(oldObject.metadata.ownerReferences) && object.metadata.ownerReferences == oldObject.metadata.ownerReferences)) ||
    (!(request.userInfo.username in {{ toJson $values.jobControllerUsers }}) &&
      ((has(object.metadata.finalizers) && 'batch.kubernetes.io/job-tracking' in object.metadata.finalizers) !=
        (has(oldObject.metadata.finalizers) && 'batch.kubernetes.io/job-tracking' in oldObject.metadata.finalizers)))
{{- else }}
rules:
- {operations: [CREATE], apiGroups: [""], apiVersions: [v1], resources: [pods]}
# A pod without the label is no runner to the validating handler either
# (runner means this value exactly), and gets no credentials: leaving the
# label off opts a pod out of nothing but what it would not be given.
objectSelector:
  matchLabels: {runwarden.dev/runner: "true"}
{{- end }}
# This release's runner namespace only; never kube-system or its own. By
# name alone: the API server sets kubernetes.io/metadata.name to it and
# keeps it, where any other label is its writer's to remove, and with it
# every check of both webhooks.
namespaceSelector:
  matchExpressions:
  - {key: kubernetes.io/metadata.name, operator: In, values: [{{ include "runwarden.runnerNamespace" $root | quote }}]}
  - {key: kubernetes.io/metadata.name, operator: NotIn, values: [kube-system, {{ $root.Release.Namespace | quote }}]}
failurePolicy: {{ $values.failurePolicy }}
sideEffects: None
timeoutSeconds: {{ $values.timeoutSeconds }}
{{- end -}}
