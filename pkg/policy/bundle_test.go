package policy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"

	"github.com/causeway-mesh/causeway/pkg/policy/policybundle"
)

// bundleServer serves one bundle at /bundles/authz.tar.gz with ETags, as an
// OPA bundle service does; set replaces it.
type bundleServer struct {
	mu   sync.Mutex
	body []byte
	etag string
	hits int
	revs int // bundles published, numbering their revisions
}

func (s *bundleServer) set(t testing.TB, modules map[string]string, data map[string]any) {
	t.Helper()
	if data == nil {
		data = map[string]any{}
	}
	s.mu.Lock()
	s.revs++
	rev := fmt.Sprintf("r%d", s.revs)
	s.mu.Unlock()
	b := bundle.Bundle{Data: data, Manifest: bundle.Manifest{Revision: rev}}
	for name, content := range modules {
		b.Modules = append(b.Modules, bundle.ModuleFile{URL: "/" + name, Path: "/" + name, Raw: []byte(content)})
	}
	var buf bytes.Buffer
	if err := bundle.NewWriter(&buf).DisableFormat(true).Write(b); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	s.mu.Lock()
	defer s.mu.Unlock()
	s.body, s.etag = buf.Bytes(), `"`+hex.EncodeToString(sum[:8])+`"`
}

func (s *bundleServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hits++
	if r.URL.Path != "/bundles/authz.tar.gz" {
		http.NotFound(w, r)
		return
	}
	if r.Header.Get("If-None-Match") == s.etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Header().Set("ETag", s.etag)
	w.Header().Set("Content-Type", "application/gzip")
	_, _ = w.Write(s.body)
}

func newFeed(t testing.TB, o policybundle.Options) *policybundle.Feed {
	t.Helper()
	f, err := policybundle.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestBundleSource(t *testing.T) {
	srv := &bundleServer{}
	srv.set(t, map[string]string{
		"authz.rego":      "package envoy.authz\n\nallow if input.attributes.request.http.method in data.config.methods\n",
		"authz_test.rego": "package envoy.authz_test\n\ntest_get if data.envoy.authz.allow with input as {\"attributes\": {\"request\": {\"http\": {\"method\": \"GET\"}}}}\n",
	}, map[string]any{"config": map[string]any{"methods": []any{"GET"}}})
	hs := httptest.NewServer(srv) // listens on 127.0.0.1
	defer hs.Close()

	service, _ := json.Marshal(map[string]any{"url": hs.URL})
	e, logs := newTestEngine(t, Options{
		DecisionPath: "envoy/authz/allow",
		Feed:         newFeed(t, policybundle.Options{Name: "authz", Service: service, Resource: "bundles/authz.tar.gz", MinDelay: time.Second, MaxDelay: time.Second}),
	})
	startEngine(t, e)
	waitFor(t, "bundle activation", func() bool { return e.Ready() == nil })
	get := &Request{HTTP: request(t, "GET / HTTP/1.1\nHost: x\n\n")}
	post := &Request{HTTP: request(t, "POST / HTTP/1.1\nHost: x\n\n")}
	if d := e.Decide(context.Background(), get); !d.Allowed {
		t.Fatalf("GET: %+v", d)
	}
	if d := e.Decide(context.Background(), post); d.Allowed {
		t.Fatal("POST allowed by the first bundle")
	}
	// The bundle's manifest revision is the policy's.
	if src := e.Status().Sources; src["bundle:authz"].Revision != "r1" || e.Revision() != "r1" {
		t.Fatalf("revision %q, sources = %v", e.Revision(), src)
	}
	rev := e.Revision()

	// A new bundle (data change) is picked up at the next poll.
	srv.set(t, map[string]string{
		"authz.rego": "package envoy.authz\n\nallow if input.attributes.request.http.method in data.config.methods\n",
	}, map[string]any{"config": map[string]any{"methods": []any{"GET", "POST"}}})
	waitFor(t, "second bundle", func() bool { return e.Revision() != rev })
	if d := e.Decide(context.Background(), post); !d.Allowed {
		t.Fatalf("POST after update: %+v", d)
	}
	rev = e.Revision()

	// A bundle whose tests fail is rejected; the active one stays.
	srv.set(t, map[string]string{
		"authz.rego":      "package envoy.authz\n\nallow := false\n",
		"authz_test.rego": "package envoy.authz_test\n\ntest_get if data.envoy.authz.allow\n",
	}, nil)
	waitFor(t, "rejection of a bundle with failing tests", func() bool {
		return logs.FilterMessage("policy rejected, keeping the active policy").Len() > 0
	})
	if e.Revision() != rev {
		t.Fatal("bundle with failing tests activated")
	}

	// A bundle that does not even parse is a download failure: still kept.
	srv.set(t, map[string]string{"authz.rego": "package envoy.authz\n\nallow if {\n"}, nil)
	waitFor(t, "download failure of a broken bundle", func() bool {
		return logs.FilterMessage("policy bundle download failed, keeping the active policy").Len() > 0
	})
	if d := e.Decide(context.Background(), post); !d.Allowed || d.Revision != rev {
		t.Fatalf("after broken bundle: %+v (want revision %s)", d, rev)
	}
}

// TestBundleAndDirectory: both sources form one policy set.
func TestBundleAndDirectory(t *testing.T) {
	srv := &bundleServer{}
	srv.set(t, map[string]string{"lib.rego": "package lib\n\nmethods := {\"GET\"}\n"}, nil)
	hs := httptest.NewServer(srv)
	defer hs.Close()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"authz.rego": "package envoy.authz\n\nallow if input.attributes.request.http.method in data.lib.methods\n"})
	service, _ := json.Marshal(map[string]any{"url": hs.URL})
	e, logs := newTestEngine(t, Options{
		Dir:  dir,
		Feed: newFeed(t, policybundle.Options{Service: service, Resource: "bundles/authz.tar.gz", MinDelay: time.Second, MaxDelay: time.Second}),
	})
	startEngine(t, e)
	defer func() {
		if t.Failed() {
			for _, l := range logs.All() {
				t.Log(l.Message, l.ContextMap())
			}
		}
	}()
	waitFor(t, "both sources active", func() bool { return len(e.Status().Sources) == 2 })
	if d := e.Decide(context.Background(), &Request{HTTP: request(t, "GET / HTTP/1.1\nHost: x\n\n")}); !d.Allowed {
		t.Fatalf("GET: %+v", d)
	}
}

