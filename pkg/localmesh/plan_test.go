package localmesh

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/config"
)

// samplePlan is the plan of examples/local from basePort.
func samplePlan(t *testing.T, basePort int) *Plan {
	t.Helper()
	s, err := config.NewDirSource("../../examples/local", config.DirOptions{}).Load()
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPlan(s, basePort)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPlanOfTheSample(t *testing.T) {
	p := samplePlan(t, 16000)
	if len(p.Nodes) != 2 || p.Nodes[0].Node != "node-a" || p.Nodes[1].Node != "node-b" {
		t.Fatalf("nodes = %+v", p.Nodes)
	}
	if p.Nodes[1].SOCKS5 != "127.0.0.1:16022" || p.ControlPlane.GRPC != "127.0.0.1:16000" {
		t.Fatalf("ports: %+v %+v", p.ControlPlane, p.Nodes[1])
	}
	if len(p.Waypoints) != 1 || p.Waypoints[0].HBONE != "127.0.10.2:15008" || p.Waypoints[0].ServiceAccount != "waypoint" {
		t.Fatalf("waypoints = %+v", p.Waypoints)
	}
	apps := map[string]string{}
	for _, a := range p.Apps {
		apps[a.Namespace+"/"+a.Name] = strings.Join(a.Listen, ",")
		if a.Command != EchoApp {
			t.Errorf("app %s/%s runs %q, want the echo backend", a.Namespace, a.Name, a.Command)
		}
	}
	want := map[string]string{
		"shop/reviews-v1": "127.0.110.11:8080",
		"shop/reviews-v2": "127.0.110.12:8080",
		"shop/ratings":    "127.0.110.13:9090",
	}
	if len(apps) != len(want) {
		t.Fatalf("apps = %v, want %v", apps, want)
	}
	for k, v := range want {
		if apps[k] != v {
			t.Errorf("app %s listens on %q, want %q", k, apps[k], v)
		}
	}
	if p.Example == nil || p.Example.URL != "http://reviews.shop/" || !strings.HasPrefix(p.Example.Client, "web/") {
		t.Errorf("example request = %+v, want a web pod GETting http://reviews.shop/", p.Example)
	}
	if _, err := NewPlan(&config.Snapshot{}, 70000); err == nil {
		t.Error("base port out of range accepted")
	}
}

func TestStartRefusesBusyPort(t *testing.T) {
	p := samplePlan(t, 16900)
	ln, err := net.Listen("tcp", p.Nodes[0].SOCKS5)
	if err != nil {
		t.Skipf("cannot take %s for the test: %v", p.Nodes[0].SOCKS5, err)
	}
	defer ln.Close()
	_, err = Start(context.Background(), p, Options{BinDir: t.TempDir(), StateDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), p.Nodes[0].SOCKS5+" is already in use") {
		t.Fatalf("Start with a busy port: %v", err)
	}
}

// Apps run only where a pod asks for one, and the example request is made
// of the configuration's own names.
func TestPlanAppsAndExampleFollowTheConfiguration(t *testing.T) {
	const doc = `
apiVersion: v1
kind: Namespace
metadata: {name: blue, labels: {causeway.dev/dataplane-mode: mesh}}
---
apiVersion: v1
kind: Pod
metadata: {name: caller, namespace: blue}
spec: {nodeName: n1, containers: [{name: c, image: i}]}
status: {podIP: 127.0.70.1}
---
apiVersion: v1
kind: Pod
metadata: {name: own, namespace: blue, labels: {app: own}, annotations: {causeway.dev/app-address: 127.0.170.2}}
spec: {nodeName: n1, containers: [{name: c, image: i, ports: [{containerPort: 8080}]}]}
status: {podIP: 127.0.70.2}
---
apiVersion: v1
kind: Pod
metadata: {name: api-0, namespace: blue, labels: {app: api},
  annotations: {causeway.dev/app-address: 127.0.170.3, causeway.dev/local-app: "exec my-server --port 9000"}}
spec: {nodeName: n1, containers: [{name: c, image: i, ports: [{containerPort: 9000}]}]}
status: {podIP: 127.0.70.3}
---
apiVersion: v1
kind: Service
metadata: {name: own, namespace: blue}
spec: {clusterIP: 127.0.80.2, selector: {app: own}, ports: [{port: 80, targetPort: 8080, appProtocol: http}]}
---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: blue}
spec: {clusterIP: 127.0.80.3, selector: {app: api}, ports: [{port: 8000, targetPort: 9000, appProtocol: http}]}
`
	objs, err := config.Decode("mesh.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	s, err := config.Translate(objs, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPlan(s, 16000)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Apps) != 1 {
		t.Fatalf("apps = %+v, want only blue/api-0's", p.Apps)
	}
	if a := p.Apps[0]; a.Name != "api-0" || a.Command != "exec my-server --port 9000" || strings.Join(a.Listen, ",") != "127.0.170.3:9000" {
		t.Errorf("app = %+v", a)
	}
	// The service whose endpoint runs an app is the one worth trying.
	want := ExampleRequest{Client: "blue/caller", URL: "http://api.blue:8000/"}
	if p.Example == nil || *p.Example != want {
		t.Errorf("example request = %+v, want %+v", p.Example, want)
	}
}

// A missing policy directory is reported before anything starts, not after
// the waypoint's readiness wait.
func TestStartRefusesMissingPolicyDir(t *testing.T) {
	p := samplePlan(t, 16900)
	state := t.TempDir()
	missing := filepath.Join(t.TempDir(), "policies")
	_, err := Start(context.Background(), p, Options{BinDir: t.TempDir(), StateDir: state, PolicyDir: missing})
	if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "no such file or directory") {
		t.Fatalf("Start without a policy directory: %v", err)
	}
	if logs, _ := os.ReadDir(filepath.Join(state, "logs")); len(logs) != 0 {
		t.Fatalf("processes were started: %v", logs)
	}
}

// waitReady's error carries the reason a component gives for not being ready.
func TestWaitReadyReportsTheReason(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not ready: no policy active: dir rejected at load: policy directory /x: no such file or directory", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := waitReady(ctx, &process{name: "waypoint-shop-waypoint-0", done: make(chan struct{})}, srv.URL, nil)
	if err == nil || !strings.Contains(err.Error(), "policy directory /x: no such file or directory") {
		t.Fatalf("waitReady = %v, want the component's reason", err)
	}
}

// A waypoint whose policy was rejected is reported at once, with the
// rejection from its /config_dump.
func TestWaitReadyStopsAtARejectedPolicy(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/config_dump" {
			fmt.Fprint(w, `{"policies": {"decision_path": "data.envoy.authz.allow",
				"last_rejection": {"source": "dir", "revision": "0a1b", "stage": "compile", "reason": "authz.rego:3: rego_parse_error"}}}`)
			return
		}
		http.Error(w, "not ready: no policy active", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := waitReady(ctx, &process{name: "waypoint-shop-waypoint-0", done: make(chan struct{})}, srv.URL+"/healthz/ready",
		policyRejected(strings.TrimPrefix(srv.URL, "http://")))
	if err == nil || !strings.Contains(err.Error(), "rejected at compile: authz.rego:3: rego_parse_error") || ctx.Err() != nil {
		t.Fatalf("waitReady = %v (context: %v), want the rejection at once", err, ctx.Err())
	}
}
