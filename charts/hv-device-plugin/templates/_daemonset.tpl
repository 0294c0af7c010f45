{{/*
One DaemonSet of the plugin. The caller passes a dict: root (the chart's top context), name,
component, mode (hypervisor, device-access or dra), args (a list), cdi (mount the CDI dir) and
resources. The policy tests (tests/manifests, tests/chart) fail if any of the properties below
is lost: no capabilities, RuntimeDefault seccomp, read-only root, no service-account token (but
the DRA driver's: it reads claims and writes its node's slice, nothing else), an explicit
termination-log path on an emptyDir.
*/}}
{{- define "hv.daemonset" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace | quote }}
  labels:
    {{- include "hv.labels" . | nindent 4 }}
spec:
  selector:
    matchLabels:
      app.kubernetes.io/name: {{ .name }}
  updateStrategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 1
  template:
    metadata:
      labels:
        {{- include "hv.labels" . | nindent 8 }}
        # What the metrics Service selects: both DaemonSets of this hypervisor.
        hyperlight.dev/device-plugin: {{ $v.hypervisor | quote }}
    spec:
      {{- with $v.priorityClassName }}
      priorityClassName: {{ . | quote }}
      {{- end }}
      {{- if eq .mode "dra" }}
      # The DRA driver reads its claims and writes its own node's ResourceSlice (rbac-dra.yaml).
      serviceAccountName: {{ include "hv.draName" $root }}
      automountServiceAccountToken: true
      {{- else }}
      # The plugin talks to the kubelet through its socket dir only; it never calls the API.
      automountServiceAccountToken: false
      {{- end }}
      enableServiceLinks: false
      {{- with $v.image.pullSecrets }}
      imagePullSecrets:
        {{- range . }}
        - name: {{ . | quote }}
        {{- end }}
      {{- end }}
      securityContext:
        seccompProfile:
          type: RuntimeDefault
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
              - matchExpressions:
                  - key: hyperlight.dev/hypervisor
                    operator: In
                    values: [{{ $v.hypervisor | quote }}]
                  {{- if eq $v.hypervisor "mshv" }}
                  # MSHV root-partition images exist for x86-64 only.
                  - key: kubernetes.io/arch
                    operator: In
                    values: ["amd64"]
                  {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: plugin
          image: {{ include "hv.image" $root | quote }}
          imagePullPolicy: {{ $v.image.pullPolicy }}
          command: ["hv-device-plugin"]
          args:
            {{- range .args }}
            - {{ . | quote }}
            {{- end }}
          {{- if or $v.extraEnv (eq .mode "dra") }}
          env:
            {{- if eq .mode "dra" }}
            # its node's name: the slice's node and pool
            - name: HV_NODE_NAME
              valueFrom:
                fieldRef:
                  fieldPath: spec.nodeName
            {{- end }}
            {{- with $v.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- end }}
          {{- if $v.metrics.enabled }}
          ports:
            # /metrics, /healthz and /readyz: the plugin's one HTTP listener (--health-addr).
            - name: metrics
              containerPort: {{ $v.metrics.port }}
              protocol: TCP
          {{- end }}
          securityContext:
            # Root without capabilities: the kubelet's plugin dir and the CDI dir are owned by
            # root, and no capability is needed to create a socket or a file there.
            runAsUser: 0
            runAsGroup: 0
            privileged: false
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities:
              drop: ["ALL"]
          # Explicit and on a writable emptyDir: the default /dev/termination-log needs a mount
          # point in /dev, which cannot be made where /dev is a read-only view (seen on KIND).
          terminationMessagePath: /tmp/termination-log
          terminationMessagePolicy: FallbackToLogsOnError
          # Exec probes ask gRPC Health on the very socket the kubelet dials: they need no
          # network port, and work with metrics disabled.
          startupProbe:
            exec:
              command: ["hv-device-plugin", "probe", "liveness", "--mode", {{ .mode | quote }}{{ include "hv.probeDir" . }}]
            {{- toYaml $v.probes.startup | nindent 12 }}
          livenessProbe:
            exec:
              command: ["hv-device-plugin", "probe", "liveness", "--mode", {{ .mode | quote }}{{ include "hv.probeDir" . }}]
            {{- toYaml $v.probes.liveness | nindent 12 }}
          readinessProbe:
            exec:
              command: ["hv-device-plugin", "probe", "readiness", "--mode", {{ .mode | quote }}{{ include "hv.probeDir" . }}]
            {{- toYaml $v.probes.readiness | nindent 12 }}
          resources:
            {{- toYaml .resources | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            {{- if eq .mode "dra" }}
            # at the host's own paths: the endpoint the driver names to the kubelet is dialled
            # on the host
            - name: plugins-registry
              mountPath: {{ include "hv.hostRegistryDir" $root }}
            - name: dra-plugin
              mountPath: {{ include "hv.hostDraDir" $root }}
            {{- else }}
            - name: device-plugins
              mountPath: {{ include "hv.pluginDir" $root }}
            {{- end }}
            {{- if .cdi }}
            - name: cdi
              mountPath: {{ include "hv.cdiDir" $root }}
            {{- end }}
            # Identity checks compare the device with the host's own entry. Recursive, so
            # that /dev/shm and other submounts are read-only too where the runtime can.
            - name: host-dev
              mountPath: {{ include "hv.hostDevView" $root }}
              readOnly: true
              recursiveReadOnly: IfPossible
      volumes:
        - name: tmp
          emptyDir:
            sizeLimit: 16Mi
        {{- if eq .mode "dra" }}
        - name: plugins-registry
          hostPath:
            path: {{ include "hv.hostRegistryDir" $root }}
            type: Directory
        - name: dra-plugin
          hostPath:
            path: {{ include "hv.hostDraDir" $root }}
            type: DirectoryOrCreate
        {{- else }}
        - name: device-plugins
          hostPath:
            path: {{ include "hv.hostPluginDir" $root }}
            type: Directory
        {{- end }}
        {{- if .cdi }}
        - name: cdi
          hostPath:
            path: {{ include "hv.hostCdiDir" $root }}
            type: DirectoryOrCreate
        {{- end }}
        - name: host-dev
          hostPath:
            path: /dev
            type: Directory
{{- end -}}
