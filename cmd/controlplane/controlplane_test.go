package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/causeway-mesh/causeway/pkg/logging"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/caclient"
	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

const (
	nodeAToken = "node-a-proxy-token-0123456789"
	nodeBToken = "node-b-proxy-token-0123456789"
	// patience bounds every wait; generous because the machine may be loaded.
	patience = 10 * time.Second
)

const meshYAML = `
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {causeway.dev/dataplane-mode: mesh}}
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-1, namespace: shop, labels: {app: reviews}}
spec: {nodeName: node-a, serviceAccountName: reviews, containers: [{name: r, image: r, ports: [{name: http, containerPort: 8080}]}]}
status: {podIP: 127.0.10.11}
---
apiVersion: v1
kind: Pod
metadata: {name: ratings-1, namespace: shop, labels: {app: ratings}}
spec: {nodeName: node-b, serviceAccountName: ratings, containers: [{name: r, image: r}]}
status: {podIP: 127.0.10.12}
---
apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: shop}
spec: {clusterIP: 127.0.20.1, selector: {app: reviews}, ports: [{name: http, port: 80, targetPort: http, appProtocol: http}]}
`

const extraPod = `
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-2, namespace: shop, labels: {app: reviews}}
spec: {nodeName: node-a, serviceAccountName: reviews-v2, containers: [{name: r, image: r, ports: [{name: http, containerPort: 8080}]}]}
status: {podIP: 127.0.10.13}
`

type harness struct {
	t        *testing.T
	dir      string
	opts     options
	logs     *observer.ObservedLogs
	bundle   *trust.Bundle
	cp       *controlPlane
	stopCP   func()
	grpcAddr string
	httpAddr string
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	base := t.TempDir()
	h := &harness{t: t, dir: filepath.Join(base, "config")}
	if err := os.MkdirAll(h.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	h.write("mesh.yaml", meshYAML)
	tokens := filepath.Join(base, "tokens")
	if err := os.WriteFile(tokens, []byte(nodeAToken+" causeway-system/nodeproxy node-a\n"+nodeBToken+" causeway-system/nodeproxy node-b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := parseFlags([]string{
		"--config-dir", h.dir, "--ca-dir", filepath.Join(base, "ca"), "--tokens-file", tokens,
		"--listen", "127.0.0.1:0", "--readiness", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--admin", "127.0.0.1:0",
		"--config-debounce", "50ms", "--shutdown-grace", "2s",
	})
	if err != nil {
		t.Fatal(err)
	}
	h.opts = opts
	return h
}

func (h *harness) write(name, content string) {
	h.t.Helper()
	// Write then rename, as editors and git-sync do: readers never see half a file.
	tmp := filepath.Join(h.dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(h.dir, name)); err != nil {
		h.t.Fatal(err)
	}
}

// start runs a control plane; listen overrides the gRPC address (restarts).
func (h *harness) start(listen string) {
	h.t.Helper()
	o := h.opts
	if listen != "" {
		o.listen = listen
	}
	core, logs := observer.New(zapcore.DebugLevel)
	h.logs = logs
	log := &logging.Logger{Logger: zap.New(core), Level: zap.NewAtomicLevelAt(zapcore.DebugLevel)}
	cp, err := newControlPlane(o, log)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cp.run(ctx) }()
	select {
	case <-cp.listenedCh:
	case err := <-done:
		h.t.Fatalf("control plane: %v", err)
	case <-time.After(patience):
		h.t.Fatal("control plane did not start listening")
	}
	h.cp = cp
	h.grpcAddr = cp.grpcAddr.Load().(string)
	v, _ := cp.httpAddrs.Load(o.metricsAddr)
	h.httpAddr = v.(string)
	h.bundle = cp.bundle
	stopped := false
	h.stopCP = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				h.t.Errorf("control plane run: %v", err)
			}
		case <-time.After(patience):
			h.t.Error("control plane did not shut down")
		}
	}
	h.t.Cleanup(h.stopCP)
}

