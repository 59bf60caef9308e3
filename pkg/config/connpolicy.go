package config

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// CausewayGroupVersion is the API group of Causeway's own kinds.
var CausewayGroupVersion = schema.GroupVersion{Group: "causeway.dev", Version: "v1alpha1"}

// ConnectionPolicyResource is the ConnectionPolicy kind's API resource
// (manifests/core/connectionpolicy-crd.yaml).
var ConnectionPolicyResource = CausewayGroupVersion.WithResource("connectionpolicies")

// ConnectionPolicy binds a Rego policy set to connections, as Istio's
// AuthorizationPolicy binds rules: spec.selector picks workloads of its
// namespace (their destination node proxy checks every inbound connection;
// no selector: every workload of the namespace), spec.targetRefs picks
// waypoints (Gateways; the waypoint checks every tunnel as it opens).
// spec.policy names the policy set, as the control plane's
// --connection-policy flag loads it.
//
//	apiVersion: causeway.dev/v1alpha1
//	kind: ConnectionPolicy
//	metadata: {namespace: shop, name: db-clients}
//	spec:
//	  selector: {matchLabels: {app: db}}
//	  policy: db-clients
type ConnectionPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              ConnectionPolicySpec   `json:"spec"`
	Status            ConnectionPolicyStatus `json:"status,omitempty"`
	// Unreadable, set by the Kubernetes source, says why an object of
	// this kind could not be read into this type (its CRD is not the
	// mesh's): the translation refuses it, and what it selects is unknown,
	// so it denies every workload of its namespace.
	Unreadable string `json:"-"`
}

// ConnectionPolicyStatus is what the control plane reports (pkg/gwstatus):
// condition Accepted, false while the translation refuses the policy.
type ConnectionPolicyStatus struct {
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ConnectionPolicySpec is what a ConnectionPolicy selects and the policy set it applies.
type ConnectionPolicySpec struct {
	Selector   *WorkloadSelector `json:"selector,omitempty"`
	TargetRefs []PolicyTargetRef `json:"targetRefs,omitempty"`
	Policy     string            `json:"policy"`
}

// WorkloadSelector is Istio's: workloads whose labels include matchLabels.
type WorkloadSelector struct {
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
}

// PolicyTargetRef names a waypoint Gateway in the policy's namespace
// (Gateway API's LocalPolicyTargetReference).
type PolicyTargetRef struct {
	Group string `json:"group"`
	Kind  string `json:"kind"`
	Name  string `json:"name"`
}

// DeepCopyObject implements runtime.Object.
func (p *ConnectionPolicy) DeepCopyObject() runtime.Object {
	out := *p
	p.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if s := p.Spec.Selector; s != nil {
		out.Spec.Selector = &WorkloadSelector{MatchLabels: maps.Clone(s.MatchLabels)}
	}
	out.Spec.TargetRefs = slices.Clone(p.Spec.TargetRefs)
	out.Status.Conditions = nil
	for _, c := range p.Status.Conditions {
		out.Status.Conditions = append(out.Status.Conditions, *c.DeepCopy())
	}
	return &out
}

func addCausewayKinds(s *runtime.Scheme) error {
	s.AddKnownTypes(CausewayGroupVersion, &ConnectionPolicy{})
	return nil
}

// translateConnectionPolicies checks each ConnectionPolicy and emits it
// without its policy files, marked not yet enforceable: the control plane
// attaches the named set's active files (AttachPolicy) or keeps it
// denying.
func (t *translator) translateConnectionPolicies() {
	for _, ci := range t.connPolicies {
		p := ci.policy
		key := "ConnectionPolicy " + p.Namespace + "/" + p.Name
		problems := CheckConnectionPolicy(p)
		for _, msg := range problems {
			t.problem(ci.origin, key, "%s", msg)
		}
		var gateways []string
		for _, ref := range p.Spec.TargetRefs {
			gateways = append(gateways, ref.Name)
		}
		var selector map[string]string
		if s := p.Spec.Selector; s != nil {
			selector = maps.Clone(s.MatchLabels)
		}
		reason := fmt.Sprintf("policy set %q has no active revision at the control plane", p.Spec.Policy)
		if len(problems) > 0 {
			// Skipping a refused policy would leave what it selects
			// unchecked (fail open): it is sent denying instead.
			reason = RefusedPrefix + strings.Join(t.reasons[key], "; ")
		}
		slices.Sort(gateways)
		out := &meshv1.ConnectionPolicy{Name: p.Name, Namespace: p.Namespace, Selector: selector,
			TargetGateways: slices.Compact(gateways), Policy: p.Spec.Policy, InvalidReason: reason}
		t.out.ConnectionPolicies[p.Namespace+"/"+p.Name] = out
	}
}

// CheckConnectionPolicy returns why the translation refuses p, none when
// it does not. The admission webhook refuses the same at apply time.
func CheckConnectionPolicy(p *ConnectionPolicy) []string {
	if p.Unreadable != "" {
		return []string{"unreadable: " + p.Unreadable}
	}
	var out []string
	if p.Spec.Policy == "" {
		out = append(out, "spec.policy is required")
	}
	for i, ref := range p.Spec.TargetRefs {
		if ref.Group != gatewayGroup || ref.Kind != "Gateway" {
			out = append(out, fmt.Sprintf("spec.targetRefs[%d]: only group %s kind Gateway can be targeted", i, gatewayGroup))
		}
		if ref.Name == "" {
			out = append(out, fmt.Sprintf("spec.targetRefs[%d]: name is required", i))
		}
	}
	if s := p.Spec.Selector; s != nil {
		if len(p.Spec.TargetRefs) > 0 {
			out = append(out, "spec.selector and spec.targetRefs are exclusive")
		}
		for _, k := range slices.Sorted(maps.Keys(s.MatchLabels)) {
			v := s.MatchLabels[k]
			if errs := validation.IsQualifiedName(k); len(errs) > 0 {
				out = append(out, fmt.Sprintf("spec.selector label %q: %s", k, errs[0]))
			}
			if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
				out = append(out, fmt.Sprintf("spec.selector label %s value %q: %s", k, v, errs[0]))
			}
		}
	}
	return out
}

// PolicyContent is what AttachPolicy needs of a policy set: its active
// revision and files.
type PolicyContent struct {
	Revision string
	Sources  []*meshv1.PolicySource
}

// RefusedPrefix begins the invalid_reason of a ConnectionPolicy the
// translator refused: it denies what it selects whatever its set holds.
const RefusedPrefix = "refused: "

// AttachPolicy returns p with its set's content, or p as it is (denying,
// with its reason) when the set has none or p was refused.
func AttachPolicy(p *meshv1.ConnectionPolicy, content *PolicyContent) *meshv1.ConnectionPolicy {
	if content == nil || len(content.Sources) == 0 || strings.HasPrefix(p.GetInvalidReason(), RefusedPrefix) {
		return p
	}
	return &meshv1.ConnectionPolicy{Name: p.GetName(), Namespace: p.GetNamespace(), Selector: p.GetSelector(),
		TargetGateways: p.GetTargetGateways(), Policy: p.GetPolicy(), Revision: content.Revision, Sources: content.Sources}
}
