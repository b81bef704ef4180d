{{/*
Labels of every object: those of deploy/base, and the two Helm adds to what it manages
(tests/helm.rs compares the chart with the kustomize overlays without these two only).
*/}}
{{- define "tollgate.labels" -}}
app.kubernetes.io/name: tollgate
{{ include "tollgate.helmLabels" . }}
{{- end }}

{{/* The two labels alone, for the objects deploy/base leaves unlabelled. */}}
{{- define "tollgate.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The pods' labels, which the Service, the PDB and the Deployment select. */}}
{{- define "tollgate.selector" -}}
app.kubernetes.io/name: tollgate
app.kubernetes.io/component: webhook
{{- end }}

{{/* The namespaces the webhooks never act in: the excluded ones and the release's. */}}
{{- define "tollgate.excluded" -}}
{{- $out := list }}
{{- range .Values.webhooks.excludedNamespaces }}{{ $out = append $out . }}{{ end }}
{{- if not (has .Release.Namespace $out) }}{{ $out = append $out .Release.Namespace }}{{ end }}
{{- toJson $out }}
{{- end }}

{{- define "tollgate.selfManaged" -}}
{{- if eq .Values.certificates.mode "self-managed" }}true{{ end }}
{{- end }}

{{/* Whether the pod needs its name in the environment: the Leases' holder identity. */}}
{{- define "tollgate.podName" -}}
{{- if or (eq .Values.certificates.mode "self-managed") .Values.audit.enabled }}true{{ end }}
{{- end }}

{{/* A webhook's namespaceSelector. */}}
{{- define "tollgate.namespaceSelector" -}}
namespaceSelector:
  matchLabels:
    {{ .Values.webhooks.enforceLabel.key }}: {{ .Values.webhooks.enforceLabel.value | quote }}
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: {{ include "tollgate.excluded" . }}
{{- end }}

{{/* The rules of both webhooks: pods, and exactly the workloads of the shipped policy's
workloads.kinds (tests/deploy.rs holds deploy/base's to them; tests/helm.rs these to
deploy/base's). */}}
{{- define "tollgate.rules" -}}
rules:
  - apiGroups: [""]
    apiVersions: ["v1"]
    operations: ["CREATE"]
    resources: ["pods"]
    scope: Namespaced
  - apiGroups: ["batch"]
    apiVersions: ["v1"]
    operations: ["CREATE", "UPDATE"]
    resources: ["jobs", "cronjobs"]
    scope: Namespaced
  - apiGroups: ["apps"]
    apiVersions: ["v1"]
    operations: ["CREATE", "UPDATE"]
    resources: ["deployments", "statefulsets", "replicasets", "daemonsets"]
    scope: Namespaced
  - apiGroups: ["kubeflow.org"]
    apiVersions: ["v1"]
    operations: ["CREATE", "UPDATE"]
    resources: ["pytorchjobs", "tfjobs", "mpijobs", "xgboostjobs", "jaxjobs", "paddlejobs"]
    scope: Namespaced
  - apiGroups: ["kubeflow.org"]
    apiVersions: ["v2beta1"]
    operations: ["CREATE", "UPDATE"]
    resources: ["mpijobs"]
    scope: Namespaced
  - apiGroups: ["jobset.x-k8s.io"]
    apiVersions: ["v1alpha2"]
    operations: ["CREATE", "UPDATE"]
    resources: ["jobsets"]
    scope: Namespaced
  - apiGroups: ["trainer.kubeflow.org"]
    apiVersions: ["v1alpha1"]
    operations: ["CREATE", "UPDATE"]
    resources: ["trainjobs", "optimizationjobs"]
    scope: Namespaced
  - apiGroups: ["ray.io"]
    apiVersions: ["v1"]
    operations: ["CREATE", "UPDATE"]
    resources: ["rayjobs", "rayclusters", "rayservices"]
    scope: Namespaced
  - apiGroups: ["batch.volcano.sh"]
    apiVersions: ["v1alpha1"]
    operations: ["CREATE", "UPDATE"]
    resources: ["jobs"]
    scope: Namespaced
  - apiGroups: ["leaderworkerset.x-k8s.io"]
    apiVersions: ["v1"]
    operations: ["CREATE", "UPDATE"]
    resources: ["leaderworkersets"]
    scope: Namespaced
{{- end }}

{{/* The validating webhook's rules for Kubeflow Trainer's runtimes (never refused: judged
     by the pods a TrainJob on them would make, a warning for what no TrainJob supplies). */}}
{{- define "tollgate.runtimeRules" -}}
- apiGroups: ["trainer.kubeflow.org"]
  apiVersions: ["v1alpha1"]
  operations: ["CREATE", "UPDATE"]
  resources: ["trainingruntimes"]
  scope: Namespaced
- apiGroups: ["trainer.kubeflow.org"]
  apiVersions: ["v1alpha1"]
  operations: ["CREATE", "UPDATE"]
  resources: ["clustertrainingruntimes"]
  scope: Cluster
{{- end }}

{{/* cert-manager's cainjector annotation, in cert-manager mode. */}}
{{- define "tollgate.injectCa" -}}
{{- if eq .Values.certificates.mode "cert-manager" }}
annotations:
  cert-manager.io/inject-ca-from: {{ printf "%s/tollgate-serving" .Release.Namespace }}
{{- end }}
{{- end }}