func (h *harness) client(token, nodeID string, subs ...xds.Subscription) *xds.Client {
	h.t.Helper()
	changed := make(chan struct{}, 1)
	c, err := xds.NewClient(xds.ClientOptions{
		Address: h.grpcAddr, Bundle: h.bundle, Token: caclient.StaticToken(token), NodeID: nodeID,
		Subscriptions: subs, InitialBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond,
		OnChange: func(*xds.State, []string) {
			select {
			case changed <- struct{}{}:
			default:
			}
		},
	})
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	h.t.Cleanup(func() {
		cancel()
		<-done
	})
	wctx, wcancel := context.WithTimeout(context.Background(), patience)
	defer wcancel()
	if err := c.WaitReady(wctx); err != nil {
		h.t.Fatal(err)
	}
	return c
}

func (h *harness) get(path string) (int, string) {
	h.t.Helper()
	resp, err := http.Get("http://" + h.httpAddr + path)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

func workloadNames(s *xds.State) string {
	var out []string
	for _, w := range s.Workloads {
		out = append(out, w.Name)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func eventually(t *testing.T, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > patience {
			t.Fatalf("timed out after %v waiting for: %s", patience, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

func TestConfigChangesReachClients(t *testing.T) {
	h := newHarness(t)
	h.start("")
	eventually(t, "readiness after the first good configuration", func() bool {
		code, _ := h.get("/healthz/ready")
		return code == http.StatusOK
	})
	c := h.client(nodeAToken, "nodeproxy~node-a",
		xds.Subscription{TypeURL: meshv1.WorkloadTypeURL}, xds.Subscription{TypeURL: meshv1.ServiceTypeURL})
	if got := workloadNames(c.State()); got != "ratings-1,reviews-1" {
		t.Fatalf("initial workloads %s", got)
	}

	// Editing a file reaches the client; the 1 s target is logged, not asserted.
	start := time.Now()
	h.write("mesh.yaml", meshYAML+extraPod)
	eventually(t, "new pod reaches the client", func() bool { return workloadNames(c.State()) == "ratings-1,reviews-1,reviews-2" })
	latency := time.Since(start)
	t.Logf("config edit -> client: %v (target 1s)", latency)
	eventually(t, "new endpoint reaches the client", func() bool {
		return len(c.State().Services["shop/reviews"].GetEndpoints()) == 2
	})

	// The CA reads the same model: node-a may now have reviews-v2's identity, node-b may not.
	fetch := func(token, id string) error {
		cc, err := caclient.New(caclient.Options{Address: h.grpcAddr, Bundle: h.bundle, ServerIdentity: h.cp.identity, Token: caclient.StaticToken(token)})
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ident, err := trust.ParseIdentity(id)
		if err != nil {
			t.Fatal(err)
		}
		_, csr, err := trust.NewKeyAndCSR(ident)
		if err != nil {
			t.Fatal(err)
		}
		_, err = cc.Fetch(context.Background(), ident, csr, 0)
		return err
	}
	if err := fetch(nodeAToken, "spiffe://cluster.local/ns/shop/sa/reviews-v2"); err != nil {
		t.Errorf("node-a asking for a workload on node-a: %v", err)
	}
	if err := fetch(nodeBToken, "spiffe://cluster.local/ns/shop/sa/reviews-v2"); err == nil ||
		!strings.Contains(err.Error(), "no workload with identity spiffe://cluster.local/ns/shop/sa/reviews-v2 on node node-b") {
		t.Errorf("node-b asking for a workload on node-a: %v", err)
	}

	// Deleting a pod removes it.
	h.write("mesh.yaml", meshYAML)
	eventually(t, "deleted pod leaves the client", func() bool { return workloadNames(c.State()) == "ratings-1,reviews-1" })
	eventually(t, "the CA forgets it too", func() bool {
		err := fetch(nodeAToken, "spiffe://cluster.local/ns/shop/sa/reviews-v2")
		return err != nil && strings.Contains(err.Error(), "no workload with identity")
	})

	// A broken file: reported with file and reason; the last good configuration stays.
	bad := filepath.Join(h.dir, "broken.yaml")
	h.write("broken.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: [oops\n")
	eventually(t, "the broken file is logged with its name and reason", func() bool {
		for _, e := range h.logs.FilterMessage("configuration rejected; the last good configuration stays in force").All() {
			m := e.ContextMap()
			if m["file"] == bad && strings.Contains(m["reason"].(string), "YAML syntax") {
				return true
			}
		}
		return false
	})
	time.Sleep(200 * time.Millisecond)
	if got := workloadNames(c.State()); got != "ratings-1,reviews-1" {
		t.Errorf("after a rejected change the client holds %s", got)
	}
	if code, _ := h.get("/healthz/ready"); code != http.StatusOK {
		t.Errorf("a rejected change made the control plane unready: %d", code)
	}
	// Once the syntax is right, an object the mesh cannot serve is refused
	// alone: logged with kind, namespace, name and reason, counted, listed
	// in /debug/config, while the good pod next to it is served.
	slice := "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: x, namespace: shop, labels: {kubernetes.io/service-name: gone}}\naddressType: IPv4\nendpoints: []\n"
	h.write("broken.yaml", slice+"---\n"+extraPod)
	eventually(t, "the good pod next to the refused slice applies", func() bool { return workloadNames(c.State()) == "ratings-1,reviews-1,reviews-2" })
	eventually(t, "the refused slice is logged", func() bool {
		for _, e := range h.logs.FilterMessage("object refused; it fails closed and the rest of the configuration is served").All() {
			m := e.ContextMap()
			if m["origin"] == bad && m["kind"] == "EndpointSlice" && m["namespace"] == "shop" && m["name"] == "x" &&
				strings.Contains(m["reason"].(string), "dangling reference: Service shop/gone") {
				return true
			}
		}
		return false
	})
	if _, m := h.get("/metrics"); !strings.Contains(m, "causeway_config_rejected_total 1") || !strings.Contains(m, `causeway_config_refused_objects{kind="EndpointSlice"} 1`) ||
		!strings.Contains(m, "causeway_xds_connected_clients 1") {
		t.Errorf("metrics do not show 1 rejection, 1 refused slice and 1 client:\n%s", grepLines(m, "causeway_"))
	}
	if code, body := h.get("/debug/config"); code != http.StatusOK || !strings.Contains(body, "reviews-2") || !strings.Contains(body, `"reason": "dangling reference: Service shop/gone does not exist"`) {
		t.Errorf("/debug/config: %d %s", code, body)
	}
	// Fixing the file ends the refusal.
	h.write("broken.yaml", extraPod)
	eventually(t, "the refusal ends", func() bool {
		_, m := h.get("/metrics")
		return strings.Contains(m, `causeway_config_refused_objects{kind="EndpointSlice"} 0`)
	})
	if got := workloadNames(c.State()); got != "ratings-1,reviews-1,reviews-2" {
		t.Errorf("after the fix the client holds %s", got)
	}
}

func TestRestartClientsKeepStateAndConverge(t *testing.T) {
	h := newHarness(t)
	h.start("")
	c := h.client(nodeAToken, "nodeproxy~node-a", xds.Subscription{TypeURL: meshv1.WorkloadTypeURL})
	addr := h.grpcAddr
	eventually(t, "connected", c.Connected)

	h.stopCP()
	eventually(t, "client notices", func() bool { return !c.Connected() })
	// Change the configuration while the control plane is away.
	h.write("mesh.yaml", meshYAML+extraPod)
	time.Sleep(300 * time.Millisecond)
	if !c.Ready() || workloadNames(c.State()) != "ratings-1,reviews-1" {
		t.Fatalf("while the control plane is down: ready=%v workloads=%s", c.Ready(), workloadNames(c.State()))
	}

	// The same CA directory: the restarted control plane has the same roots.
	h.start(addr)
	d := eventually(t, "client converges after restart", func() bool {
		return c.Connected() && workloadNames(c.State()) == "ratings-1,reviews-1,reviews-2"
	})
	t.Logf("converged %v after restart", d)
}

// A standard TLS client that verifies the host it dials (as gRPC clients and
// Istio's CA clients do) accepts the serving certificate, by the Service's
// names and by the listen address; the mesh identity stays its URI SAN.
func TestServingCertificateNames(t *testing.T) {
	h := newHarness(t)
	h.start("")
	roots := x509.NewCertPool()
	for _, r := range h.bundle.Roots() {
		roots.AddCert(r)
	}
	for _, name := range []string{"causeway-controlplane.causeway-system.svc", "causeway-controlplane.causeway-system",
		"causeway-controlplane", "causeway-controlplane.causeway-system.svc.cluster.local", "127.0.0.1"} {
		c, err := tls.Dial("tcp", h.grpcAddr, &tls.Config{ServerName: name, RootCAs: roots, NextProtos: []string{"h2"}})
		if err != nil {
			t.Errorf("verifying %s: %v", name, err)
			continue
		}
		leaf := c.ConnectionState().PeerCertificates[0]
		c.Close()
		if len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://cluster.local/ns/causeway-system/sa/controlplane" {
			t.Errorf("URI SANs %v", leaf.URIs)
		}
	}
	if c, err := tls.Dial("tcp", h.grpcAddr, &tls.Config{ServerName: "istiod.istio-system.svc", RootCAs: roots}); err == nil {
		c.Close()
		t.Error("a name the certificate does not carry verified")
	}

	o, err := parseFlags([]string{"--config-dir", "x", "--ca-dir", "y", "--listen", "[::1]:15012", "--dns-names", "cp.example.org, istiod.istio-system.svc"})
	if err != nil {
		t.Fatal(err)
	}
	names, err := servingNames(o)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(names.DNS) != "[cp.example.org istiod.istio-system.svc]" || fmt.Sprint(names.IPs) != "[::1]" {
		t.Errorf("configured names %v, addresses %v", names.DNS, names.IPs)
	}
	o.listen = ":15012"
	if names, err = servingNames(o); err != nil || len(names.IPs) == 0 {
		t.Errorf("listening on every address: %v, %v", names.IPs, err)
	}
}

func TestFlags(t *testing.T) {
	if _, err := parseFlags([]string{"--ca-dir", "x"}); err == nil || !strings.Contains(err.Error(), "--config-dir") {
		t.Errorf("missing --config-dir: %v", err)
	}
	if _, err := parseFlags([]string{"--config-dir", "x"}); err == nil || !strings.Contains(err.Error(), "--ca-dir") {
		t.Errorf("missing --ca-dir: %v", err)
	}
	if _, err := parseFlags([]string{"--config-dir", "x", "--ca-dir", "y", "--trusted-node-accounts", "justaname"}); err == nil {
		t.Error("bad trusted account accepted")
	}
	o, err := parseFlags([]string{"--config-dir", "x", "--ca-dir", "y", "--trust-domain", "example.org",
		"--trusted-node-accounts", "kube-system/ztunnel, spiffe://example.org/ns/causeway-system/sa/nodeproxy"})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.trustedNodeAccounts) != 2 || o.trustedNodeAccounts[0].String() != "spiffe://example.org/ns/kube-system/sa/ztunnel" || o.listen != "127.0.0.1:15012" {
		t.Errorf("parsed %+v", o)
	}
	if _, err := parseFlags([]string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

func TestSourceFlags(t *testing.T) {
	o, err := parseFlags([]string{"--source", "dir=/etc/mesh", "--ca-dir", "y"})
	if err != nil || o.configDir != "/etc/mesh" || o.kubernetes {
		t.Errorf("--source dir=: %+v, %v", o, err)
	}
	o, err = parseFlags([]string{"--source", "kubernetes", "--kubeconfig", "/k", "--ca-dir", "y", "--token-audiences", "a, b"})
	if err != nil || !o.kubernetes || o.kubeconfig != "/k" || strings.Join(o.tokenAudiences, "|") != "a|b" {
		t.Errorf("--source kubernetes: %+v, %v", o, err)
	}
	if o, _ := parseFlags([]string{"--source", "kubernetes", "--ca-dir", "y"}); strings.Join(o.tokenAudiences, "|") != "causeway-ca" {
		t.Errorf("default audiences %q", o.tokenAudiences)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--source", "git=x"}, `want dir=PATH or kubernetes`},
		{[]string{"--source", "dir="}, `want dir=PATH or kubernetes`},
		{[]string{"--source", "kubernetes", "--config-dir", "x"}, "give one"},
		{[]string{"--config-dir", "x", "--kubeconfig", "k"}, "--kubeconfig is for --source kubernetes"},
		{[]string{"--source", "kubernetes", "--tokens-file", "t"}, "--tokens-file is for a directory source"},
		{[]string{"--source", "kubernetes", "--token-audiences", " , "}, "--token-audiences is empty"},
	} {
		if _, err := parseFlags(append(tc.args, "--ca-dir", "y")); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// The CA comes from one place: a directory, or in Kubernetes a Secret.
func TestCAFlags(t *testing.T) {
	o, err := parseFlags([]string{"--source", "kubernetes", "--ca-secret", "causeway-ca"})
	if err != nil || o.caSecret != "causeway-ca" || o.rootsConfigMap != "causeway-root-cert" {
		t.Errorf("--ca-secret: %+v, %v", o, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--config-dir", "x"}, "--ca-dir (or, with --source kubernetes, --ca-secret) is required"},
		{[]string{"--config-dir", "x", "--ca-secret", "s"}, "--ca-secret is for --source kubernetes"},
		{[]string{"--source", "kubernetes", "--ca-secret", "s", "--ca-dir", "d"}, "give one"},
	} {
		if _, err := parseFlags(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// The admin endpoints live on --admin alone, not on the metrics port a
// Service exposes; /debug/syncz reports each client's exchange.
func TestAdminEndpointsOnTheAdminAddressOnly(t *testing.T) {
	h := newHarness(t)
	const metricsAddr, adminAddr = "127.0.0.1:23011", "127.0.0.1:23012"
	h.opts.metricsAddr, h.opts.readinessAddr, h.opts.adminAddr = metricsAddr, metricsAddr, adminAddr
	h.start("")
	eventually(t, "readiness", func() bool { code, _ := h.get("/healthz/ready"); return code == http.StatusOK })
	h.client(nodeAToken, "nodeproxy~node-a", xds.Subscription{TypeURL: meshv1.WorkloadTypeURL})
	for _, path := range []string{"/logging", "/debug/config", "/debug/syncz"} {
		if code, _ := h.get(path); code != http.StatusNotFound {
			t.Errorf("metrics port serves %s: %d", path, code)
		}
	}
	h.httpAddr = adminAddr
	if code, body := h.get("/logging"); code != http.StatusOK || !strings.Contains(body, `"level"`) {
		t.Errorf("admin /logging: %d %s", code, body)
	}
	eventually(t, "node-a synced in /debug/syncz", func() bool {
		code, body := h.get("/debug/syncz")
		var s xds.Syncz
		if code != http.StatusOK || json.Unmarshal([]byte(body), &s) != nil || len(s.Clients) != 1 {
			return false
		}
		cl := s.Clients[0]
		return cl.NodeID == "nodeproxy~node-a" && len(cl.Types) == 1 && cl.Types[0].Status == xds.SyncSynced && cl.Types[0].AckedVersion == s.Version
	})
}
