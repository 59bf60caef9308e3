package main

import (
	"bufio"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/localmesh"
)

// upMesh is a configuration of its own names and addresses (127.0.60.x pod
// IPs, 127.0.160.x app addresses, 127.0.61.x VIPs): one node, the waypoint
// of namespace pay, a client, api-0 running the echo app, and own, which
// asks for no app.
const upMesh = `
apiVersion: v1
kind: Namespace
metadata: {name: pay, labels: {causeway.dev/dataplane-mode: mesh, causeway.dev/use-waypoint: gate}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gate, namespace: pay}
spec:
  gatewayClassName: causeway-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
---
apiVersion: v1
kind: Pod
metadata: {name: gate-0, namespace: pay, labels: {gateway.networking.k8s.io/gateway-name: gate}}
spec: {nodeName: n1, serviceAccountName: gate, containers: [{name: waypoint, image: causeway/waypoint}]}
status: {podIP: 127.0.60.2}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: pay}
spec: {nodeName: n1, serviceAccountName: client, containers: [{name: c, image: curl}]}
status: {podIP: 127.0.60.1}
---
apiVersion: v1
kind: Pod
metadata:
  name: api-0
  namespace: pay
  labels: {app: api}
  annotations: {causeway.dev/app-address: 127.0.160.3, causeway.dev/local-app: echo}
spec: {nodeName: n1, serviceAccountName: api, containers: [{name: api, image: i, ports: [{containerPort: 8080}]}]}
status: {podIP: 127.0.60.3}
---
apiVersion: v1
kind: Pod
metadata:
  name: own
  namespace: pay
  labels: {app: own}
  annotations: {causeway.dev/app-address: 127.0.160.4}
spec: {nodeName: n1, serviceAccountName: own, containers: [{name: own, image: i, ports: [{containerPort: 8080}]}]}
status: {podIP: 127.0.60.4}
---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: pay}
spec: {clusterIP: 127.0.61.3, selector: {app: api}, ports: [{port: 80, targetPort: 8080, appProtocol: http}]}
---
apiVersion: v1
kind: Service
metadata: {name: own, namespace: pay}
spec: {clusterIP: 127.0.61.4, selector: {app: own}, ports: [{port: 80, targetPort: 8080, appProtocol: http}]}
`

const upBasePort = 17800

