// Package ingress runs a local mesh (the sample of examples/local on
// loopback addresses of its own) with an ingress Gateway in front of it,
// the real binaries as `meshctl up` runs them, and checks the ingress data
// path with real TLS clients: SNI per listener, listener isolation, a
// listener whose certificate does not resolve, ReferenceGrants, and the
// waypoint's OPA policy deciding the gateway's requests.
package ingress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/causeway-mesh/causeway/internal/ingresstest"
	"github.com/causeway-mesh/causeway/pkg/backendtls/backendtlstest"
	"github.com/causeway-mesh/causeway/pkg/localmesh"
)

// Addresses and ports of this suite alone (it may run beside the e2e
// suite and `make demo`).
var rewrite = strings.NewReplacer("127.0.110.", "127.0.232.", "127.0.10.", "127.0.231.", "127.0.20.", "127.0.234.")

const (
	basePort  = 23000
	gatewayIP = "127.0.233.1"
	identity  = "spiffe://cluster.local/ns/edge/sa/ingress"
	waypoint  = "waypoint-shop-waypoint-0"
)

var (
	mesh  *localmesh.Mesh
	cfg   string
	roots *x509.CertPool
	// keys are the listeners' private keys (PEM), which must never leave
	// the control plane and the gateway.
	keys []string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	work, err := os.MkdirTemp("", "causeway-ingress-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if mesh, err = start(work); err != nil {
		fmt.Fprintf(os.Stderr, "ingress: start mesh: %v (logs in %s)\n", err, work)
		return 1
	}
	code := m.Run()
	select {
	case died := <-mesh.Died:
		fmt.Fprintf(os.Stderr, "ingress: a mesh process died: %s\n", died)
		code = 1
	default:
	}
	mesh.Stop()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "ingress: logs kept in %s\n", work)
		return code
	}
	os.RemoveAll(work)
	return 0
}

var edgeYAML = `apiVersion: v1
kind: Namespace
metadata: {name: edge}
---
` + ingresstest.GatewayYAML("edge", "ingress",
	ingresstest.Listener{Name: "http", Port: 23080, Protocol: "HTTP"},
	ingresstest.Listener{Name: "grpc", Port: 23081, Protocol: "HTTP", Hostname: "grpc.example.com"},
	ingresstest.Listener{Name: "shop", Port: 23443, Protocol: "HTTPS", Hostname: "shop.example.com", Certificates: []string{"shop-cert"}},
	ingresstest.Listener{Name: "api", Port: 23443, Protocol: "HTTPS", Hostname: "*.example.com", Certificates: []string{"wild-cert"}},
	ingresstest.Listener{Name: "broken", Port: 23444, Protocol: "HTTPS", Certificates: []string{"absent"}},
	ingresstest.Listener{Name: "crossns", Port: 23445, Protocol: "HTTPS", Certificates: []string{"certs/cross-cert"}},
	ingresstest.Listener{Name: "kube", Port: 23082, Protocol: "HTTP", AllNamespaces: true},
	ingresstest.Listener{Name: "kubetls", Port: 23446, Protocol: "HTTPS", Certificates: []string{"own-cert"}, AllNamespaces: true}) +
	ingresstest.PodYAML("edge", "ingress", "node-a", gatewayIP) +
	ingresstest.HTTPRouteYAML("edge", "shop", []ingresstest.Parent{{Name: "ingress", Section: "shop"}, {Name: "ingress", Section: "http"},
		{Name: "ingress", Section: "crossns"}, {Name: "ingress", Section: "broken"}}, nil, ingresstest.Backend{Namespace: "shop", Name: "reviews-v1", Port: 80}) +
	ingresstest.HTTPRouteYAML("edge", "api", []ingresstest.Parent{{Name: "ingress", Section: "api"}}, nil, ingresstest.Backend{Namespace: "shop", Name: "reviews-v2", Port: 80}) + `apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {namespace: edge, name: ratings}
spec:
  parentRefs: [{name: ingress, sectionName: grpc}]
  rules:
  - matches: [{method: {service: shop.Ratings}}]
    backendRefs: [{name: ratings, namespace: shop, port: 9090}]
---
` + ingresstest.GrantYAML("shop", "from-edge", "edge", "Service", "HTTPRoute", "GRPCRoute") + `apiVersion: v1
kind: Namespace
metadata: {name: certs}
`

