{{- define "pagoda.operatorImage" -}}
{{ .Values.operator.image.repository }}:{{ .Values.operator.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "pagoda.runtimeImage" -}}
{{ .Values.runtime.image.repository }}:{{ .Values.runtime.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "pagoda.labels" -}}
app.kubernetes.io/name: pagoda-operator
app.kubernetes.io/part-of: pagoda
{{- end -}}

{{/* A file of files/ as an object, kept on uninstall when crds.keep is set. */}}
{{- define "pagoda.keptFile" -}}
{{- $object := .root.Files.Get .file | fromYaml -}}
{{- if .root.Values.crds.keep -}}
{{- $_ := set $object.metadata "annotations" (merge (dict "helm.sh/resource-policy" "keep") ($object.metadata.annotations | default dict)) -}}
{{- end -}}
{{ toYaml $object }}
{{- end -}}
