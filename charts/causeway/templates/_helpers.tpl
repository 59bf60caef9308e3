{{/*
causeway.image: one component's image reference from .Values.images.<name>:
<registry>/<name>@<digest> when a digest is set, else <registry>/<name>:<tag>,
the registry and tag defaulting to .Values.image's and the chart's appVersion.
Called with (dict "root" $ "image" "controlplane").
*/}}
{{- define "causeway.image" -}}
{{- $v := .root.Values -}}
{{- $img := index $v.images .image -}}
{{- $ref := printf "%s/%s" ($img.registry | default $v.image.registry) $img.name -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $ref $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $ref ($img.tag | default $v.image.tag | default .root.Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* causeway.container: a container's image and pull policy lines. */}}
{{- define "causeway.container" -}}
image: {{ include "causeway.image" . }}
imagePullPolicy: {{ .root.Values.image.pullPolicy }}
{{- end -}}

{{/*
causeway.scheduling: a pod's affinity, nodeSelector and tolerations, those
that are set, at .indent spaces. Called with (dict "pod" <values> "indent" N).
*/}}
{{- define "causeway.scheduling" -}}
{{- $s := dict -}}
{{- range $k := list "affinity" "nodeSelector" "tolerations" -}}
{{- with index $.pod $k -}}
{{- $_ := set $s $k . -}}
{{- end -}}
{{- end -}}
{{- if $s -}}
{{- toYaml $s | nindent .indent -}}
{{- end -}}
{{- end -}}

{{/* causeway.pullSecrets: the pod's imagePullSecrets, when any, indented as a pod spec's field. */}}
{{- define "causeway.pullSecrets" -}}
{{- with .Values.imagePullSecrets -}}
{{- $l := list -}}
{{- range . -}}
{{- $l = append $l (dict "name" .) -}}
{{- end -}}
{{- toYaml (dict "imagePullSecrets" $l) | nindent 6 -}}
{{- end -}}
{{- end -}}
