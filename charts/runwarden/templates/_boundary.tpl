{{- /*
runwarden.runnerBoundary: what the platform configuration's `runner` holds
(docs/policy.md, boundary rules): the runner service account and the Secrets
the rendered runner pod template names, which the policies give to runner
pods only. The chart writes it, never the values (the schema refuses
webhook.platform.runner).
*/ -}}
{{- define "runwarden.runnerBoundary" -}}
{{- $pt := include (print .Template.BasePath "/pod-template.yaml") . | fromYaml }}
{{- $spec := $pt.template.spec | default dict }}
{{- $secrets := list }}
{{- range $spec.imagePullSecrets }}{{ $secrets = append $secrets .name }}{{ end }}
{{- range $v := $spec.volumes }}
{{- if $v.secret }}{{ $secrets = append $secrets $v.secret.secretName }}{{ end }}
{{- if $v.projected }}{{ range $v.projected.sources }}{{ if .secret }}{{ $secrets = append $secrets .secret.name }}{{ end }}{{ end }}{{ end }}
{{- if $v.azureFile }}{{ $secrets = append $secrets $v.azureFile.secretName }}{{ end }}
{{- range $kind, $ref := dict "csi" "nodePublishSecretRef" "cephfs" "secretRef" "rbd" "secretRef" "iscsi" "secretRef" "flexVolume" "secretRef" "scaleIO" "secretRef" "storageos" "secretRef" }}
{{- $src := index $v $kind | default dict }}{{ if index $src $ref }}{{ $secrets = append $secrets (index $src $ref).name }}{{ end }}
{{- end }}
{{- end }}
{{- range concat ($spec.initContainers | default list) ($spec.containers | default list) }}
{{- range .env }}{{ if and .valueFrom .valueFrom.secretKeyRef }}{{ $secrets = append $secrets .valueFrom.secretKeyRef.name }}{{ end }}{{ end }}
{{- range .envFrom }}{{ if .secretRef }}{{ $secrets = append $secrets .secretRef.name }}{{ end }}{{ end }}
{{- end }}
{{- toYaml (dict "serviceAccount" ($spec.serviceAccountName | default "default") "secrets" ($secrets | compact | uniq | sortAlpha)) }}
{{- end -}}