// TestSourceWaitingForAnother: a source rejected alone (its rules need the
// other source's) is activated once the other arrives, in either order;
// and a broken source does not block a good change of another.
func TestSourceWaitingForAnother(t *testing.T) {
	lib := &Snapshot{Name: "bundle:lib", Modules: []File{{Path: "lib.rego", Content: []byte("package lib\n\nmethods := {\"GET\"}\n")}}, Revision: "lib1"}
	authz := &Snapshot{Name: "dir", Modules: []File{{Path: "authz.rego", Content: []byte("package envoy.authz\n\nallow if input.m in data.lib.methods\n")}}, Revision: "authz1"}
	for name, order := range map[string][]*Snapshot{"lib first": {lib, authz}, "authz first": {authz, lib}} {
		t.Run(name, func(t *testing.T) {
			e, _ := newTestEngine(t, Options{Dir: "unused"})
			_ = e.offer(context.Background(), order[0], false)
			if err := e.offer(context.Background(), order[1], false); err != nil {
				t.Fatal(err)
			}
			if st := e.Status(); len(st.Sources) != 2 {
				t.Fatalf("sources = %v, want both", st.Sources)
			}
			if d := e.DecideInput(context.Background(), ast.MustParseTerm(`{"m": "GET"}`).Value); !d.Allowed {
				t.Fatalf("combined set: %+v", d)
			}
		})
	}

	e, _ := newTestEngine(t, Options{Dir: "unused"})
	if err := e.offer(context.Background(), lib, false); err == nil {
		t.Fatal("lib alone activated without a decision")
	}
	if err := e.offer(context.Background(), authz, false); err != nil {
		t.Fatal(err)
	}
	broken := &Snapshot{Name: "bundle:lib", Modules: []File{{Path: "lib.rego", Content: []byte("package lib\n\nmethods := \n")}}, Revision: "lib2"}
	if err := e.offer(context.Background(), broken, false); err == nil {
		t.Fatal("broken lib activated")
	}
	authz2 := &Snapshot{Name: "dir", Modules: []File{{Path: "authz.rego", Content: []byte("package envoy.authz\n\nallow if input.m in data.lib.methods\n\nx := 2\n")}}, Revision: "authz2"}
	if err := e.offer(context.Background(), authz2, false); err != nil {
		t.Fatalf("good dir change blocked by a broken bundle: %v", err)
	}
	if st := e.Status(); st.Sources["bundle:lib"].Revision != "lib1" || st.Sources["dir"].Revision != "authz2" {
		t.Fatalf("sources = %v", st.Sources)
	}
}
