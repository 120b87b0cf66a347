{{/* the labels every object carries; the service's pods also app.kubernetes.io/component and monsoon.io/service */}}
{{- define "rp.labels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/component: {{ .service }}
monsoon.io/service: {{ .service }}
{{- if .root.Values.monsoon.runId }}
monsoon.io/run-id: {{ .root.Values.monsoon.runId | quote }}
{{- end }}
{{- end -}}

{{- define "rp.selector" -}}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .service }}
{{- end -}}

{{/* where a service is reached from another pod: itself on the node's loopback, else its Service's name */}}
{{- define "rp.host" -}}
{{- if .root.Values.hostNetwork -}}127.0.0.1{{- else -}}{{ .root.Release.Name }}-{{ .service }}.{{ .root.Release.Namespace }}.svc{{- end -}}
{{- end -}}

{{/* the images' run scripts replaced by scriptsDir's, when given */}}
{{- define "rp.scripts" -}}
{{- if .root.Values.scriptsDir }}
  - name: scripts
    hostPath: {path: {{ .root.Values.scriptsDir | quote }}, type: Directory}
{{- end }}
{{- end -}}

{{- define "rp.scriptsMount" -}}
{{- if .root.Values.scriptsDir }}
- {name: scripts, mountPath: /opt/monsoon/stacks/bin, readOnly: true}
{{- end }}
{{- end -}}

{{/* a probe's host: the node's loopback on the host network, else none (kubelet probes the pod's IP) */}}
{{- define "rp.probeHost" -}}
{{- if .root.Values.hostNetwork }}host: 127.0.0.1, {{ end -}}
{{- end -}}

{{- define "rp.workdir" -}}
{{- if .root.Values.workDir -}}{{ .root.Values.workDir }}/{{ .service }}{{- else -}}/work/{{ .service }}{{- end -}}
{{- end -}}

{{/* the pod spec's shared part: network, the work dir volume */}}
{{- define "rp.podbase" -}}
hostNetwork: {{ .root.Values.hostNetwork }}
dnsPolicy: {{ if .root.Values.hostNetwork }}ClusterFirstWithHostNet{{ else }}ClusterFirst{{ end }}
enableServiceLinks: false
restartPolicy: Always
volumes:
  - name: workdir
{{- if .root.Values.workDir }}
    hostPath: {path: {{ include "rp.workdir" . | quote }}, type: DirectoryOrCreate}
{{- else }}
    emptyDir: {}
{{- end }}
{{- include "rp.scripts" . }}
{{- end -}}

{{/* environment every container gets: its pod's UID (monsoon finds the container's host PID by it) and the run */}}
{{- define "rp.env" -}}
- {name: MONSOON_POD_UID, valueFrom: {fieldRef: {fieldPath: metadata.uid}}}
- {name: MONSOON_POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
- {name: MONSOON_SERVICE, value: {{ .service | quote }}}
{{- if .root.Values.monsoon.runId }}
- {name: MONSOON_RUN_ID, value: {{ .root.Values.monsoon.runId | quote }}}
- {name: MONSOON_OWNER_PID, value: {{ .root.Values.monsoon.ownerPid | toString | quote }}}
{{- end }}
{{- end -}}
