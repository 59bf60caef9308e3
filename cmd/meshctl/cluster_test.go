package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"flag"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/causeway-mesh/causeway/pkg/admin"
	"github.com/causeway-mesh/causeway/pkg/logging"
	"github.com/causeway-mesh/causeway/pkg/trust/certmanager"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// serveAdmin runs a proxy's admin handler on 127.0.0.1 and returns a
// client for it, as meshctl has one at the local end of a port-forward.
func serveAdmin(t *testing.T, o admin.Options) *adminClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: admin.Handler(o), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return &adminClient{pod: "causeway-system/test", base: "http://" + ln.Addr().String(), http: &http.Client{Timeout: 5 * time.Second}}
}

// statusOf is a certificate manager's view of a chain.
func statusOf(id string, chain ...*x509.Certificate) certmanager.CertificateStatus {
	return certmanager.CertificateStatus{Identity: id, State: certmanager.StateAvailable, CertChain: certmanager.ChainInfo(chain)}
}

// nodeProxyDump is a node proxy's dump of two workloads (one with two
// addresses) and a service.
func nodeProxyDump(t *testing.T) (*admin.ConfigDump, certmanager.CertificateStatus) {
	t.Helper()
	ca := trusttest.NewCA(t, "cluster.local")
	id := trusttest.Identity(t, "spiffe://cluster.local/ns/web/sa/frontend")
	cert := ca.Certificate(t, id, time.Hour)
	cs := statusOf(id.String(), cert.Leaf, ca.Bundle.Roots()[0])
	d := &admin.ConfigDump{ByAddr: map[string]json.RawMessage{}, ByVIP: map[string]json.RawMessage{}, Certificates: []certmanager.CertificateStatus{cs},
		Connections: []map[string]any{{"src": "10.244.0.5:40000", "src_identity": id.String(), "dst": "10.244.1.7:8080"}}}
	for _, w := range []*meshv1.Workload{
		{Uid: "web/frontend-1", Name: "frontend-1", Namespace: "web", Addresses: []string{"10.244.0.5", "fd00::5"}, Node: "node-a", Hbone: true, Identity: id.String()},
		{Uid: "shop/reviews-1", Name: "reviews-1", Namespace: "shop", Addresses: []string{"10.244.1.7"}, Node: "node-b", Hbone: true,
			Waypoint: &meshv1.Ref{Namespace: "shop", Name: "waypoint"}},
	} {
		raw, err := protojson.Marshal(w)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range w.GetAddresses() {
			d.ByAddr[a] = raw
		}
	}
	raw, err := protojson.Marshal(&meshv1.Service{Name: "reviews", Namespace: "shop", Vips: []string{"10.96.0.20"},
		Ports: []*meshv1.ServicePort{{Port: 80, AppProtocol: "http"}}, Waypoint: &meshv1.Ref{Namespace: "shop", Name: "waypoint"}})
	if err != nil {
		t.Fatal(err)
	}
	d.ByVIP["10.96.0.20"] = raw
	return d, cs
}

