package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/causeway-mesh/causeway/pkg/policy"
	"github.com/causeway-mesh/causeway/pkg/policy/policybundle"
	"github.com/causeway-mesh/causeway/pkg/policy/policygit"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

func TestParsePolicySet(t *testing.T) {
	f, err := parsePolicySet("db=git:https://git.example/p.git#main:connection/db")
	if err != nil {
		t.Fatal(err)
	}
	if g := f.opts.Remote.(*policygit.Source).Options(); f.name != "db" || g.URL != "https://git.example/p.git" || g.Ref != "main" || g.Dir != "connection/db" {
		t.Fatalf("git: %+v %+v", f, g)
	}
	if f, err := parsePolicySet("b=bundle:https://opa.example#bundles/b.tar.gz"); err != nil || f.opts.Feed.(*policybundle.Feed).Options().Resource != "bundles/b.tar.gz" || f.opts.Feed.Name() != "bundle:b" {
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
	// The same answers for the policies' status.
	if rev, problem := ps.state("db"); rev != got.GetRevision() || problem != "" {
		t.Fatalf("state of the active set: %q %q", rev, problem)
	}
	if rev, problem := ps.state("nope"); rev != "" || !strings.Contains(problem, `no policy set "nope"`) {
		t.Fatalf("state of an unknown set: %q %q", rev, problem)
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

// A set that never compiled has no revision, and its state says why.
func TestPolicySetStateWithoutRevision(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "authz.rego"), []byte("package envoy.authz\n\nallow if {\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ps, err := newPolicySets([]policySetFlag{{name: "bad", opts: optsDir(dir)}}, zap.NewNop(), func() {})
	if err != nil {
		t.Fatal(err)
	}
	ps.loadAll(context.Background(), 10*time.Second)
	if rev, problem := ps.state("bad"); rev != "" || !strings.Contains(problem, `policy set "bad" has no good revision`) || !strings.Contains(problem, "authz.rego") {
		t.Fatalf("state: %q %q, want no revision and the compile error", rev, problem)
	}
}

// The shipped default: the set's ConfigMap does not exist, so its optional
// volume is an empty directory. That is said once at Info, not logged as an
// error, while the state still says the set has no revision; a directory
// with a bad file stays an error.
func TestPolicySetEmptyDirectoryIsQuiet(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	empty, bad := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "authz.rego"), []byte("package envoy.authz\n\nallow if {\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ps, err := newPolicySets([]policySetFlag{{name: "default", opts: optsDir(empty)}, {name: "bad", opts: optsDir(bad)}}, zap.New(core), func() {})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ps.loadAll(ctx, 10*time.Second)
	done := make(chan struct{})
	go func() { ps.run(ctx); close(done) }()
	time.Sleep(500 * time.Millisecond) // the engines' first reads and a rescan
	cancel()
	<-done
	if rev, problem := ps.state("default"); rev != "" || !strings.Contains(problem, "the policy directory is empty") {
		t.Errorf("state of the empty set: %q %q", rev, problem)
	}
	var infos int
	for _, e := range logs.All() {
		set := e.ContextMap()["policy_set"]
		switch {
		case set == "default" && e.Level >= zap.WarnLevel:
			t.Errorf("the empty set logged %s: %s %v", e.Level, e.Message, e.ContextMap())
		case set == "default" && e.Level == zap.InfoLevel && strings.Contains(e.Message, "directory is empty"):
			infos++
		}
	}
	if infos != 1 {
		t.Errorf("the empty set was announced %d times at Info, want once", infos)
	}
	if logs.FilterField(zap.String("policy_set", "bad")).FilterLevelExact(zap.ErrorLevel).Len() == 0 {
		t.Error("the set with a bad file logged no error")
	}
}
