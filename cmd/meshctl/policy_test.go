package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/causeway-mesh/causeway/pkg/localmesh"
	"github.com/causeway-mesh/causeway/pkg/policy"
)

const examplePolicyDir = "../../pkg/policy/testdata/example"

func runPolicyArgs(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := policyCommand(context.Background(), args, &out)
	return out.String(), err
}

func TestPolicyTestPasses(t *testing.T) {
	out, err := runPolicyArgs(t, "test", examplePolicyDir)
	if err != nil {
		t.Fatalf("policy test: %v\n%s", err, out)
	}
	for _, want := range []string{
		"PASS  envoy.authz_test.test_frontend_may_call_checkout",
		"PASS  envoy.authz_test.test_unauthenticated_caller_with_identity_headers_denied",
		"PASS: 5/5",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestPolicyTestFails(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("authz.rego", "package envoy.authz\n\ndefault allow := false\n\nallow if input.method == \"GET\"\n")
	write("authz_test.rego", `package envoy.authz_test

import data.envoy.authz

test_get if authz.allow with input as {"method": "GET"}

test_post if {
	print("checking POST")
	authz.allow with input as {"method": "POST"}
}
`)
	out, err := runPolicyArgs(t, "test", dir)
	if err == nil || !strings.Contains(err.Error(), "1 of 2 tests failed") {
		t.Fatalf("err = %v, want 1 of 2 failed\n%s", err, out)
	}
	for _, want := range []string{"PASS  envoy.authz_test.test_get", "FAIL  envoy.authz_test.test_post", "| checking POST", "FAIL: 1"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	// Syntax errors are reported, not counted as tests.
	write("authz.rego", "package envoy.authz\n\nallow if {\n")
	if _, err := runPolicyArgs(t, "test", dir); err == nil || !strings.Contains(err.Error(), "authz.rego") {
		t.Fatalf("syntax error: err = %v", err)
	}
}

func TestPolicyEval(t *testing.T) {
	input := filepath.Join(t.TempDir(), "input.json")
	doc := `{
  "attributes": {"request": {"http": {"method": "POST", "path": "/orders"}}},
  "source_principal": "spiffe://cluster.local/ns/shop/sa/frontend",
  "destination_principal": "spiffe://cluster.local/ns/shop/sa/checkout",
  "parsed_path": ["orders"]
}`
	if err := os.WriteFile(input, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	// Flags before and after DIR.
	for _, args := range [][]string{
		{"eval", "--input", input, examplePolicyDir},
		{"eval", examplePolicyDir, "--input", input, "--path", "envoy/authz/allow"},
	} {
		out, err := runPolicyArgs(t, args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		var d struct {
			Allowed bool                `json:"allowed"`
			Status  int                 `json:"status"`
			Headers map[string][]string `json:"headers"`
			ID      string              `json:"decision_id"`
		}
		if err := json.Unmarshal([]byte(out), &d); err != nil {
			t.Fatalf("output is not JSON: %v\n%s", err, out)
		}
		if !d.Allowed || d.Status != 200 || d.Headers["X-Authz-Policy"][0] != "example" || d.ID == "" {
			t.Fatalf("decision = %s", out)
		}
	}

	// Without a principal the same request is denied, with the policy's body.
	if err := os.WriteFile(input, []byte(`{"attributes": {"request": {"http": {"method": "POST"}}}, "parsed_path": ["orders"]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runPolicyArgs(t, "eval", "--input", input, examplePolicyDir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `"allowed": false`) || !strings.Contains(out, `"status": 403`) || !strings.Contains(out, `denied by mesh policy`) {
		t.Fatalf("decision = %s", out)
	}
}

func TestPolicyUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"eval", examplePolicyDir},
		{"eval", "--input", "/nonexistent/input.json", examplePolicyDir},
		{"test"},
		{"test", "a", "b"},
		{"check", "--path", "data", examplePolicyDir},
	} {
		if _, err := runPolicyArgs(t, args...); err == nil {
			t.Errorf("%q: want an error", args)
		}
	}
}

func TestPolicyCheck(t *testing.T) {
	out, err := runPolicyArgs(t, "check", examplePolicyDir)
	if err != nil || !strings.Contains(out, "5 tests passed") {
		t.Fatalf("check: %v\n%s", err, out)
	}
	if _, err := runPolicyArgs(t, "check", "--path", "istio/authz/allow", examplePolicyDir); err == nil {
		t.Fatal("check with an undefined decision path passed")
	}
}

// A Git repository is a policy source as a directory is: URL@REF, with the
// policy's sub-directory; the ref picks the commit that is tested.
func TestPolicyFromGit(t *testing.T) {
	work := t.TempDir()
	repo, err := localmesh.CreatePolicyRepo(filepath.Join(work, "repo"), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, name := range []string{"policy.rego", "policy_test.rego"} {
		b, err := os.ReadFile(filepath.Join(examplePolicyDir, name))
		if err != nil {
			t.Fatal(err)
		}
		files["policies/"+name] = b
	}
	good, err := repo.Commit("example policy", files)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Commit("break it", map[string][]byte{"policies/policy.rego": []byte("package envoy.authz\n\nallow := false\n")}); err != nil {
		t.Fatal(err)
	}
	for _, source := range []string{repo.URL() + "@" + good, "file://" + repo.URL() + "@" + good} {
		out, err := runPolicyArgs(t, "test", "--git-dir", "policies", source)
		if err != nil || !strings.Contains(out, "PASS: 5/5") {
			t.Fatalf("test %s: %v\n%s", source, err, out)
		}
		out, err = runPolicyArgs(t, "check", source, "--git-dir", "policies")
		if err != nil || !strings.Contains(out, "policy revision "+good) {
			t.Fatalf("check %s: %v\n%s", source, err, out)
		}
	}
	// The branch's tip is broken.
	if out, err := runPolicyArgs(t, "test", "--git-dir", "policies", repo.URL()+"@"+localmesh.PolicyBranch); err == nil {
		t.Fatalf("test of the broken tip passed:\n%s", out)
	}
	if _, err := runPolicyArgs(t, "test", repo.URL()+"@nosuchbranch"); err == nil || !strings.Contains(err.Error(), `ref "nosuchbranch" not found`) {
		t.Fatalf("missing ref: %v", err)
	}
}

func TestPolicySourceArgument(t *testing.T) {
	dir := t.TempDir()
	for arg, wantGit := range map[string]bool{
		dir:                                  false,
		"https://example.com/p.git@main":     true,
		"git@github.com:acme/policies@v1.2":  true,
		"ssh://git@example.com/p.git@abc123": true,
		dir + "@main":                        true,
		"no/such/dir@main":                   false,
		"git@github.com:acme/policies":       false, // no ref: not a Git source
	} {
		o, err := (&policySource{arg: arg}).options(policy.Options{})
		// An ssh URL is taken for Git and refused without a key and
		// known hosts.
		if err != nil && !strings.Contains(err.Error(), "known hosts") {
			t.Errorf("%q: %v", arg, err)
		}
		if got := o.Remote != nil || err != nil; got != wantGit {
			t.Errorf("%q: Git source %v, want %v (%+v)", arg, got, wantGit, o)
		}
	}
}