// proxy-config reads a real admin server's /config_dump and shows each
// view in each format.
func TestProxyConfigViews(t *testing.T) {
	d, cs := nodeProxyDump(t)
	a := serveAdmin(t, admin.Options{Dump: func() (*admin.ConfigDump, error) { return d, nil }, Logging: http.NotFoundHandler()})
	raw, err := a.do(context.Background(), http.MethodGet, "/config_dump", nil)
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := parseDump(raw)
	if err != nil {
		t.Fatal(err)
	}
	view := func(kind, format string) (string, error) {
		var out bytes.Buffer
		err := writeProxyConfig(&out, format, kind, "node proxy", "causeway-system/np-1", raw, parsed, time.Now())
		return out.String(), err
	}

	// all, as a table: the seed's by_addr, by_vip and certificates views.
	out, err := view("all", "table")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"WORKLOADS (by_addr)", "frontend-1", "10.244.0.5,fd00::5", "shop/waypoint", "SERVICES (by_vip)", "10.96.0.20", "80/http",
		"CERTIFICATES", cs.Identity, "Leaf", "Root", "CONNECTIONS (inbound)"} {
		if !strings.Contains(out, want) {
			t.Errorf("all: no %q in\n%s", want, out)
		}
	}
	if strings.Count(out, "frontend-1") != 1 {
		t.Errorf("a workload with two addresses is listed more than once:\n%s", out)
	}
	// all, as JSON: the dump as the proxy serves it.
	out, err = view("all", "json")
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		ByAddr map[string]json.RawMessage `json:"by_addr"`
		ByVIP  map[string]json.RawMessage `json:"by_vip"`
		Certs  []certmanager.CertificateStatus
	}
	if err := json.Unmarshal([]byte(out), &back); err != nil || len(back.ByAddr) != 3 || len(back.ByVIP) != 1 {
		t.Errorf("all -o json: %v, %d addresses and %d VIPs, want 3 and 1:\n%s", err, len(back.ByAddr), len(back.ByVIP), out)
	}
	// workloads as YAML: each workload once, as the mesh's JSON.
	out, err = view("workloads", "yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ws []map[string]any
	if err := yaml.Unmarshal([]byte(out), &ws); err != nil || len(ws) != 2 || ws[0]["name"] != "reviews-1" || ws[1]["name"] != "frontend-1" {
		t.Errorf("workloads -o yaml: %v\n%s", err, out)
	}
	out, err = view("services", "json")
	if err != nil || !strings.Contains(out, `"10.96.0.20"`) {
		t.Errorf("services -o json: %v\n%s", err, out)
	}
	out, err = view("certificates", "table")
	if err != nil || !strings.Contains(out, "CERTIFICATE NAME") || !strings.Contains(out, cs.Identity) {
		t.Errorf("certificates: %v\n%s", err, out)
	}
	out, err = view("connections", "table")
	if err != nil || !strings.Contains(out, "10.244.0.5:40000") || !strings.Contains(out, "10.244.1.7:8080  shop/reviews-1") {
		t.Errorf("connections: %v\n%s", err, out)
	}
	noConns := *parsed
	noConns.Connections = nil // a waypoint's dump
	if err := writeProxyConfig(new(bytes.Buffer), "table", "connections", "waypoint", "shop/wp-1", raw, &noConns, time.Now()); err == nil || !strings.Contains(err.Error(), "lists no connections") {
		t.Errorf("connections of a waypoint: %v", err)
	}
	// A node proxy has no waypoint policy: said so, not an empty table.
	if _, err := view("policy", "table"); err == nil || !strings.Contains(err.Error(), "holds no waypoint policy") {
		t.Errorf("policy of a node proxy: %v", err)
	}
	if _, err := view("all", "xml"); err == nil {
		t.Error("an unknown output format was accepted")
	}
}

// log-level reads and sets the level through a real admin /logging.
func TestLogLevelThroughAdmin(t *testing.T) {
	l, err := logging.New(logging.Options{Level: "info"})
	if err != nil {
		t.Fatal(err)
	}
	a := serveAdmin(t, admin.Options{Dump: func() (*admin.ConfigDump, error) { return nil, nil }, Logging: l.Handler()})
	ctx := context.Background()
	if got, err := a.logLevel(ctx, ""); err != nil || got != "info" {
		t.Fatalf("read: %q, %v; want info", got, err)
	}
	if got, err := a.logLevel(ctx, "debug"); err != nil || got != "debug" {
		t.Fatalf("set: %q, %v; want debug", got, err)
	}
	if l.Level.Level() != zapcore.DebugLevel {
		t.Errorf("the logger is at %v after setting debug", l.Level.Level())
	}
	// Something that is not a proxy's /logging is reported, not taken as a level.
	other := serveAdmin(t, admin.Options{Dump: func() (*admin.ConfigDump, error) { return nil, nil },
		Logging: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("<html>hello</html>")) })})
	if _, err := other.logLevel(ctx, ""); err == nil || !strings.Contains(err.Error(), "not a level") {
		t.Errorf("a non-level answer: %v", err)
	}
}

func pod(ns, name, ip, node string, labels map[string]string, containers ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:   corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: ip}}}}
	for _, c := range containers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c})
	}
	return p
}

