{{/*
The operator's permissions, one rule per line of the table in operator/src/rbac.rs (PERMISSIONS),
which lists the API calls the code makes. The e2e chart test renders every mode and fails when
these rules and that table differ in any group, resource, verb or resourceNames.
*/}}

{{/* Rules for namespaced objects the operator watches (Scope::Watched): a ClusterRole in the
default mode, a Role in watchNamespace in namespace-scoped mode. */}}
{{- define "planner-operator.rules.watched" -}}
# The PlannerPolicy reconciler and the webhook (a PlannerPolicy's targetRef) read a DGD, at
# nvidia.com/v1beta1 or v1alpha1 (lookup::target_graph); the topology label controller refers its
# events to one.
- apiGroups: ["nvidia.com"]
  resources: ["dynamographdeployments"]
  verbs: ["get"]
# The kubernetes connector scales a DGD's prefill and decode replicas (connector/kubernetes).
- apiGroups: ["nvidia.com"]
  resources: ["dynamographdeployments"]
  verbs: ["patch"]
# The kubernetes connector reads a pool's DynamoGraphDeploymentScalingAdapter's Scale and scales
# through it (connector/kubernetes).
- apiGroups: ["nvidia.com"]
  resources: ["dynamographdeploymentscalingadapters/scale"]
  verbs: ["get", "patch"]
{{- if .Values.dgdController.enabled }}
# DGD controller (controller/dgd) and startup check list+watch DGDs.
- apiGroups: ["nvidia.com"]
  resources: ["dynamographdeployments"]
  verbs: ["list", "watch"]
# The DGD controller writes DGD status with server-side apply.
- apiGroups: ["nvidia.com"]
  resources: ["dynamographdeployments/status"]
  verbs: ["patch"]
{{- end }}
# The PlannerPolicy controller (controller/planner_policy) and startup check.
- apiGroups: ["planner.dynamo.io"]
  resources: ["plannerpolicies"]
  verbs: ["list", "watch"]
# The PlannerPolicy controller writes each interval's decision to status (server-side apply).
- apiGroups: ["planner.dynamo.io"]
  resources: ["plannerpolicies/status"]
  verbs: ["patch"]
{{- if .Values.dgdController.enabled }}
# The DGD controller watches its Deployments, applies them with server-side apply (a patch, which
# needs create as well when the object is new), and lists and deletes those of removed components.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# The DGD controller does the same for frontend Services.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# The shared cache of DGD pods (TopologyResolved counts); the topology label controller copies
# node topology labels onto worker pods (patch).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "patch"]
{{- end }}
# The PlannerPolicy reconciler reads profile.configMapRef and predictor.warmupTrace.configMapRef.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get"]
{{- if .Values.tenancy.prometheusTokenSecrets }}
# The PlannerPolicy reconciler reads the Prometheus bearer token a policy names
# (spec.metrics.prometheus.bearerTokenSecret) in the policy's namespace.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
# Events on DGDs, PlannerPolicies and pods, and (watching every namespace) on GpuBudgets, in
# namespace default; kube's Recorder patches a repeated Event's series.
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/* Rules for cluster-scoped objects (Scope::Cluster): a ClusterRole in every mode. */}}
{{- define "planner-operator.rules.cluster" -}}
# The GpuBudget controller and the budgets' cache the PlannerPolicy reconciler reads
# spec.budgetRef from (list+watch); the webhook checks a PlannerPolicy's spec.budgetRef (get).
- apiGroups: ["planner.dynamo.io"]
  resources: ["gpubudgets"]
  verbs: ["get", "list", "watch"]
# The GpuBudget controller writes each member's request, grant and holdings (server-side apply).
- apiGroups: ["planner.dynamo.io"]
  resources: ["gpubudgets/status"]
  verbs: ["patch"]
{{- if .Values.dgdController.enabled }}
# The topology label controller reads the labels of a worker pod's node.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get"]
# The DGD controller and the webhook resolve a DGD's ClusterTopologyBinding (today's Grove) or
# ClusterTopology (earlier releases) (get) and the DGD controller re-checks DGDs when one changes
# (list+watch); lookup::cluster_topology.
- apiGroups: [{{ include "planner-operator.clusterTopologyGroup" . | quote }}]
  resources: ["clustertopologybindings"]
  verbs: ["get", "list", "watch"]
- apiGroups: [{{ include "planner-operator.clusterTopologyGroup" . | quote }}]
  resources: ["clustertopologies"]
  verbs: ["get", "list", "watch"]
{{- end }}
{{- if include "planner-operator.patchesCaBundle" . }}
# Webhook certificate maintenance (webhook/certs) watches this release's webhook configuration
# (by metadata.name) and patches its caBundle.
- apiGroups: ["admissionregistration.k8s.io"]
  resources: ["validatingwebhookconfigurations"]
  resourceNames: [{{ include "planner-operator.webhookConfigName" . | quote }}]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end }}