// kubeYAML: Kubernetes Ingress objects served by the Gateway above (its
// listeners kube and kubetls admit every namespace's routes).
var kubeYAML = ingresstest.IngressClassYAML("causeway", true,
	"{apiGroup: gateway.networking.k8s.io, kind: Gateway, scope: Namespace, namespace: edge, name: ingress}") + `apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {namespace: shop, name: store}
spec:
  defaultBackend: {service: {name: reviews-v2, port: {number: 80}}}
  tls: [{hosts: [store.example.net], secretName: store-cert}]
  rules:
  - host: store.example.net
    http:
      paths:
      - {path: /public/exact, pathType: Exact, backend: {service: {name: reviews-v1, port: {name: http}}}}
      - {path: /public/pre, pathType: Prefix, backend: {service: {name: reviews-v1, port: {number: 80}}}}
      - {path: /public/gone, pathType: Prefix, backend: {service: {name: gone, port: {number: 80}}}}
  - host: "*.wild.example.net"
    http:
      paths: [{path: /public, pathType: ImplementationSpecific, backend: {service: {name: reviews-v1, port: {number: 80}}}}]
`

// certGrant lets Gateways of edge use the Secrets of certs.
var certGrant = ingresstest.GrantYAML("certs", "to-edge", "edge", "Secret", "Gateway")

func start(work string) (*localmesh.Mesh, error) {
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	root := filepath.Join(wd, "..", "..")
	bin := filepath.Join(work, "bin")
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/controlplane", "./cmd/nodeproxy", "./cmd/waypoint", "./cmd/echo")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build binaries: %v\n%s", err, out)
	}
	cfg = filepath.Join(work, "config")
	policyDir := filepath.Join(work, "policies")
	for _, d := range []string{cfg, policyDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	ca, err := backendtlstest.NewCA("ingress suite")
	if err != nil {
		return nil, err
	}
	roots = x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM)
	var secrets []string
	for _, s := range []struct{ ns, name, dns string }{{"edge", "shop-cert", "shop.example.com"}, {"edge", "wild-cert", "*.example.com"}, {"certs", "cross-cert", "cross.example.org"},
		{"edge", "own-cert", "gateway.example.net"}, {"shop", "store-cert", "store.example.net"}} {
		doc, key, err := secretYAML(ca, s.ns, s.name, s.dns)
		if err != nil {
			return nil, err
		}
		secrets, keys = append(secrets, doc), append(keys, key)
	}
	files := map[string]string{
		filepath.Join(cfg, "mesh.yaml"):             readRewritten(filepath.Join(root, "examples/local/mesh.yaml")),
		filepath.Join(cfg, "edge.yaml"):             edgeYAML,
		filepath.Join(cfg, "kube.yaml"):             kubeYAML,
		filepath.Join(cfg, "secrets.yaml"):          strings.Join(secrets, "---\n"),
		filepath.Join(policyDir, "authz.rego"):      readRewritten(filepath.Join(root, "examples/local/policies/authz.rego")),
		filepath.Join(policyDir, "authz_test.rego"): readRewritten(filepath.Join(root, "examples/local/policies/authz_test.rego")),
	}
	for path, data := range files {
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return localmesh.StartDir(ctx, basePort, localmesh.Options{BinDir: bin, ConfigDir: cfg, PolicyDir: policyDir,
		StateDir: filepath.Join(work, "state"), ReadyTimeout: 60 * time.Second})
}

func readRewritten(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "" // the mesh then fails to start, naming what is missing
	}
	return rewrite.Replace(string(data))
}