// proxy-status joins the replicas' clients with the proxy pods, and shows
// a running proxy no replica serves.
func TestProxyStatuses(t *testing.T) {
	np := map[string]string{nodeProxyLabel: nodeProxyLabelValue}
	pods := []*corev1.Pod{
		pod(systemNamespace, "np-a", "10.244.0.2", "node-a", np, "agent", "nodeproxy"),
		pod(systemNamespace, "np-b", "10.244.1.2", "node-b", np, "agent", "nodeproxy"),
		pod("shop", "waypoint-1", "10.244.1.9", "node-b", map[string]string{waypointLabel: "waypoint"}, "waypoint"),
		pod(systemNamespace, "cp-1", "10.244.0.3", "node-a", map[string]string{nodeProxyLabel: controlPlaneValue}, "controlplane"),
	}
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	syncz := map[string]*xds.Syncz{"cp-1": {Version: "7", Clients: []xds.ClientSync{
		{NodeID: "nodeproxy~node-a", Pod: "causeway-system/np-a", Remote: "10.244.0.2:40000", Types: []xds.TypeSync{
			{Type: "workload", Status: xds.SyncSynced, SentVersion: "7", AckedVersion: "7"},
			{Type: "service", Status: xds.SyncNACKed, SentVersion: "7", AckedVersion: "6", NACK: &xds.NACK{Nonce: "9", Version: "7", Message: "bad service", At: at}},
		}},
		{NodeID: "waypoint~shop/waypoint", Remote: "[10.244.1.9]:41000", Types: []xds.TypeSync{
			{Type: "workload", Status: xds.SyncStale, SentVersion: "7", AckedVersion: "6"},
		}},
	}}}
	st := proxyStatuses(syncz, pods)
	if len(st) != 3 {
		t.Fatalf("%d rows, want 3 (two connected, one not): %+v", len(st), st)
	}
	byPod := map[string]proxyStatus{}
	for _, s := range st {
		byPod[s.Pod] = s
	}
	if s := byPod["causeway-system/np-a"]; !s.Connected || s.ControlPlane != "cp-1" || s.Node != "node-a" || s.Kind != "node proxy" {
		t.Errorf("np-a: %+v", s)
	}
	if s := byPod["shop/waypoint-1"]; !s.Connected || s.Kind != "waypoint" {
		t.Errorf("the waypoint, matched by its address: %+v", s)
	}
	if s := byPod["causeway-system/np-b"]; s.Connected {
		t.Errorf("np-b is served by no replica: %+v", s)
	}
	var out bytes.Buffer
	if err := writeProxyStatus(&out, st); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"WORKLOAD", "SERVICE", "SYNCED (7)", "NACKED (sent 7, acked 6)", "STALE (sent 7, acked 6)", "NOT CONNECTED",
		"causeway-system/np-a service: rejected version 7 at 2026-12-06T12:00:00Z: bad service"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
}

// Which pods are proxies: the chart's labels in the mesh's namespace, the
// waypoint template's label and container.
func TestProxyKind(t *testing.T) {
	np := map[string]string{nodeProxyLabel: nodeProxyLabelValue}
	for _, c := range []struct {
		p    *corev1.Pod
		want string
	}{
		{pod(systemNamespace, "np", "", "", np, "nodeproxy"), "node proxy"},
		{pod("default", "np", "", "", np, "nodeproxy"), ""}, // a look-alike elsewhere
		{pod("shop", "wp", "", "", map[string]string{waypointLabel: "waypoint"}, "waypoint"), "waypoint"},
		{pod("shop", "gw", "", "", map[string]string{waypointLabel: "ingress"}, "envoy"), ""}, // another controller's Gateway
		{pod("web", "frontend", "", "", map[string]string{"app": "frontend"}, "frontend"), ""},
	} {
		if got := proxyKind(c.p); got != c.want {
			t.Errorf("%s/%s: %q, want %q", c.p.Namespace, c.p.Name, got, c.want)
		}
	}
}

func TestParseInterspersed(t *testing.T) {
	kf, pos, err := parseArgs(flag.NewFlagSet("t", flag.ContinueOnError), []string{"all", "np-1", "-n", "causeway-system", "-o", "json", "--", "-x"}, true, 3, "t")
	if err != nil || strings.Join(pos, " ") != "all np-1 -x" || kf.namespace != "causeway-system" || kf.output != "json" {
		t.Errorf("got %q, %v, namespace %q, output %q", pos, err, kf.namespace, kf.output)
	}
	if _, _, err := parseArgs(flag.NewFlagSet("t", flag.ContinueOnError), []string{"-o", "json", "stray"}, false, 0, "meshctl t"); err == nil || !strings.Contains(err.Error(), `unexpected "stray"`) {
		t.Errorf("a stray argument: %v", err)
	}
}
