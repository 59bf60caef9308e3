package policy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// bodyPolicy reads parsed_body, which the input holds only when bodies are parsed.
const bodyPolicy = `package envoy.authz

default allow := false

allow if input.parsed_body.role == "admin"
`

func jsonPost(t *testing.T, body string) *Request {
	raw := fmt.Sprintf("POST /people HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: %d\n\n%s", len(body), body)
	return &Request{HTTP: request(t, raw), Body: []byte(body)}
}

func TestSettingsFileChoosesDecisionAndBody(t *testing.T) {
	ctx := context.Background()
	objectPolicy, err := os.ReadFile("testdata/object-decision/authz.rego")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"authz.rego": string(objectPolicy)})
	e, _ := newTestEngine(t, Options{Dir: dir})
	// The default decision does not exist in this policy.
	var re *RejectError
	if err := e.Load(ctx); !errors.As(err, &re) || re.Stage != "decision" {
		t.Fatalf("object policy without settings: %v, want a rejection at decision", err)
	}

	settings, err := os.ReadFile("testdata/object-decision/" + SettingsFile)
	if err != nil {
		t.Fatal(err)
	}
	writeFiles(t, dir, map[string]string{SettingsFile: string(settings)})
	if err := e.Load(ctx); err != nil {
		t.Fatalf("with %s: %v", SettingsFile, err)
	}
	if d := e.Decide(ctx, &Request{HTTP: request(t, "GET /public/x HTTP/1.1\nHost: x\n\n")}); !d.Allowed || d.Headers.Get("x-ext-auth-allow") != "yes" {
		t.Errorf("GET /public/x: %+v", d)
	}
	if d := e.Decide(ctx, &Request{HTTP: request(t, "GET /private HTTP/1.1\nHost: x\n\n")}); d.Allowed || d.Status != 451 {
		t.Errorf("GET /private: %+v, want the policy's 451", d)
	}
	st := e.Status()
	if st.Settings.From != SettingsFile || st.Settings.DecisionPath != "data.envoy.http.public.decision" || st.DecisionPath != st.Settings.DecisionPath {
		t.Errorf("status settings = %+v (decision path %s)", st.Settings, st.DecisionPath)
	}

	// A new policy with new settings: both change with one revision.
	rev := e.Revision()
	os.Remove(filepath.Join(dir, "authz.rego"))
	writeFiles(t, dir, map[string]string{"body.rego": bodyPolicy, SettingsFile: "parseBody: true\nmaxBodyBytes: 64\n"})
	if err := e.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if e.Revision() == rev {
		t.Fatal("revision unchanged")
	}
	if d := e.Decide(ctx, jsonPost(t, `{"role":"admin"}`)); !d.Allowed {
		t.Errorf("admin body denied: %s", d.Reason)
	}
	if d := e.Decide(ctx, jsonPost(t, `{"role":"guest"}`)); d.Allowed {
		t.Error("guest body allowed")
	}
	// Past the limit the body is truncated and not parsed.
	if d := e.Decide(ctx, jsonPost(t, `{"role":"admin","pad":"`+strings.Repeat("x", 64)+`"}`)); d.Allowed {
		t.Error("body over maxBodyBytes was parsed")
	}
	if st := e.Status().Settings; !st.ParseBody || st.MaxBodyBytes != 64 || st.DecisionPath != "data.envoy.authz.allow" {
		t.Errorf("status settings = %+v", st)
	}

	// Only the settings change: a new revision too.
	rev = e.Revision()
	writeFiles(t, dir, map[string]string{SettingsFile: "parseBody: false\n"})
	if err := e.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if e.Revision() == rev {
		t.Fatal("a change of settings alone kept the revision")
	}
	if d := e.Decide(ctx, jsonPost(t, `{"role":"admin"}`)); d.Allowed {
		t.Error("body parsed after parseBody: false")
	}
}