// secretYAML is a kubernetes.io/tls Secret for dns and its key's PEM.
func secretYAML(ca *backendtlstest.CA, ns, name, dns string) (string, string, error) {
	data, err := ca.TLSData(dns)
	if err != nil {
		return "", "", err
	}
	return backendtlstest.SecretYAML(ns, name, data), string(data["tls.key"]), nil
}

// echoReply is the echo backend's answer.
type echoReply struct {
	Pod     string              `json:"pod"`
	Headers map[string][]string `json:"headers"`
}

type result struct {
	status int
	proto  string
	body   string
	echo   echoReply
	// served is the DNS name of the certificate the gateway presented.
	served string
}

// get GETs path from the gateway's port with host as Host and, for
// HTTPS, sni as the server name (the client verifies the certificate for
// it). An error is a connection or handshake that failed.
func get(port int, https bool, sni, host, path string) (result, error) {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", net.JoinHostPort(gatewayIP, fmt.Sprint(port)))
		},
		TLSClientConfig:   &tls.Config{ServerName: sni, RootCAs: roots},
		ForceAttemptHTTP2: true,
	}
	defer tr.CloseIdleConnections()
	scheme := "http"
	if https {
		scheme = "https"
	}
	req, err := http.NewRequest(http.MethodGet, scheme+"://"+host+path, nil)
	if err != nil {
		return result{}, err
	}
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return result{}, err
	}
	r := result{status: resp.StatusCode, proto: resp.Proto, body: string(body)}
	_ = json.Unmarshal(body, &r.echo)
	if resp.TLS != nil && len(resp.TLS.PeerCertificates) > 0 && len(resp.TLS.PeerCertificates[0].DNSNames) > 0 {
		r.served = resp.TLS.PeerCertificates[0].DNSNames[0]
	}
	return r, nil
}

func mustGet(t *testing.T, port int, https bool, sni, host, path string) result {
	t.Helper()
	r, err := get(port, https, sni, host, path)
	if err != nil {
		t.Fatalf("GET %s%s on %d (SNI %q): %v", host, path, port, sni, err)
	}
	return r
}

// HTTPS with SNI reaches a meshed workload through its waypoint, whose OPA
// policy decides with the gateway's identity as the caller: /public is
// allowed to anyone, the rest only to the frontend, so the gateway is
// denied there. The gateway never bypasses the waypoint.
func TestHTTPSThroughWaypointPolicy(t *testing.T) {
	r := mustGet(t, 23443, true, "shop.example.com", "shop.example.com", "/public/catalog")
	if r.status != 200 || r.echo.Pod != "reviews-v1" {
		t.Fatalf("allowed: %d %q", r.status, r.body)
	}
	if r.served != "shop.example.com" || r.proto != "HTTP/2.0" {
		t.Errorf("served certificate %q over %s, want shop.example.com over HTTP/2 (ALPN h2)", r.served, r.proto)
	}
	if got := r.echo.Headers["X-Causeway-Source-Principal"]; len(got) != 1 || got[0] != identity {
		t.Errorf("the destination saw principal %v, want the gateway's %s", got, identity)
	}
	r = mustGet(t, 23443, true, "shop.example.com", "shop.example.com", "/reviews")
	if r.status != 403 || !strings.Contains(r.body, "denied") {
		t.Fatalf("denied: %d %q", r.status, r.body)
	}
	waitLog(t, waypoint, `"identity":"`+identity+`"`, `"path":"/reviews"`, `"decision":"deny"`, `"status":403`)
	waitLog(t, waypoint, `"identity":"`+identity+`"`, `"path":"/public/catalog"`, `"decision":"allow"`, `"status":200`)
}

// The HTTP listener serves the same route.
func TestHTTPListener(t *testing.T) {
	r := mustGet(t, 23080, false, "", "anything.test", "/public/x")
	if r.status != 200 || r.echo.Pod != "reviews-v1" {
		t.Fatalf("%d %q", r.status, r.body)
	}
	if got := r.echo.Headers["X-Causeway-Source-Principal"]; len(got) != 1 || got[0] != identity {
		t.Errorf("principal %v", got)
	}
}

