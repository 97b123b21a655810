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

{{- /*
runwarden.platformObjects: the Secrets and ConfigMaps of the runner namespace
that the platform names and runner pods read: the secret stores' and the
credential sets' Secrets, the Secrets of the rendered runner pod template
(runwarden.runnerBoundary), and the ConfigMaps that template mounts or reads
(the CA bundle's among them). The writers policy keeps them the platform's
(templates/writers-policy.yaml, -platform).
*/ -}}
{{- define "runwarden.platformObjects" -}}
{{- $pt := include (print .Template.BasePath "/pod-template.yaml") . | fromYaml }}
{{- $spec := $pt.template.spec | default dict }}
{{- $secrets := (include "runwarden.runnerBoundary" . | fromYaml).secrets | default list }}
{{- $platform := .Values.webhook.platform | default dict }}
{{- range $k, $s := $platform.secretStores | default dict }}{{ if and (kindIs "map" $s) $s.secretName }}{{ $secrets = append $secrets $s.secretName }}{{ end }}{{ end }}
{{- range $platform.credentialSets | default list }}{{ if .secretName }}{{ $secrets = append $secrets .secretName }}{{ end }}{{ end }}
{{- $configMaps := list }}
{{- range $v := $spec.volumes }}
{{- if $v.configMap }}{{ $configMaps = append $configMaps $v.configMap.name }}{{ end }}
{{- if $v.projected }}{{ range $v.projected.sources }}{{ if .configMap }}{{ $configMaps = append $configMaps .configMap.name }}{{ end }}{{ end }}{{ end }}
{{- end }}
{{- range concat ($spec.initContainers | default list) ($spec.containers | default list) }}
{{- range .env }}{{ if and .valueFrom .valueFrom.configMapKeyRef }}{{ $configMaps = append $configMaps .valueFrom.configMapKeyRef.name }}{{ end }}{{ end }}
{{- range .envFrom }}{{ if .configMapRef }}{{ $configMaps = append $configMaps .configMapRef.name }}{{ end }}{{ end }}
{{- end }}
{{- /* kube-root-ca.crt is the cluster's, published into every namespace by its controller. */}}
{{- toYaml (dict "secrets" ($secrets | compact | uniq | sortAlpha) "configMaps" (without ($configMaps | compact | uniq | sortAlpha) "kube-root-ca.crt")) }}
{{- end -}}