// TestUpTakesSettingsAndAppsFromTheConfiguration runs the real meshctl up
// on a configuration and policy directory of its own: only the app asked
// for runs, the Try line names the configuration's pods, and two OPA-Envoy
// policies work with their settings in the policy directory, without
// waypoint flags: an object decision at a path of its own, then OPA's
// primer policy reading parsed_body. Invalid settings keep the last good
// revision, as /config_dump shows.
func TestUpTakesSettingsAndAppsFromTheConfiguration(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a mesh")
	}
	work := t.TempDir()
	bin := filepath.Join(work, "bin")
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/controlplane", "./cmd/nodeproxy", "./cmd/waypoint", "./cmd/echo", "./cmd/meshctl")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	cfg := filepath.Join(work, "config")
	writeTestFiles(t, cfg, map[string]string{"mesh.yaml": upMesh})
	// The policy directory is a link swapped from one revision to the next,
	// as git-sync publishes checkouts.
	link := filepath.Join(work, "policies")
	publish := func(rev string, files map[string]string) {
		t.Helper()
		dir := filepath.Join(work, rev)
		writeTestFiles(t, dir, files)
		tmp := link + ".tmp"
		if err := os.Symlink(dir, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, link); err != nil {
			t.Fatal(err)
		}
	}
	policies := filepath.Join(repoRoot, "pkg", "policy", "testdata")
	publish("rev1", readTestFiles(t, filepath.Join(policies, "object-decision"), "authz.rego", "causeway-policy.yaml"))

	state := filepath.Join(work, "state")
	up := exec.Command(filepath.Join(bin, "meshctl"), "up", "--state", state, "--base-port", fmt.Sprint(upBasePort), "--policies", link, "--policies-git=false", cfg)
	out := startUp(t, up)
	var plan localmesh.Plan
	data, err := os.ReadFile(filepath.Join(state, "mesh.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &plan); err != nil {
		t.Fatal(err)
	}

	if want := "Try: meshctl exec --state " + state + " pay/client -- curl -s http://api.pay/"; !strings.Contains(out, want+"\n") {
		t.Errorf("meshctl up printed:\n%s\nwant the line %q", out, want)
	}
	if !strings.Contains(out, "app pay/api-0 (echo)") || strings.Contains(out, "app pay/own") {
		t.Errorf("meshctl up printed:\n%s\nwant an app for pay/api-0 only", out)
	}
	if c, err := net.DialTimeout("tcp", "127.0.160.4:8080", time.Second); err == nil {
		c.Close()
		t.Error("something listens on pay/own's app address, which asks for no app")
	}

	client, err := plan.Client("pay/client")
	if err != nil {
		t.Fatal(err)
	}
	send := func(method, path, auth, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, "http://api.pay"+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := client.HTTP(false).Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, string(b)
	}
	dump := func() policyDump {
		t.Helper()
		resp, err := http.Get("http://" + plan.Waypoints[0].Admin + "/config_dump")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var d struct{ Policies policyDump }
		if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&d); err != nil {
			t.Fatal(err)
		}
		return d.Policies
	}
	waitDump := func(what string, ok func(policyDump) bool) policyDump {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second) // generous: the machine is shared
		for {
			d := dump()
			if ok(d) {
				return d
			}
			if time.Now().After(deadline) {
				t.Fatalf("waiting for %s: policies %+v", what, d)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	// 1. The object decision at its own path.
	code, body := send("GET", "/public/x", "", "")
	var echo echoReply
	if err := json.Unmarshal([]byte(body), &echo); code != 200 || err != nil || echo.Pod != "api-0" || fmt.Sprint(echo.Headers["X-Ext-Auth-Allow"]) != "[yes]" {
		t.Errorf("GET /public/x: %d %s, want 200 from api-0 with the decision's header", code, body)
	}
	if code, body := send("GET", "/private", "", ""); code != 451 || body != "not here\n" {
		t.Errorf("GET /private: %d %q, want the decision's 451", code, body)
	}
	first := dump()
	if first.Settings.From != "causeway-policy.yaml" || first.Settings.DecisionPath != "data.envoy.http.public.decision" || first.Settings.ParseBody {
		t.Errorf("/config_dump settings = %+v", first.Settings)
	}

	// 2. OPA's primer policy reads parsed_body: its settings turn parsing on.
	primer := readTestFiles(t, filepath.Join(policies, "primer"), "policy.rego")["policy.rego"]
	publish("rev2", map[string]string{"policy.rego": primer, "causeway-policy.yaml": "parseBody: true\n"})
	second := waitDump("the primer policy", func(d policyDump) bool { return d.Revision != first.Revision && d.Settings.ParseBody })
	if second.Settings.DecisionPath != "data.envoy.authz.allow" || second.Settings.From != "causeway-policy.yaml" {
		t.Errorf("/config_dump settings = %+v", second.Settings)
	}
	if code, body := send("GET", "/people/1", primerToken(t, "guest"), ""); code != 200 {
		t.Errorf("guest GET /people/1: %d %s", code, body)
	}
	if code, body := send("POST", "/people", primerToken(t, "admin"), `{"firstname":"Bob"}`); code != 200 {
		t.Errorf("admin POST /people for Bob: %d %s, want 200 (parsed_body)", code, body)
	}
	if code, _ := send("POST", "/people", primerToken(t, "admin"), `{"firstname":"Alice"}`); code != 403 {
		t.Errorf("admin POST /people for themselves: %d, want 403", code)
	}

	// 3. Invalid settings reject the revision; the last good one stays.
	publish("rev3", map[string]string{"policy.rego": primer, "causeway-policy.yaml": "parseBody: true\ndecisionLog: loud\n"})
	third := waitDump("the rejection", func(d policyDump) bool { return d.LastRejection != nil && d.LastRejection.Stage == "settings" })
	if third.Revision != second.Revision || !strings.Contains(third.LastRejection.Reason, `decision log mode "loud"`) {
		t.Errorf("after invalid settings: revision %s (was %s), rejection %+v", third.Revision, second.Revision, third.LastRejection)
	}
	if code, body := send("POST", "/people", primerToken(t, "admin"), `{"firstname":"Bob"}`); code != 200 {
		t.Errorf("admin POST /people after the rejection: %d %s, want the last good policy", code, body)
	}
}

// policyDump is the part of a waypoint's /config_dump policies the test reads.
type policyDump struct {
	Revision string
	Settings struct {
		DecisionPath string `json:"decision_path"`
		ParseBody    bool   `json:"parse_body"`
		From         string
	}
	LastRejection *struct{ Stage, Reason string } `json:"last_rejection"`
}

// startUp starts meshctl up and returns its output up to the line saying
// the mesh runs; the mesh is stopped (SIGINT, as Ctrl-C) at the test's end.
func startUp(t *testing.T, up *exec.Cmd) string {
	t.Helper()
	stdout, err := up.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	up.Stderr = &stderr
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = up.Process.Signal(syscall.SIGINT)
		done := make(chan struct{})
		go func() { up.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = up.Process.Kill()
			<-done
		}
	})
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var out strings.Builder
	timeout := time.After(3 * time.Minute)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("meshctl up ended before the mesh ran:\n%s%s", out.String(), stderr.String())
			}
			out.WriteString(line + "\n")
			if line == "Ctrl-C stops the mesh." {
				go io.Copy(io.Discard, stdout) // the rest of the output
				return out.String()
			}
		case <-timeout:
			t.Fatalf("meshctl up did not start the mesh:\n%s%s", out.String(), stderr.String())
		}
	}
}

// primerToken is an HS256 token as OPA's primer signs them (secret
// "secret"), valid for an hour, for the role.
func primerToken(t *testing.T, role string) string {
	t.Helper()
	now := time.Now().Unix()
	claims, err := json.Marshal(map[string]any{"role": role, "sub": base64.RawURLEncoding.EncodeToString([]byte("alice")),
		"nbf": now - 60, "exp": now + 3600})
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding
	signed := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + enc.EncodeToString(claims)
	mac := hmac.New(sha256.New, []byte("secret"))
	mac.Write([]byte(signed))
	return signed + "." + enc.EncodeToString(mac.Sum(nil))
}

// writeTestFiles writes name -> content into dir, creating it.
func writeTestFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	err := os.MkdirAll(dir, 0o755)
	for name, content := range files {
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
}

// readTestFiles reads the named files of dir.
func readTestFiles(t *testing.T, dir string, names ...string) map[string]string {
	t.Helper()
	files := map[string]string{}
	for _, name := range names {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		files[name] = string(data)
	}
	return files
}

func TestUpNoApps(t *testing.T) {
	for noApps, want := range map[bool]int{false: 3, true: 0} {
		m := meshFlags{basePort: 16000, noApps: noApps}
		p, err := m.plan(filepath.Join(repoRoot, "examples", "local"))
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Apps) != want {
			t.Errorf("--no-apps=%v: %d apps, want %d", noApps, len(p.Apps), want)
		}
	}
}
