package admission

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/config"
)

// Webhook names in the ValidatingWebhookConfiguration.
const (
	RoutesWebhook    = "routes.validation.causeway.dev"
	IngressesWebhook = "ingresses.validation.causeway.dev"
	PoliciesWebhook  = "policies.validation.causeway.dev"
	WorkloadsWebhook = "workloads.validation.causeway.dev"
)

// Webhooks are the names of the webhooks this package serves.
var Webhooks = []string{RoutesWebhook, IngressesWebhook, PoliciesWebhook, WorkloadsWebhook}

// Configuration is the ValidatingWebhookConfiguration that sends the
// apiserver's reviews to the webhook at cc (a Service in the cluster, or a
// URL), with cc.CABundle the mesh roots.
//
//   - Routes (HTTPRoute, GRPCRoute): failurePolicy Fail. A route the mesh
//     would reject must not slip in while the control plane is away; route
//     edits can wait for it.
//   - Ingresses: failurePolicy Ignore. The rule cannot tell an Ingress of
//     our IngressClass from another controller's, so Fail would stop every
//     Ingress in the cluster while the control plane is away; the webhook
//     judges only ours, and the translation refuses the same things (with a
//     Warning event on the Ingress), so Ignore loses only the early message.
//   - Policies (ConnectionPolicy, BackendTLSPolicy): failurePolicy Fail, for
//     the same reasons.
//   - Workloads (Namespace, Service, Pod): failurePolicy Ignore, and never
//     for kube-system or the control plane's own namespace, so that an
//     outage of the control plane cannot stop pods (its own included) from
//     starting. The translation refuses the same things, so Ignore loses
//     only the early message.
//
// All have sideEffects None and a 5 s timeout, and match equivalent
// versions (v1beta1 routes, or BackendTLSPolicies of an older version, are
// converted to v1 for review).
func Configuration(name, controlPlaneNamespace string, cc admissionregistrationv1.WebhookClientConfig) *admissionregistrationv1.ValidatingWebhookConfiguration {
	none := admissionregistrationv1.SideEffectClassNone
	fail, ignore := admissionregistrationv1.Fail, admissionregistrationv1.Ignore
	equivalent := admissionregistrationv1.Equivalent
	timeout := int32(5)
	ops := []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}
	rule := func(group, version string, resources ...string) admissionregistrationv1.RuleWithOperations {
		scope := admissionregistrationv1.AllScopes
		return admissionregistrationv1.RuleWithOperations{Operations: ops, Rule: admissionregistrationv1.Rule{
			APIGroups: []string{group}, APIVersions: []string{version}, Resources: resources, Scope: &scope}}
	}
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    RoutesWebhook,
			ClientConfig:            cc,
			Rules:                   []admissionregistrationv1.RuleWithOperations{rule(gwv1.GroupName, "v1", "httproutes", "grpcroutes")},
			FailurePolicy:           &fail,
			MatchPolicy:             &equivalent,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}, {
			Name:                    IngressesWebhook,
			ClientConfig:            cc,
			Rules:                   []admissionregistrationv1.RuleWithOperations{rule(networkingv1.GroupName, "v1", "ingresses")},
			FailurePolicy:           &ignore,
			MatchPolicy:             &equivalent,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}, {
			Name:         PoliciesWebhook,
			ClientConfig: cc,
			Rules: []admissionregistrationv1.RuleWithOperations{
				rule(config.CausewayGroupVersion.Group, config.CausewayGroupVersion.Version, config.ConnectionPolicyResource.Resource),
				rule(gwv1.GroupName, "v1", "backendtlspolicies"),
			},
			FailurePolicy:           &fail,
			MatchPolicy:             &equivalent,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}, {
			Name:          WorkloadsWebhook,
			ClientConfig:  cc,
			Rules:         []admissionregistrationv1.RuleWithOperations{rule("", "v1", "namespaces", "services", "pods")},
			FailurePolicy: &ignore,
			MatchPolicy:   &equivalent,
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn,
				Values: []string{"kube-system", controlPlaneNamespace},
			}}},
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
}
