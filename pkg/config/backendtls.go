package config

import (
	"fmt"
	"net/url"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/validation"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/backendtls"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// CACertificateKey is the ConfigMap key a BackendTLSPolicy's
// caCertificateRefs are read from (Gateway API: Core support).
const CACertificateKey = "ca.crt"

type tlsPolicyInfo struct {
	origin string
	obj    string // "BackendTLSPolicy ns/name"
	policy *gwv1.BackendTLSPolicy
	out    *meshv1.BackendTLS
	// ancestors: one per targetRef, in spec order.
	ancestors []PolicyAncestor
	refs      refResult
}

// refResult is what resolving a policy's caCertificateRefs found.
type refResult struct {
	issues  []string
	badKind bool // a reference of a kind other than ConfigMap
	allBad  bool // no reference resolved
}

// PolicyAncestor is what a BackendTLSPolicy's status says for one of its
// targetRefs (its ancestor, the Service): Accepted and ResolvedRefs.
type PolicyAncestor struct {
	Index               int // in spec.targetRefs
	Accepted            bool
	AcceptedReason      gwv1.PolicyConditionReason
	AcceptedMessage     string
	ResolvedRefs        bool
	ResolvedRefsReason  gwv1.PolicyConditionReason
	ResolvedRefsMessage string
}

// translateBackendTLSPolicies applies every BackendTLSPolicy to the ports
// of the Services it targets (GEP-1897). Policies that target the same
// Service and sectionName are ordered oldest first, then by name; the
// first applies and the others are Conflicted. A policy naming a port
// (sectionName) takes precedence over one naming the whole Service on that
// port. A policy the mesh cannot carry out (an invalid field, a CA
// certificate reference that does not resolve) is refused, and its ports
// are served with invalid_reason: the waypoint refuses their traffic
// rather than send it unverified or in plaintext.
func (t *translator) translateBackendTLSPolicies() {
	sort.SliceStable(t.tlsPolicies, func(i, j int) bool {
		a, b := t.tlsPolicies[i].policy, t.tlsPolicies[j].policy
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	type target struct {
		svc     nsName
		section string
	}
	winners := map[target]*tlsPolicyInfo{}
	var order []target
	for _, pi := range t.tlsPolicies {
		pi.out = t.compileBackendTLS(pi)
		for i, ref := range pi.policy.Spec.TargetRefs {
			a := PolicyAncestor{Index: i, Accepted: true, AcceptedReason: gwv1.PolicyReasonAccepted, AcceptedMessage: "applied by the mesh's waypoints",
				ResolvedRefs: true, ResolvedRefsReason: gwv1.BackendTLSPolicyReasonResolvedRefs, ResolvedRefsMessage: "all references resolve"}
			id := nsName{pi.policy.Namespace, string(ref.Name)}
			s := t.services[id]
			switch msg := tlsTargetProblem(i, ref); {
			case msg != "":
				a.Accepted, a.AcceptedReason, a.AcceptedMessage = false, gwv1.PolicyReasonInvalid, msg
			case s == nil || s.out == nil:
				a.Accepted, a.AcceptedReason, a.AcceptedMessage = false, gwv1.PolicyReasonTargetNotFound,
					fmt.Sprintf("spec.targetRefs[%d]: Service %s does not exist (or is an ExternalName Service, which is not part of the mesh)", i, id)
			case ref.SectionName != nil && svcPortNamed(s.svc, string(*ref.SectionName)) == nil:
				a.Accepted, a.AcceptedReason, a.AcceptedMessage = false, gwv1.PolicyReasonTargetNotFound,
					fmt.Sprintf("spec.targetRefs[%d]: Service %s has no port named %s", i, id, *ref.SectionName)
			default:
				k := target{id, ptrValue((*string)(ref.SectionName))}
				if w := winners[k]; w != nil {
					a.Accepted, a.AcceptedReason, a.AcceptedMessage = false, gwv1.PolicyReasonConflicted,
						fmt.Sprintf("BackendTLSPolicy %s/%s targets the same Service and port and takes precedence (older, or first by name)", w.policy.Namespace, w.policy.Name)
				} else {
					winners[k] = pi
					order = append(order, k)
				}
			}
			pi.ancestors = append(pi.ancestors, a)
		}
		why := strings.Join(t.reasons[pi.obj], "; ")
		for i := range pi.ancestors {
			a := &pi.ancestors[i]
			if len(pi.refs.issues) > 0 {
				a.ResolvedRefs, a.ResolvedRefsReason, a.ResolvedRefsMessage = false, gwv1.BackendTLSPolicyReasonInvalidCACertificateRef, strings.Join(pi.refs.issues, "; ")
				if pi.refs.badKind {
					a.ResolvedRefsReason = gwv1.BackendTLSPolicyReasonInvalidKind
				}
			}
			if a.Accepted && t.refused(pi.obj) {
				a.Accepted, a.AcceptedReason, a.AcceptedMessage = false, gwv1.PolicyReasonInvalid, "refused (the waypoint refuses the traffic it would apply to): "+why
				if pi.refs.allBad {
					a.AcceptedReason = gwv1.BackendTLSPolicyReasonNoValidCACertificate
				}
			}
		}
	}
	// Whole-Service policies first, so that a port's own policy replaces them.
	sort.SliceStable(order, func(i, j int) bool { return order[i].section == "" && order[j].section != "" })
	for _, k := range order {
		s := t.services[k.svc]
		for _, sp := range s.out.Ports {
			if k.section == "" || sp.Name == k.section {
				sp.BackendTls = winners[k].out
			}
		}
	}
	if t.reports != nil {
		for _, pi := range t.tlsPolicies {
			t.reports.BackendTLSPolicies[pi.policy.Namespace+"/"+pi.policy.Name] = pi.ancestors
		}
	}
}

// compileBackendTLS checks a policy's validation and reads its CA
// certificates. A problem refuses the policy (ResolvedRefs and Accepted
// on its ancestors say why) and the result carries invalid_reason.
func (t *translator) compileBackendTLS(pi *tlsPolicyInfo) *meshv1.BackendTLS {
	p := pi.policy
	v := p.Spec.Validation
	out := &meshv1.BackendTLS{Policy: &meshv1.Ref{Namespace: p.Namespace, Name: p.Name}, Hostname: string(v.Hostname)}
	for _, msg := range checkBackendTLSValidation(p, out) {
		t.problem(pi.origin, pi.obj, "%s", msg)
	}
	var bundle []byte
	var refIssues []string
	badKind := false
	for i, ref := range v.CACertificateRefs {
		if msg := caRefKindProblem(i, ref); msg != "" {
			badKind = true
			refIssues = append(refIssues, msg)
			continue
		}
		id := nsName{p.Namespace, string(ref.Name)}
		cm := t.configMaps[id]
		if cm == nil {
			refIssues = append(refIssues, fmt.Sprintf("spec.validation.caCertificateRefs[%d]: ConfigMap %s does not exist", i, id))
			continue
		}
		data, ok := cm.Data[CACertificateKey]
		if !ok {
			refIssues = append(refIssues, fmt.Sprintf("spec.validation.caCertificateRefs[%d]: ConfigMap %s has no key %s", i, id, CACertificateKey))
			continue
		}
		if _, err := backendtls.ParseCACertificates([]byte(data)); err != nil {
			refIssues = append(refIssues, fmt.Sprintf("spec.validation.caCertificateRefs[%d]: ConfigMap %s: %v", i, id, err))
			continue
		}
		bundle = append(append(bundle, strings.TrimSpace(data)...), '\n')
	}
	for _, msg := range refIssues {
		t.problem(pi.origin, pi.obj, "%s", msg)
	}
	out.CaCertificates = bundle
	if t.refused(pi.obj) {
		out = &meshv1.BackendTLS{Policy: out.Policy, InvalidReason: "BackendTLSPolicy " + p.Namespace + "/" + p.Name + " refused: " + strings.Join(t.reasons[pi.obj], "; ")}
	}
	pi.refs = refResult{issues: refIssues, badKind: badKind, allBad: len(v.CACertificateRefs) > 0 && len(refIssues) == len(v.CACertificateRefs)}
	return out
}

// CheckBackendTLSPolicy says what refuses p whatever else the cluster
// holds: its validation and options, and references of a kind the mesh
// cannot follow. The translation refuses these (besides references that do
// not resolve, and targets that do not exist, which depend on other
// objects), and the admission webhook refuses them at apply time.
func CheckBackendTLSPolicy(p *gwv1.BackendTLSPolicy) []string {
	out := checkBackendTLSValidation(p, &meshv1.BackendTLS{})
	for i, ref := range p.Spec.TargetRefs {
		if msg := tlsTargetProblem(i, ref); msg != "" {
			out = append(out, msg)
		}
	}
	for i, ref := range p.Spec.Validation.CACertificateRefs {
		if msg := caRefKindProblem(i, ref); msg != "" {
			out = append(out, msg)
		}
	}
	return out
}

// checkBackendTLSValidation checks p's validation and options, setting
// out's subject alt names and system roots; it returns what refuses p.
func checkBackendTLSValidation(p *gwv1.BackendTLSPolicy, out *meshv1.BackendTLS) []string {
	var problems []string
	refuse := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	v := p.Spec.Validation
	if h := string(v.Hostname); h == "" {
		refuse("spec.validation.hostname is required")
	} else if errs := validation.IsDNS1123Subdomain(h); len(errs) > 0 {
		refuse("spec.validation.hostname %q: %s", h, errs[0])
	}
	if len(v.SubjectAltNames) > 5 {
		refuse("spec.validation.subjectAltNames: at most 5")
	}
	for i, san := range v.SubjectAltNames {
		switch {
		case san.Type == gwv1.HostnameSubjectAltNameType && san.Hostname != "" && san.URI == "":
			h := strings.TrimPrefix(string(san.Hostname), "*.")
			if errs := validation.IsDNS1123Subdomain(h); len(errs) > 0 {
				refuse("spec.validation.subjectAltNames[%d].hostname %q: %s", i, san.Hostname, errs[0])
			}
			out.SubjectAltNames = append(out.SubjectAltNames, &meshv1.SubjectAltName{Type: meshv1.SubjectAltName_HOSTNAME, Value: string(san.Hostname)})
		case san.Type == gwv1.URISubjectAltNameType && san.URI != "" && san.Hostname == "":
			if u, err := url.Parse(string(san.URI)); err != nil || u.Scheme == "" || (u.Opaque == "" && u.Host == "" && u.Path == "") {
				refuse("spec.validation.subjectAltNames[%d].uri %q: not an absolute URI", i, san.URI)
			}
			out.SubjectAltNames = append(out.SubjectAltNames, &meshv1.SubjectAltName{Type: meshv1.SubjectAltName_URI, Value: string(san.URI)})
		default:
			refuse("spec.validation.subjectAltNames[%d]: type Hostname needs hostname (and no uri), type URI needs uri (and no hostname)", i)
		}
	}
	if len(p.Spec.Options) > 0 {
		keys := make([]string, 0, len(p.Spec.Options))
		for k := range p.Spec.Options {
			keys = append(keys, string(k))
		}
		sort.Strings(keys)
		refuse("spec.options %s: this mesh implements no options (refused rather than ignored)", strings.Join(keys, ", "))
	}
	wk := ptrValue(v.WellKnownCACertificates)
	switch {
	case len(v.CACertificateRefs) > 0 && wk != "":
		refuse("spec.validation: caCertificateRefs and wellKnownCACertificates are exclusive")
	case len(v.CACertificateRefs) == 0 && wk == "":
		refuse("spec.validation: caCertificateRefs or wellKnownCACertificates is required")
	case wk == gwv1.WellKnownCACertificatesSystem:
		out.SystemRoots = true
	case wk != "":
		refuse("spec.validation.wellKnownCACertificates %q: only System is supported", wk)
	}
	if len(v.CACertificateRefs) > 8 {
		refuse("spec.validation.caCertificateRefs: at most 8")
	}
	return problems
}

func tlsTargetProblem(i int, ref gwv1.LocalPolicyTargetReferenceWithSectionName) string {
	if ref.Group != "" || ref.Kind != "Service" {
		return fmt.Sprintf("spec.targetRefs[%d]: only Services (group \"\", kind Service) can be targeted", i)
	}
	return ""
}

func caRefKindProblem(i int, ref gwv1.LocalObjectReference) string {
	if ref.Group != "" || ref.Kind != "ConfigMap" {
		return fmt.Sprintf("spec.validation.caCertificateRefs[%d]: kind %s (group %q) is not supported: name a ConfigMap", i, ref.Kind, ref.Group)
	}
	return ""
}

func svcPortNamed(svc *corev1.Service, name string) *corev1.ServicePort {
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Name == name {
			return &svc.Spec.Ports[i]
		}
	}
	return nil
}

// Trim is an informer transform: it drops what the translation never
// reads and what makes up much of an object's size in memory, managed
// fields, of a ConfigMap everything but the CA certificates a
// BackendTLSPolicy may name (every ConfigMap of the cluster is watched,
// and most hold other things), and of a Node everything but its metadata.
func Trim(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	if n, ok := obj.(*corev1.Node); ok {
		// Only the labels are read (nodeLocalities); a node's status and
		// images are most of its size.
		n.Annotations, n.Spec, n.Status = nil, corev1.NodeSpec{}, corev1.NodeStatus{}
	}
	if cm, ok := obj.(*corev1.ConfigMap); ok {
		ca, has := cm.Data[CACertificateKey]
		cm.Data, cm.BinaryData, cm.Annotations = nil, nil, nil
		if has {
			cm.Data = map[string]string{CACertificateKey: ca}
		}
	}
	return obj, nil
}