// A GRPCRoute attached to a listener (h2c) sends gRPC to the ratings
// Service through its waypoint, whose policy lets only the frontend call
// it: the gateway's call is denied there, with its identity as the caller.
// A method no rule matches gets no route.
func TestGRPCRouteThroughWaypoint(t *testing.T) {
	conn, err := grpc.NewClient(net.JoinHostPort(gatewayIP, "23081"), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority("grpc.example.com"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := new(wrapperspb.StringValue)
	err = conn.Invoke(ctx, "/shop.Ratings/Get", wrapperspb.String("book-1"), out)
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("gRPC call: %v, want PermissionDenied from the waypoint's policy", err)
	}
	waitLog(t, waypoint, `"identity":"`+identity+`"`, `"service":"shop/ratings"`, `"path":"/shop.Ratings/Get"`, `"decision":"deny"`)
	if err := conn.Invoke(ctx, "/shop.Other/Get", wrapperspb.String("x"), out); status.Code(err) != codes.Unimplemented {
		t.Fatalf("unrouted method: %v, want Unimplemented (404)", err)
	}
}

// Two HTTPS listeners share a port: each host gets its own listener's
// certificate and routes; a request for a host the other listener serves
// is misdirected on that connection; a server name no listener serves has
// no handshake.
func TestSNIListenerIsolation(t *testing.T) {
	r := mustGet(t, 23443, true, "api.example.com", "api.example.com", "/public/x")
	if r.status != 200 || r.echo.Pod != "reviews-v2" || r.served != "*.example.com" {
		t.Fatalf("api: %d %q, certificate %q", r.status, r.body, r.served)
	}
	r = mustGet(t, 23443, true, "shop.example.com", "api.example.com", "/public/x")
	if r.status != http.StatusMisdirectedRequest {
		t.Fatalf("Host of the other listener on the shop connection: %d %q", r.status, r.body)
	}
	if _, err := get(23443, true, "shop.example.org", "shop.example.org", "/public/x"); err == nil {
		t.Fatal("a server name no listener serves got a handshake")
	}
}

// A listener whose Secret does not exist is not served (its port stays
// closed); a Secret of another namespace serves once a ReferenceGrant
// there allows it, and stops when it is withdrawn, without restarting the
// gateway (its port opens and closes).
func TestListenersWithoutCertificates(t *testing.T) {
	if _, err := get(23444, true, "x.example.org", "x.example.org", "/public/x"); err == nil {
		t.Error("the listener without its Secret serves")
	}
	if _, err := get(23445, true, "cross.example.org", "cross.example.org", "/public/x"); err == nil {
		t.Fatal("the listener with another namespace's Secret serves without a ReferenceGrant")
	}
	if err := os.WriteFile(filepath.Join(cfg, "grant.yaml"), []byte(certGrant), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		r, err := get(23445, true, "cross.example.org", "cross.example.org", "/public/x")
		if err == nil {
			if r.status != 200 || r.echo.Pod != "reviews-v1" || r.served != "cross.example.org" {
				t.Fatalf("with the grant: %d %q, certificate %q", r.status, r.body, r.served)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with the grant the listener still does not serve: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The grant withdrawn, the listener's port closes.
	if err := os.Remove(filepath.Join(cfg, "grant.yaml")); err != nil {
		t.Fatal(err)
	}
	for deadline = time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(gatewayIP, "23445"), time.Second)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("without the grant the listener's port stays open")
		}
	}
}

// A Kubernetes Ingress is served by the Gateway its IngressClass names:
// paths by the Ingress spec's semantics (Exact; Prefix element-wise;
// ImplementationSpecific as Prefix), host wildcards, the defaultBackend
// for what no path matches, through the backends' waypoint, whose policy
// decides; a Service that does not exist gets 503 and a log line naming
// it; TLS by host with the Ingress's Secret, the Gateway's own
// certificate for other names.
func TestKubernetesIngress(t *testing.T) {
	for _, c := range []struct {
		host, path string
		status     int
		pod        string
	}{
		{"store.example.net", "/public/exact", 200, "reviews-v1"},
		{"store.example.net", "/public/exact/x", 200, "reviews-v2"}, // Exact only: the defaultBackend
		{"store.example.net", "/public/pre", 200, "reviews-v1"},
		{"store.example.net", "/public/pre/x", 200, "reviews-v1"},
		{"store.example.net", "/public/prefix", 200, "reviews-v2"}, // not /pre's: element-wise
		{"a.wild.example.net", "/public/x", 200, "reviews-v1"},
		{"a.b.wild.example.net", "/public", 200, "reviews-v1"},
		{"wild.example.net", "/public/x", 200, "reviews-v2"}, // the wildcard needs a label
		{"other.test", "/public/pre", 200, "reviews-v2"},     // another host: the defaultBackend
		{"store.example.net", "/reviews", 403, ""},           // the waypoint's policy denies the gateway
		{"store.example.net", "/public/gone", 503, ""},
	} {
		r := mustGet(t, 23082, false, "", c.host, c.path)
		if r.status != c.status || r.echo.Pod != c.pod {
			t.Errorf("GET %s%s = %d %q, want %d from %q", c.host, c.path, r.status, r.body, c.status, c.pod)
		}
	}
	waitLog(t, waypoint, `"identity":"`+identity+`"`, `"path":"/reviews"`, `"decision":"deny"`)
	waitLog(t, "ingress-edge-ingress-0", `"path":"/public/gone"`, `"status":503`, `service not found`)

	r := mustGet(t, 23446, true, "store.example.net", "store.example.net", "/public/pre/x")
	if r.status != 200 || r.echo.Pod != "reviews-v1" || r.served != "store.example.net" {
		t.Errorf("HTTPS store: %d %q, certificate %q", r.status, r.body, r.served)
	}
	if r = mustGet(t, 23446, true, "gateway.example.net", "other.test", "/public/x"); r.status != 200 || r.echo.Pod != "reviews-v2" || r.served != "gateway.example.net" {
		t.Errorf("HTTPS other host: %d %q, certificate %q", r.status, r.body, r.served)
	}
}

// The gateway's /config_dump and the control plane's /debug/config show
// the listeners and their Secrets, never a private key; nor do their logs.
func TestDumpsHaveNoKeys(t *testing.T) {
	var admin string
	for _, w := range mesh.Plan.Waypoints {
		if w.Ingress {
			admin = w.Admin
		}
	}
	for _, url := range []string{"http://" + admin + "/config_dump", "http://" + mesh.Plan.ControlPlane.Status + "/debug/config"} {
		body := fetch(t, url)
		if !strings.Contains(body, "edge/shop-cert") {
			t.Errorf("%s lacks the listeners: %.300s", url, body)
		}
		if leaked(body) {
			t.Errorf("%s holds a private key", url)
		}
	}
	for _, name := range []string{"ingress-edge-ingress-0", "controlplane"} {
		data, _ := os.ReadFile(mesh.LogPath(name))
		if leaked(string(data)) {
			t.Errorf("%s's log holds a private key", name)
		}
	}
}

// leaked: s holds one of the listeners' private keys, as PEM or base64.
func leaked(s string) bool {
	for _, k := range keys {
		block, _ := pem.Decode([]byte(k))
		for _, form := range []string{strings.Split(k, "\n")[1], base64.StdEncoding.EncodeToString([]byte(k))[:40], base64.StdEncoding.EncodeToString(block.Bytes)[:40]} {
			if strings.Contains(s, form) {
				return true
			}
		}
	}
	return false
}

func fetch(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%s: %d %v", url, resp.StatusCode, err)
	}
	return string(body)
}

func waitLog(t *testing.T, process string, fragments ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := mesh.WaitLog(ctx, process, fragments...); err != nil {
		t.Fatal(err)
	}
}
