package config

import (
	"strings"
	"testing"

	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// tlsBase is a Service with two named ports, another Service, and a CA
// ConfigMap holding caPEM.
func tlsBase(caPEM string) string {
	indented := "    " + strings.ReplaceAll(strings.TrimSpace(caPEM), "\n", "\n    ")
	return `
apiVersion: v1
kind: Service
metadata: {name: pay, namespace: ns}
spec: {clusterIP: 127.0.20.5, ports: [{name: https, port: 443, appProtocol: http}, {name: grpc, port: 8443, appProtocol: grpc}]}
---
apiVersion: v1
kind: Service
metadata: {name: other, namespace: ns}
spec: {clusterIP: 127.0.20.6, ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: pay-ca, namespace: ns}
data:
  ca.crt: |
` + indented + `
---
apiVersion: v1
kind: ConfigMap
metadata: {name: no-ca, namespace: ns}
data: {other: x}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: bad-ca, namespace: ns}
data: {ca.crt: "not a certificate"}
`
}

func tlsPolicyDoc(name, created, targets, validation string) string {
	return `
---
apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {name: ` + name + `, namespace: ns, creationTimestamp: "` + created + `"}
spec:
  targetRefs: ` + targets + `
  validation: ` + validation
}

const (
	payTarget  = `[{group: "", kind: Service, name: pay}]`
	payCAValid = `{hostname: pay.example.com, caCertificateRefs: [{group: "", kind: ConfigMap, name: pay-ca}], subjectAltNames: [{type: Hostname, hostname: pay.example.com}, {type: URI, uri: "spiffe://pay.example/ns/pay/sa/api"}]}`
	t0, t1     = "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"
)

func TestBackendTLSPolicyApplies(t *testing.T) {
	ca := trusttest.NewCA(t, "pay.example")
	caPEM := string(ca.Authority.RootsPEM())
	port := func(s *Snapshot, svc string, n uint32) *meshv1.BackendTLS {
		t.Helper()
		for _, p := range s.Services["ns/"+svc].GetPorts() {
			if p.GetPort() == n {
				return p.GetBackendTls()
			}
		}
		t.Fatalf("no port %d on %s", n, svc)
		return nil
	}
	policyOf := func(b *meshv1.BackendTLS) string { return b.GetPolicy().GetNamespace() + "/" + b.GetPolicy().GetName() }

	t.Run("whole Service", func(t *testing.T) {
		s := mustTranslate(t, tlsBase(caPEM)+tlsPolicyDoc("pay-tls", t0, payTarget, payCAValid))
		for _, n := range []uint32{443, 8443} {
			b := port(s, "pay", n)
			if policyOf(b) != "ns/pay-tls" || b.GetHostname() != "pay.example.com" || strings.TrimSpace(string(b.GetCaCertificates())) != strings.TrimSpace(caPEM) ||
				len(b.GetSubjectAltNames()) != 2 || b.GetSubjectAltNames()[1].GetType() != meshv1.SubjectAltName_URI || b.GetInvalidReason() != "" {
				t.Errorf("port %d: %v", n, b)
			}
		}
		if b := port(s, "other", 80); b != nil {
			t.Errorf("untargeted Service got %v", b)
		}
	})
	t.Run("a port's own policy takes precedence over the Service's; neither conflicts", func(t *testing.T) {
		// The port's own policy is the older: precedence is not by age here.
		docs := tlsBase(caPEM) + tlsPolicyDoc("whole", t1, payTarget, payCAValid) +
			tlsPolicyDoc("grpc-only", t0, `[{group: "", kind: Service, name: pay, sectionName: grpc}]`, `{hostname: grpc.example.com, wellKnownCACertificates: System}`)
		s := mustTranslate(t, docs)
		if b := port(s, "pay", 443); policyOf(b) != "ns/whole" {
			t.Errorf("443: %v", b)
		}
		if b := port(s, "pay", 8443); policyOf(b) != "ns/grpc-only" || !b.GetSystemRoots() || len(b.GetCaCertificates()) != 0 {
			t.Errorf("8443: %v", b)
		}
		rep := analyzeYAML(t, docs)
		for _, name := range []string{"ns/whole", "ns/grpc-only"} {
			if a := rep.BackendTLSPolicies[name]; len(a) != 1 || !a[0].Accepted || !a[0].ResolvedRefs {
				t.Errorf("%s: %+v", name, a)
			}
		}
	})
	t.Run("the older of two policies for the same target applies, the other is Conflicted", func(t *testing.T) {
		docs := tlsBase(caPEM) + tlsPolicyDoc("a-newer", t1, payTarget, payCAValid) + tlsPolicyDoc("z-older", t0, payTarget, `{hostname: old.example.com, wellKnownCACertificates: System}`) +
			tlsPolicyDoc("b-same-age", t1, payTarget, payCAValid)
		s := mustTranslate(t, docs)
		if b := port(s, "pay", 443); policyOf(b) != "ns/z-older" {
			t.Errorf("443: %v", b)
		}
		rep := analyzeYAML(t, docs)
		if a := rep.BackendTLSPolicies["ns/z-older"]; !a[0].Accepted {
			t.Errorf("older: %+v", a)
		}
		for _, name := range []string{"ns/a-newer", "ns/b-same-age"} {
			if a := rep.BackendTLSPolicies[name]; a[0].Accepted || a[0].AcceptedReason != gwv1.PolicyReasonConflicted || !strings.Contains(a[0].AcceptedMessage, "ns/z-older") {
				t.Errorf("%s: %+v", name, a)
			}
		}
		// Same age: by name.
		docs = tlsBase(caPEM) + tlsPolicyDoc("b", t0, payTarget, payCAValid) + tlsPolicyDoc("a", t0, payTarget, payCAValid)
		if b := port(mustTranslate(t, docs), "pay", 443); policyOf(b) != "ns/a" {
			t.Errorf("same age: %v applies, want ns/a", policyOf(b))
		}
	})
	t.Run("targets that do not resolve", func(t *testing.T) {
		docs := tlsBase(caPEM) + `
---
apiVersion: v1
kind: Service
metadata: {name: outside, namespace: ns}
spec: {type: ExternalName, externalName: pay.example.com}
` + tlsPolicyDoc("lost", t0, `[{group: "", kind: Service, name: nope}, {group: "", kind: Service, name: pay, sectionName: nope}, {group: apps, kind: Deployment, name: pay}, {group: "", kind: Service, name: outside}]`, payCAValid)
		s := mustTranslate(t, docs) // not refused: the targets may come later
		if b := port(s, "pay", 443); b != nil {
			t.Errorf("443: %v", b)
		}
		a := analyzeYAML(t, docs).BackendTLSPolicies["ns/lost"]
		if len(a) != 4 || a[0].AcceptedReason != gwv1.PolicyReasonTargetNotFound || a[1].AcceptedReason != gwv1.PolicyReasonTargetNotFound ||
			a[2].AcceptedReason != gwv1.PolicyReasonInvalid || a[3].AcceptedReason != gwv1.PolicyReasonTargetNotFound || a[0].Accepted || a[1].Accepted || a[2].Accepted || a[3].Accepted {
			t.Errorf("%+v", a)
		}
	})
}

// A policy the mesh cannot carry out is refused alone: its Service's
// ports carry invalid_reason (the waypoint refuses their traffic rather
// than send it unverified), its status says why, and everything else is
// served.
func TestBackendTLSPolicyRefusedAlone(t *testing.T) {
	ca := trusttest.NewCA(t, "pay.example")
	base := tlsBase(string(ca.Authority.RootsPEM()))
	for _, c := range []struct {
		name, validation, extra string
		accepted, resolved      gwv1.PolicyConditionReason
		reason                  string
	}{
		{"missing ConfigMap", `{hostname: pay.example.com, caCertificateRefs: [{group: "", kind: ConfigMap, name: gone}]}`, "",
			gwv1.BackendTLSPolicyReasonNoValidCACertificate, gwv1.BackendTLSPolicyReasonInvalidCACertificateRef, "ConfigMap ns/gone does not exist"},
		{"ConfigMap without ca.crt", `{hostname: pay.example.com, caCertificateRefs: [{group: "", kind: ConfigMap, name: no-ca}]}`, "",
			gwv1.BackendTLSPolicyReasonNoValidCACertificate, gwv1.BackendTLSPolicyReasonInvalidCACertificateRef, "has no key ca.crt"},
		{"bad CA", `{hostname: pay.example.com, caCertificateRefs: [{group: "", kind: ConfigMap, name: bad-ca}]}`, "",
			gwv1.BackendTLSPolicyReasonNoValidCACertificate, gwv1.BackendTLSPolicyReasonInvalidCACertificateRef, "no PEM certificate"},
		{"one of two references bad", `{hostname: pay.example.com, caCertificateRefs: [{group: "", kind: ConfigMap, name: pay-ca}, {group: "", kind: ConfigMap, name: gone}]}`, "",
			gwv1.PolicyReasonInvalid, gwv1.BackendTLSPolicyReasonInvalidCACertificateRef, "ConfigMap ns/gone does not exist"},
		{"Secret", `{hostname: pay.example.com, caCertificateRefs: [{group: "", kind: Secret, name: pay-ca}]}`, "",
			gwv1.BackendTLSPolicyReasonNoValidCACertificate, gwv1.BackendTLSPolicyReasonInvalidKind, "kind Secret"},
		{"unknown well-known set", `{hostname: pay.example.com, wellKnownCACertificates: example.com/corp}`, "",
			gwv1.PolicyReasonInvalid, gwv1.BackendTLSPolicyReasonResolvedRefs, "only System"},
		{"no CA at all", `{hostname: pay.example.com}`, "",
			gwv1.PolicyReasonInvalid, gwv1.BackendTLSPolicyReasonResolvedRefs, "caCertificateRefs or wellKnownCACertificates is required"},
		{"wildcard hostname", `{hostname: "*.example.com", wellKnownCACertificates: System}`, "",
			gwv1.PolicyReasonInvalid, gwv1.BackendTLSPolicyReasonResolvedRefs, "spec.validation.hostname"},
		{"URI SAN without a scheme", `{hostname: pay.example.com, wellKnownCACertificates: System, subjectAltNames: [{type: URI, uri: "pay"}]}`, "",
			gwv1.PolicyReasonInvalid, gwv1.BackendTLSPolicyReasonResolvedRefs, "not an absolute URI"},
		{"Hostname SAN with a URI", `{hostname: pay.example.com, wellKnownCACertificates: System, subjectAltNames: [{type: Hostname, uri: "spiffe://a/b"}]}`, "",
			gwv1.PolicyReasonInvalid, gwv1.BackendTLSPolicyReasonResolvedRefs, "type Hostname needs hostname"},
		{"options", `{hostname: pay.example.com, wellKnownCACertificates: System}`, "\n  options: {example.com/min-version: \"1.3\"}",
			gwv1.PolicyReasonInvalid, gwv1.BackendTLSPolicyReasonResolvedRefs, "example.com/min-version"},
	} {
		t.Run(c.name, func(t *testing.T) {
			docs := base + tlsPolicyDoc("pay-tls", t0, payTarget, c.validation) + c.extra
			s, refused := translateRefusing(t, docs)
			if len(refused) != 1 || !strings.Contains(refused["BackendTLSPolicy ns/pay-tls"], c.reason) {
				t.Fatalf("refused %v, want BackendTLSPolicy ns/pay-tls alone, for %q", refused, c.reason)
			}
			for _, p := range s.Services["ns/pay"].GetPorts() {
				if b := p.GetBackendTls(); !strings.Contains(b.GetInvalidReason(), c.reason) || b.GetHostname() != "" || len(b.GetCaCertificates()) != 0 {
					t.Errorf("port %d: %v, want it refusing with %q", p.GetPort(), b, c.reason)
				}
			}
			if s.Services["ns/other"] == nil || s.Services["ns/pay"].GetInvalidReason() != "" {
				t.Error("the refusal spread beyond the policy")
			}
			a := analyzeYAML(t, docs).BackendTLSPolicies["ns/pay-tls"]
			if len(a) != 1 || a[0].Accepted || a[0].AcceptedReason != c.accepted || a[0].ResolvedRefsReason != c.resolved ||
				a[0].ResolvedRefs != (c.resolved == gwv1.BackendTLSPolicyReasonResolvedRefs) || !strings.Contains(a[0].AcceptedMessage, c.reason) {
				t.Errorf("status %+v, want Accepted %s, ResolvedRefs %s", a, c.accepted, c.resolved)
			}
		})
	}
}

// examples/backend-tls applies to the sample as it is: no refusal, the
// payments port verified by its policy, its endpoint outside the cluster.
func TestBackendTLSExample(t *testing.T) {
	var objs []Object
	for _, f := range []string{"../../examples/local/mesh.yaml", "../../examples/backend-tls/payments.yaml"} {
		o, err := DecodeFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o...)
	}
	s, err := Translate(objs, Options{})
	if err != nil || len(s.Rejected) > 0 {
		t.Fatalf("%v %v", err, s.Rejected)
	}
	svc := s.Services["shop/payments"]
	b := svc.GetPorts()[0].GetBackendTls()
	if b.GetHostname() != "payments.example" || len(b.GetCaCertificates()) == 0 || b.GetInvalidReason() != "" || svc.GetWaypoint().GetName() != "waypoint" ||
		len(svc.GetEndpoints()) != 1 || svc.GetEndpoints()[0].GetWorkloadUid() != "" {
		t.Errorf("payments: %v", svc)
	}
}
