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

{{/* A CRD of files/, kept on uninstall when crds.keep is set, with crds.annotations. */}}
{{- define "pagoda.keptCRD" -}}
{{- $object := .object -}}
{{- $annotations := merge (deepCopy .root.Values.crds.annotations) ($object.metadata.annotations | default dict) -}}
{{- if .root.Values.crds.keep -}}
{{- $_ := set $annotations "helm.sh/resource-policy" "keep" -}}
{{- end -}}
{{- if $annotations -}}
{{- $_ := set $object.metadata "annotations" $annotations -}}
{{- end -}}
{{ toYaml $object }}
{{- end -}}
