// Package connpolicytest builds ConnectionPolicy resources for tests the
// way the control plane does: Rego compiled and tested by a policy engine,
// its active content attached.
package connpolicytest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/causeway-mesh/causeway/pkg/connpolicy"
	"github.com/causeway-mesh/causeway/pkg/policy"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// Policy returns the ConnectionPolicy namespace/name carrying rego as its
// policy set (of the same name), selecting what p already selects
// (Selector, TargetGateways).
func Policy(t testing.TB, namespace, name, rego string, p *meshv1.ConnectionPolicy) *meshv1.ConnectionPolicy {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "authz.rego"), []byte(rego), 0o600); err != nil {
		t.Fatal(err)
	}
	e, err := policy.NewEngine(policy.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := e.Content()
	out := &meshv1.ConnectionPolicy{Namespace: namespace, Name: name, Policy: name, Revision: c.Revision, Sources: connpolicy.Sources(c)}
	if p != nil {
		out.Selector, out.TargetGateways = p.GetSelector(), p.GetTargetGateways()
	}
	return out
}
