package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/policy"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

func TestParsePolicySet(t *testing.T) {
	f, err := parsePolicySet("db=git:https://git.example/p.git#main:connection/db")
	if err != nil || f.name != "db" || f.opts.Git.URL != "https://git.example/p.git" || f.opts.Git.Ref != "main" || f.opts.Git.Dir != "connection/db" {
		t.Fatalf("git: %+v %v", f, err)
	}
	if f, err := parsePolicySet("b=bundle:https://opa.example#bundles/b.tar.gz"); err != nil || f.opts.Bundle.Resource != "bundles/b.tar.gz" {
		t.Fatalf("bundle: %+v %v", f, err)
	}
	for _, bad := range []string{"db", "=dir:/x", "db=dir:", "db=svn:x", "db=bundle:https://opa.example"} {
		if _, err := parsePolicySet(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// A ConnectionPolicy leaves the control plane with its set's active files,
// or denying with a reason; a new revision calls back.
func TestPolicySetsAttach(t *testing.T) {
	dir := t.TempDir()
	write := func(rego string) {
		if err := os.WriteFile(filepath.Join(dir, "authz.rego"), []byte(rego), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("package envoy.authz\n\nallow := true\n")
	changed := make(chan struct{}, 4)
	ps, err := newPolicySets([]policySetFlag{{name: "db", opts: optsDir(dir)}}, zap.NewNop(), func() { changed <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ps.loadAll(ctx, 10*time.Second)
	p := &meshv1.ConnectionPolicy{Namespace: "shop", Name: "db", Policy: "db", InvalidReason: "pending"}
	got := ps.attach(p)
	if got.GetInvalidReason() != "" || got.GetRevision() == "" || len(got.GetSources()) != 1 || meshv1.Validate(got) != nil {
		t.Fatalf("attached: %v (%v)", got, meshv1.Validate(got))
	}
	if unknown := ps.attach(&meshv1.ConnectionPolicy{Namespace: "shop", Name: "x", Policy: "nope", InvalidReason: "pending"}); !strings.Contains(unknown.GetInvalidReason(), `no policy set "nope"`) {
		t.Fatalf("unknown set: %q", unknown.GetInvalidReason())
	}
	<-changed // the first activation
	go ps.run(ctx)
	write("package envoy.authz\n\nallow := false\n")
	select {
	case <-changed:
	case <-time.After(20 * time.Second):
		t.Fatal("no callback for the new revision")
	}
	if again := ps.attach(p); again.GetRevision() == got.GetRevision() {
		t.Fatal("the new revision was not attached")
	}
}

func optsDir(dir string) (o policy.Options) {
	o.Dir = dir
	o.Debounce = 50 * time.Millisecond
	return o
}
