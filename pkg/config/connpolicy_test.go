package config

import (
	"strings"
	"testing"

	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

const connPolicyBase = `apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
`

func TestConnectionPolicyTranslation(t *testing.T) {
	objs, err := Decode("test.yaml", []byte(connPolicyBase+`apiVersion: causeway.dev/v1alpha1
kind: ConnectionPolicy
metadata: {name: db, namespace: shop}
spec:
  selector: {matchLabels: {app: db}}
  policy: db-clients
---
apiVersion: causeway.dev/v1alpha1
kind: ConnectionPolicy
metadata: {name: tunnels, namespace: shop}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]
  policy: tunnels
`))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Translate(objs, Options{})
	if err != nil {
		t.Fatal(err)
	}
	db := s.ConnectionPolicies["shop/db"]
	if db.GetPolicy() != "db-clients" || db.GetSelector()["app"] != "db" || len(db.GetTargetGateways()) != 0 {
		t.Fatalf("shop/db = %v", db)
	}
	// Without the control plane's content it denies, saying why.
	if !strings.Contains(db.GetInvalidReason(), "no active revision") {
		t.Fatalf("shop/db invalid reason %q", db.GetInvalidReason())
	}
	if tp := s.ConnectionPolicies["shop/tunnels"]; len(tp.GetTargetGateways()) != 1 || tp.GetTargetGateways()[0] != "waypoint" {
		t.Fatalf("shop/tunnels = %v", tp)
	}
	attached := AttachPolicy(db, &PolicyContent{Revision: "r1", Sources: nil})
	if attached != db {
		t.Fatal("a set without files was attached")
	}
}

// A refused ConnectionPolicy is refused alone, and sent denying what it
// selects: skipping it would leave its workloads unchecked.
func TestConnectionPolicyProblems(t *testing.T) {
	for _, tc := range []struct{ name, spec, want string }{
		{"no policy", `selector: {matchLabels: {app: db}}`, "spec.policy is required"},
		{"both", "selector: {matchLabels: {app: db}}\n  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: w}]\n  policy: p", "exclusive"},
		{"wrong kind", "targetRefs: [{group: '', kind: Service, name: w}]\n  policy: p", "only group gateway.networking.k8s.io kind Gateway"},
		{"bad label", "selector: {matchLabels: {'a b': x}}\n  policy: p", "spec.selector label"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := Decode("test.yaml", []byte(connPolicyBase+"apiVersion: causeway.dev/v1alpha1\nkind: ConnectionPolicy\nmetadata: {name: p, namespace: shop}\nspec:\n  "+tc.spec+"\n"))
			if err != nil {
				t.Fatal(err)
			}
			s, err := Translate(objs, Options{})
			if err != nil {
				t.Fatalf("a bad ConnectionPolicy failed the whole translation: %v", err)
			}
			if len(s.Rejected) == 0 || s.Rejected[0].Kind() != "ConnectionPolicy" || !strings.Contains(s.Rejected[0].Reason, tc.want) {
				t.Fatalf("rejected %v, want ConnectionPolicy shop/p: %q", s.Rejected, tc.want)
			}
			p := s.ConnectionPolicies["shop/p"]
			if !strings.HasPrefix(p.GetInvalidReason(), RefusedPrefix) || !strings.Contains(p.GetInvalidReason(), tc.want) {
				t.Fatalf("refused policy sent as %v, want it denying with why", p)
			}
			if err := meshv1.Validate(p); err != nil {
				t.Fatalf("the refused policy does not validate, proxies would drop it: %v", err)
			}
			// Its set's content does not make it enforceable.
			content := &PolicyContent{Revision: "r1", Sources: []*meshv1.PolicySource{{Name: "p"}}}
			if got := AttachPolicy(p, content); got.GetInvalidReason() != p.GetInvalidReason() || len(got.GetSources()) != 0 {
				t.Fatalf("attached to a refused policy: %v", got)
			}
		})
	}
}

func TestConnectionPolicyUnknownField(t *testing.T) {
	_, err := Decode("test.yaml", []byte(connPolicyBase+"apiVersion: causeway.dev/v1alpha1\nkind: ConnectionPolicy\nmetadata: {name: p, namespace: shop}\nspec:\n  policy: p\n  action: ALLOW\n"))
	if err == nil || !strings.Contains(err.Error(), "unknown field") {
		t.Fatalf("error %v, want unknown field", err)
	}
}
