{{/*
Shared pieces of the two DaemonSets. Names carry the hypervisor, not the release name, so that
a KVM and an MSHV release can share a namespace and `hvconform manifests` renders the same
objects as `helm template` whatever the release is called.
*/}}

{{/* The image: repository, then :tag (the appVersion unless a digest pins it), then @digest. */}}
{{- define "hv.image" -}}
{{- $tag := .Values.image.tag -}}
{{- if and (not $tag) (not .Values.image.digest) -}}
{{- $tag = .Chart.AppVersion -}}
{{- end -}}
{{- .Values.image.repository -}}
{{- with $tag }}:{{ . }}{{ end -}}
{{- with .Values.image.digest }}@{{ . }}{{ end -}}
{{- end -}}

{{/* In-container paths: always the standard ones, wherever the node keeps them. */}}
{{- define "hv.pluginDir" -}}/var/lib/kubelet/device-plugins{{- end -}}
{{- define "hv.cdiDir" -}}/var/run/cdi{{- end -}}
{{/* Host paths: the node's kubelet root and CDI dir (values kubeletRootDir, cdiDir). */}}
{{- define "hv.hostPluginDir" -}}{{ trimSuffix "/" .Values.kubeletRootDir }}/device-plugins{{- end -}}
{{- define "hv.hostCdiDir" -}}{{ .Values.cdiDir }}{{- end -}}
{{/* The DRA driver's dirs: the kubelet's plugin registration dir and the driver's own dir,
mounted at the same paths in the pod (the driver names its endpoint to the kubelet). */}}
{{- define "hv.hostRegistryDir" -}}{{ trimSuffix "/" .Values.kubeletRootDir }}/plugins_registry{{- end -}}
{{- define "hv.hostDraDir" -}}{{ trimSuffix "/" .Values.kubeletRootDir }}/plugins/{{ .Values.dra.driverName }}{{- end -}}
{{- define "hv.draName" -}}hv-dra-driver-{{ .Values.hypervisor }}{{- end -}}
{{/* The probe's extra flags: the DRA driver's dir (the dict passed to hv.daemonset). */}}
{{- define "hv.probeDir" -}}
{{- if eq .mode "dra" }}, "--dra-plugin-dir", {{ include "hv.hostDraDir" .root | quote }}{{ end -}}
{{- end -}}
{{- define "hv.hostDevView" -}}/host-dev{{- end -}}

{{/* Labels of one DaemonSet and its pods; `.name` and `.component` come from the caller. */}}
{{- define "hv.labels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: hyperlight
{{- end -}}

{{/* The flags both DaemonSets share: the device, its host view, the kubelet dir, the endpoints.
A list, rendered one quoted item per line by the DaemonSet. */}}
{{- define "hv.commonArgs" -}}
{{- $v := .Values -}}
{{- $args := list "--hypervisor-device" (printf "/dev/%s" $v.hypervisor) -}}
{{- $args = concat $args (list "--host-dev-dir" (include "hv.hostDevView" .)) -}}
{{- $args = concat $args (list "--device-plugin-dir" (include "hv.pluginDir" .)) -}}
{{- if $v.metrics.enabled -}}
{{- $args = concat $args (list "--health-addr" (printf "%s:%v" $v.metrics.host $v.metrics.port)) -}}
{{- end -}}
{{- toJson $args -}}
{{- end -}}