func TestSettingsDefaultToTheOptions(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"body.rego": bodyPolicy})
	e, _ := loadEngine(t, Options{Dir: dir, Input: InputOptions{ParseBody: true}})
	if d := e.Decide(context.Background(), jsonPost(t, `{"role":"admin"}`)); !d.Allowed {
		t.Errorf("admin body denied with parsing on by option: %s", d.Reason)
	}
	if st := e.Status().Settings; st.From != "defaults" || !st.ParseBody || st.MaxBodyBytes != DefaultMaxBodyBytes {
		t.Errorf("status settings = %+v", st)
	}
	// The file overrides only what it names.
	writeFiles(t, dir, map[string]string{SettingsFile: "decisionLog: none\n"})
	if err := e.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := e.Status().Settings; st.From != SettingsFile || !st.ParseBody || st.DecisionLog != LogNoDecisions {
		t.Errorf("status settings = %+v", st)
	}

	// The options' body limit holds when the file turns parsing on.
	e, _ = newTestEngine(t, Options{Dir: dir, Input: InputOptions{MaxBodyBytes: 100}})
	writeFiles(t, dir, map[string]string{SettingsFile: "parseBody: true\n"})
	if err := e.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := e.Status().Settings; !st.ParseBody || st.MaxBodyBytes != 100 {
		t.Errorf("status settings = %+v, want the options' limit of 100", st)
	}
}

func TestInvalidSettingsRejectTheRevision(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"body.rego": bodyPolicy, SettingsFile: "parseBody: true\n"})
	e, logs := loadEngine(t, Options{Dir: dir})
	rev := e.Revision()
	for name, tc := range map[string]struct{ file, reason string }{
		"unknown field":      {"parsebody: true\n", `unknown field "parsebody"`},
		"not YAML":           {"parseBody: [\n", SettingsFile},
		"wrong type":         {"parseBody: sometimes\n", SettingsFile},
		"decision log mode":  {"decisionLog: loud\n", `decision log mode "loud"`},
		"decision path":      {"decisionPath: envoy//allow\n", "empty segment"},
		"empty path":         {"decisionPath: \"\"\n", "decisionPath is empty"},
		"body limit":         {"parseBody: true\nmaxBodyBytes: 1000000\n", "want 1 to 65536 bytes"},
		"zero body limit":    {"parseBody: true\nmaxBodyBytes: 0\n", "want 1 to 65536 bytes"},
		"limit without body": {"parseBody: false\nmaxBodyBytes: 100\n", "maxBodyBytes needs parseBody: true"},
		"missing decision":   {"decisionPath: envoy/authz/nothing\n", "no rule or data defines data.envoy.authz.nothing"},
	} {
		t.Run(name, func(t *testing.T) {
			writeFiles(t, dir, map[string]string{SettingsFile: tc.file})
			err := e.Load(ctx)
			var re *RejectError
			if !errors.As(err, &re) || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("Load = %v, want a rejection naming %q", err, tc.reason)
			}
			if e.Revision() != rev {
				t.Fatalf("active revision changed to %s", e.Revision())
			}
			if d := e.Decide(ctx, jsonPost(t, `{"role":"admin"}`)); !d.Allowed || d.Revision != rev {
				t.Fatalf("last good policy and settings not serving: %+v", d)
			}
			st := e.Status()
			if st.LastRejection == nil || st.LastRejection.Revision == rev || !strings.Contains(st.LastRejection.Reason, tc.reason) || !st.Settings.ParseBody {
				t.Fatalf("status = %+v, rejection %+v", st.Settings, st.LastRejection)
			}
		})
	}
	if len(logs.FilterMessage("policy rejected, keeping the active policy").All()) == 0 {
		t.Error("rejections not logged")
	}
}

func TestSettingsChooseTheDecisionLogMode(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"authz.rego": goodPolicy, SettingsFile: "decisionLog: all\n"})
	core, logs := observer.New(zapcore.InfoLevel)
	dl, err := NewDecisionLogger(zap.New(core), DecisionLogOptions{Mode: LogDenials})
	if err != nil {
		t.Fatal(err)
	}
	e, _ := loadEngine(t, Options{Dir: dir, DecisionLog: dl})
	if d := e.Decide(context.Background(), &Request{HTTP: request(t, "GET / HTTP/1.1\nHost: x\n\n")}); !d.Allowed {
		t.Fatal("GET denied")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dl.Run(ctx)
	entries := logs.FilterMessage("decision").All()
	if len(entries) != 1 || entries[0].ContextMap()["allowed"] != true {
		t.Fatalf("decision log = %v, want the allowed decision (decisionLog: all over the logger's denied)", entries)
	}
}

// The settings file is read at the root only; one in a subdirectory is
// neither settings nor data.
func TestSettingsFileOnlyAtTheRoot(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"authz.rego": goodPolicy, "sub/" + SettingsFile: "decisionLog: loud\n"})
	e, _ := loadEngine(t, Options{Dir: dir})
	if st := e.Status().Settings; st.From != "defaults" {
		t.Errorf("settings from %s", st.From)
	}
}
