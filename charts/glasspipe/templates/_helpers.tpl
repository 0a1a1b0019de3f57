{{- define "glasspipe.fullname" -}}
{{- printf "%s-glasspipe" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "glasspipe.serviceAccountName" -}}
{{- default (include "glasspipe.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "glasspipe.labels" -}}
app.kubernetes.io/name: glasspipe-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "glasspipe.selectorLabels" -}}
app.kubernetes.io/name: glasspipe-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
