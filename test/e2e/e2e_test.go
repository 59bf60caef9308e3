// Package e2e runs the real binaries as `meshctl up` does, on loopback
// addresses of their own, and checks every traffic path of docs/design.md §5 with
// real clients.
package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/causeway-mesh/causeway/pkg/hbone"
	"github.com/causeway-mesh/causeway/pkg/localmesh"
	"github.com/causeway-mesh/causeway/pkg/trust"
)

// The suite's mesh is the sample of examples/local moved to addresses of
// its own (so it can run beside `make demo`), plus testdata/*.yaml.
var rewrite = strings.NewReplacer("127.0.110.", "127.0.140.", "127.0.10.", "127.0.40.", "127.0.20.", "127.0.50.")

const basePort = 17100

var (
	mesh      *localmesh.Mesh
	policyDir string
	repoRoot  string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	work, err := os.MkdirTemp("", "causeway-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	keep := os.Getenv("E2E_KEEP") != ""
	if !keep {
		defer os.RemoveAll(work)
	}
	if mesh, err = startMesh(work); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: start mesh: %v\n", err)
		return 1
	}
	code := m.Run()
	select {
	case died := <-mesh.Died:
		fmt.Fprintf(os.Stderr, "e2e: a mesh process died during the suite: %s\n", died)
		code = 1
	default:
	}
	mesh.Stop()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "e2e: logs kept in %s\n", work)
		keep = true
	}
	if keep {
		os.Exit(code) // skip the deferred removal
	}
	return code
}

func startMesh(work string) (*localmesh.Mesh, error) {
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	repoRoot = filepath.Join(wd, "..", "..")
	bin := filepath.Join(work, "bin")
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/controlplane", "./cmd/nodeproxy", "./cmd/waypoint", "./cmd/echo")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build binaries: %v\n%s", err, out)
	}
	cfg := filepath.Join(work, "config")
	policyDir = filepath.Join(work, "policies")
	for _, d := range []string{cfg, policyDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	copies := map[string]string{
		filepath.Join(repoRoot, "examples/local/mesh.yaml"):                filepath.Join(cfg, "mesh.yaml"),
		filepath.Join(wd, "testdata/direct.yaml"):                          filepath.Join(cfg, "direct.yaml"),
		filepath.Join(wd, "testdata/crossns.yaml"):                         filepath.Join(cfg, "crossns.yaml"),
		filepath.Join(wd, "testdata/consumer.yaml"):                        filepath.Join(cfg, "consumer.yaml"),
		filepath.Join(wd, "testdata/frontend.yaml"):                        filepath.Join(cfg, "frontend.yaml"),
		filepath.Join(repoRoot, "examples/local/policies/authz.rego"):      filepath.Join(policyDir, "authz.rego"),
		filepath.Join(repoRoot, "examples/local/policies/authz_test.rego"): filepath.Join(policyDir, "authz_test.rego"),
	}
	for from, to := range copies {
		data, err := os.ReadFile(from)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(to, []byte(rewrite.Replace(string(data))), 0o644); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return localmesh.StartDir(ctx, basePort, localmesh.Options{BinDir: bin, ConfigDir: cfg, PolicyDir: policyDir,
		StateDir: filepath.Join(work, "state"), ReadyTimeout: 60 * time.Second})
}

// echoReply is the echo backend's JSON answer.
type echoReply struct {
	Protocol string              `json:"protocol"`
	Method   string              `json:"method"`
	Path     string              `json:"path"`
	Pod      string              `json:"pod"`
	Headers  map[string][]string `json:"headers"`
}

type response struct {
	status int
	body   string
	header http.Header
	echo   *echoReply
}

func do(t *testing.T, pod string, h2c bool, method, url string, hdr map[string]string) response {
	t.Helper()
	c, err := mesh.Plan.Client(pod)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(method, url, strings.NewReader("payload"))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.HTTP(h2c).Do(req)
	if err != nil {
		t.Fatalf("%s %s %s: %v", pod, method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		t.Fatalf("%s %s %s: read body: %v", pod, method, url, err)
	}
	r := response{status: resp.StatusCode, body: string(body), header: resp.Header}
	var e echoReply
	if json.Unmarshal(body, &e) == nil && e.Pod != "" {
		r.echo = &e
	}
	return r
}

func podIP(t *testing.T, ref string) string {
	t.Helper()
	p, err := mesh.Plan.Pod(ref)
	if err != nil {
		t.Fatal(err)
	}
	return p.IP
}

func TestDirectPath(t *testing.T) {
	r := do(t, "web/frontend", false, http.MethodGet, "http://echo.direct/hello", nil)
	if r.status != 200 || r.echo == nil || r.echo.Pod != "echo" {
		t.Fatalf("direct service: %d %s", r.status, r.body)
	}
	// No waypoint: the request is not rewritten by one.
	if _, ok := r.echo.Headers["X-Causeway-Source-Principal"]; ok {
		t.Fatalf("direct path went through a waypoint: %v", r.echo.Headers)
	}
	waitLog(t, "nodeproxy-node-b", `"direction":"inbound"`, `"src_identity":"spiffe://cluster.local/ns/web/sa/frontend"`, `"dst_workload":"direct/echo"`)
}

// A consumer route (testdata/consumer.yaml) reaches shop's waypoint and
// applies to callers from its namespace only (conformance MeshConsumerRoute).
func TestConsumerRoute(t *testing.T) {
	r := do(t, "direct/echo", false, http.MethodGet, "http://reviews.shop/public/item", nil)
	if r.status != 200 || r.echo == nil || !strings.HasPrefix(r.echo.Pod, "reviews") || r.header.Get("X-Header-Set") != "set" {
		t.Fatalf("from the consumer route's namespace: %d %v %s", r.status, r.header, r.body)
	}
	r = do(t, "web/frontend", false, http.MethodGet, "http://reviews.shop/public/item", nil)
	if r.status != 200 || r.echo == nil || r.header.Get("X-Header-Set") != "" {
		t.Fatalf("from another namespace: %d %v %s", r.status, r.header, r.body)
	}
	waitLog(t, "waypoint-shop-waypoint-0", `"source":"`+podIP(t, "direct/echo")+`:`, `"route":"direct/reviews-add-header"`, `"status":200`)
}

// waypoint-for: service (testdata/frontend.yaml, conformance MeshFrontend):
// a route applies to the Service's frontend only; traffic addressed to the
// pod IP is not bound to the waypoint and is admitted by the pod directly.
func TestServiceWaypointLeavesPodIPTraffic(t *testing.T) {
	r := do(t, "web/frontend", false, http.MethodGet, "http://echo-v2.gamma/", nil)
	if r.status != 200 || r.echo == nil || r.echo.Pod != "echo-v2" || r.header.Get("X-Header-Set") != "set" {
		t.Fatalf("to the service: %d %v %s", r.status, r.header, r.body)
	}
	r = do(t, "web/frontend", false, http.MethodGet, "http://"+podIP(t, "gamma/echo-v2")+":8080/", nil)
	if r.status != 200 || r.echo == nil || r.echo.Pod != "echo-v2" || r.header.Get("X-Header-Set") != "" {
		t.Fatalf("to the pod IP: %d %v %s", r.status, r.header, r.body)
	}
	if _, ok := r.echo.Headers["X-Causeway-Source-Principal"]; ok {
		t.Fatalf("pod-IP traffic went through the waypoint: %v", r.echo.Headers)
	}
}

func TestWaypointRoutesSplitAndHeaderMatch(t *testing.T) {
	count := map[string]int{}
	const n = 100
	for range n {
		r := do(t, "web/frontend", false, http.MethodGet, "http://reviews.shop/", nil)
		if r.status != 200 || r.echo == nil {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		if r.header.Get("x-routed-by") != "causeway-waypoint" {
			t.Fatalf("response lacks the route's ResponseHeaderModifier header: %v", r.header)
		}
		count[r.echo.Pod]++
	}
	// 80/20 over 100 requests; the bounds are wide enough for any fair split.
	if count["reviews-v1"]+count["reviews-v2"] != n || count["reviews-v2"] < 5 || count["reviews-v2"] > 40 {
		t.Fatalf("split = %v, want about 80/20", count)
	}
	r := do(t, "web/frontend", false, http.MethodGet, "http://reviews.shop/", map[string]string{"x-version": "v2"})
	if r.echo == nil || r.echo.Pod != "reviews-v2" {
		t.Fatalf("header match: %d %s", r.status, r.body)
	}
	// The destination learns the caller's identity from the waypoint only.
	if got := r.echo.Headers["X-Causeway-Source-Principal"]; len(got) != 1 || got[0] != "spiffe://cluster.local/ns/web/sa/frontend" {
		t.Fatalf("source principal header = %v", got)
	}
}

// A route of shop sends /direct to a Service of namespace direct (granted
// by a ReferenceGrant there): the shop waypoint routes to its pod, which it
// reaches with its own identity.
func TestRouteToAnotherNamespace(t *testing.T) {
	r := do(t, "web/frontend", false, http.MethodGet, "http://reviews.shop/direct/item", nil)
	if r.status != 200 || r.echo == nil || r.echo.Pod != "echo" || r.echo.Path != "/direct/item" {
		t.Fatalf("GET reviews.shop/direct/item: %d %s", r.status, r.body)
	}
	if got := r.echo.Headers["X-Causeway-Source-Principal"]; len(got) != 1 || got[0] != "spiffe://cluster.local/ns/web/sa/frontend" {
		t.Fatalf("the request did not come through the shop waypoint: %v", r.echo.Headers)
	}
	// The tunnel came from the frontend pod's own IP (its node proxy dials
	// from it), so that is the source the waypoint logs and policies see.
	waitLog(t, "waypoint-shop-waypoint-0", `"source":"`+podIP(t, "web/frontend")+`:`, `"path":"/direct/item"`,
		`"route":"shop/reviews-to-direct"`, `"backend":"direct/echo:80"`, `"status":200`)
}

func TestHTTP2AndGRPCThroughWaypoint(t *testing.T) {
	r := do(t, "web/frontend", true, http.MethodGet, "http://reviews.shop/h2", map[string]string{"x-version": "v2"})
	if r.status != 200 || r.echo == nil || r.echo.Pod != "reviews-v2" {
		t.Fatalf("h2c: %d %s", r.status, r.body)
	}
	c, err := mesh.Plan.Client("web/frontend")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := c.GRPC("ratings.shop:9090")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out := new(wrapperspb.StringValue)
	if err := conn.Invoke(ctx, "/shop.Ratings/Get", wrapperspb.String("book-1"), out); err != nil {
		t.Fatal(err)
	}
	var e echoReply
	if err := json.Unmarshal([]byte(out.GetValue()), &e); err != nil || e.Pod != "ratings" || e.Path != "/shop.Ratings/Get" {
		t.Fatalf("gRPC answer %q", out.GetValue())
	}
	// A method no GRPCRoute matches gets no route.
	if err := conn.Invoke(ctx, "/shop.Other/Get", wrapperspb.String("x"), out); err == nil {
		t.Fatal("unrouted gRPC method succeeded")
	}
}

func TestPolicyAllowAndDeny(t *testing.T) {
	r := do(t, "web/frontend", false, http.MethodPost, "http://reviews.shop/reviews", nil)
	if r.status != 403 || !strings.Contains(r.body, "only the admin identity may write") {
		t.Fatalf("frontend POST: %d %q", r.status, r.body)
	}
	if r := do(t, "web/admin", false, http.MethodPost, "http://reviews.shop/reviews", nil); r.status != 200 {
		t.Fatalf("admin POST: %d %s", r.status, r.body)
	}
	waitLog(t, "waypoint-shop-waypoint-0", `"identity":"spiffe://cluster.local/ns/web/sa/frontend"`, `"decision":"deny"`, `"status":403`)
	// By default the decision log records denials, with their input.
	waitLog(t, "waypoint-shop-waypoint-0", `"msg":"decision"`, `"allowed":false`, `"source_principal":"spiffe://cluster.local/ns/web/sa/frontend"`)
}

// A client outside the mesh hairpins through the waypoint with no
// identity; headers claiming one change nothing.
func TestHairpinIsUnauthenticated(t *testing.T) {
	url := "http://" + podIP(t, "shop/reviews-v1") + ":8080"
	claims := map[string]string{
		"x-forwarded-client-cert":     "By=spiffe://cluster.local/ns/shop/sa/reviews;URI=spiffe://cluster.local/ns/web/sa/admin",
		"forwarded":                   `for="127.0.40.3:5000"`,
		"x-causeway-source-principal": "spiffe://cluster.local/ns/web/sa/admin",
		"baggage":                     "k8s.sa=admin",
	}
	r := do(t, "outside/outsider", false, http.MethodPost, url+"/reviews", claims)
	if r.status != 403 || !strings.Contains(r.body, "unauthenticated") {
		t.Fatalf("outsider POST with identity claims: %d %q", r.status, r.body)
	}
	r = do(t, "outside/outsider", false, http.MethodGet, url+"/public/catalog", claims)
	if r.status != 200 || r.echo == nil {
		t.Fatalf("outsider GET /public: %d %q", r.status, r.body)
	}
	if got := r.echo.Headers["X-Causeway-Source-Principal"]; len(got) != 0 {
		t.Fatalf("an unauthenticated caller reached the destination with principal %v", got)
	}
	if got := r.echo.Headers["X-Forwarded-Client-Cert"]; len(got) != 0 {
		t.Fatalf("client-sent x-forwarded-client-cert reached the destination: %v", got)
	}
}

// Traffic to a waypoint-bound pod cannot skip the waypoint: a mesh client
// addressing the pod IP goes through it, and a tunnel straight to the pod's
// node proxy with a valid workload certificate is refused.
func TestWaypointCannotBeBypassed(t *testing.T) {
	ip := podIP(t, "shop/reviews-v1")
	r := do(t, "web/frontend", false, http.MethodPost, "http://"+ip+":8080/reviews", nil)
	if r.status != 403 {
		t.Fatalf("frontend POST to the pod IP: %d %q; want the waypoint's 403", r.status, r.body)
	}
	ca, err := trust.LoadCA(filepath.Join(mesh.Opts.StateDir, "ca"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := trust.NewBundle(trust.DefaultTrustDomain, ca.Roots())
	if err != nil {
		t.Fatal(err)
	}
	frontend, _ := trust.ParseIdentity("spiffe://cluster.local/ns/web/sa/frontend")
	key, csrPEM, err := trust.NewKeyAndCSR(frontend)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := trust.ParseCSR(csrPEM)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := ca.Sign(csr, frontend, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := trust.TLSCertificate(chain, key)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := hbone.NewPool(hbone.PoolOptions{Bundle: bundle})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	reviews, _ := trust.ParseIdentity("spiffe://cluster.local/ns/shop/sa/reviews")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := pool.Dial(ctx, hbone.Target{Address: netip.MustParseAddrPort(ip + ":15008"), Authority: ip + ":8080",
		Source: frontend, Cert: func() (*tls.Certificate, error) { return cert, nil }, Expected: []trust.Identity{reviews}})
	if err == nil {
		c.Close()
		t.Fatal("a direct tunnel to a waypoint-bound pod was accepted")
	}
	if !strings.Contains(err.Error(), "401") {
		t.Fatalf("direct tunnel refused with %v, want 401", err)
	}
	waitLog(t, "nodeproxy-node-a", "only accepts traffic through its waypoint")
}

func TestCurlThroughSOCKS5(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl not installed")
	}
	pod, err := mesh.Plan.Pod("web/frontend")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("curl", "-sS", "-m", "20", "--interface", pod.IP, "--socks5-hostname", pod.SOCKS5,
		"-H", "x-version: v2", "http://reviews.shop/curl").CombinedOutput()
	if err != nil {
		t.Fatalf("curl: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), `"pod": "reviews-v2"`) {
		t.Fatalf("curl answer:\n%s", out)
	}
}

func TestConfigDump(t *testing.T) {
	node := mesh.Plan.Nodes[0]
	resp, err := http.Get("http://" + node.Admin + "/config_dump")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var d struct {
		ByAddr       map[string]json.RawMessage `json:"by_addr"`
		ByVIP        map[string]json.RawMessage `json:"by_vip"`
		Certificates []struct {
			Identity  string            `json:"identity"`
			State     string            `json:"state"`
			CertChain []json.RawMessage `json:"cert_chain"`
		} `json:"certificates"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		t.Fatal(err)
	}
	if _, ok := d.ByAddr[podIP(t, "web/frontend")]; !ok {
		t.Fatalf("by_addr lacks the frontend: %v", keys(d.ByAddr))
	}
	if _, ok := d.ByVIP["127.0.50.1"]; !ok {
		t.Fatalf("by_vip lacks reviews: %v", keys(d.ByVIP))
	}
	ids := map[string]string{}
	for _, c := range d.Certificates {
		ids[c.Identity] = c.State
		if c.State == "Available" && len(c.CertChain) < 3 {
			t.Errorf("%s: chain of %d elements, want leaf, intermediate and root", c.Identity, len(c.CertChain))
		}
	}
	for _, id := range []string{"spiffe://cluster.local/ns/web/sa/frontend", "spiffe://cluster.local/ns/shop/sa/reviews"} {
		if ids[id] != "Available" {
			t.Errorf("certificate %s: %q", id, ids[id])
		}
	}
	if len(ids) != 2 {
		t.Errorf("node-a holds certificates for %v; want exactly its workloads' identities", ids)
	}
}

// A policy edited while traffic flows: the new decision applies and no
// request fails meanwhile.
func TestPolicyEditUnderTraffic(t *testing.T) {
	before := do(t, "web/frontend", false, http.MethodPost, "http://reviews.shop/feedback", nil)
	if before.status != 403 {
		t.Fatalf("frontend POST /feedback before the edit: %d", before.status)
	}
	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		requests atomic.Int64
		failures = make(chan string, 100)
	)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, _ := mesh.Plan.Client("web/admin")
			for !stop.Load() {
				resp, err := c.HTTP(false).Get("http://reviews.shop/reviews")
				requests.Add(1)
				if err != nil {
					failures <- err.Error()
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					failures <- resp.Status
				}
			}
		}()
	}
	path := filepath.Join(policyDir, "authz.rego")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Put the policy back so the suite can run again (-count) on this mesh.
	t.Cleanup(func() {
		if err := replaceFile(path, data); err != nil {
			t.Error(err)
			return
		}
		deadline := time.Now().Add(30 * time.Second)
		for do(t, "web/frontend", false, http.MethodPost, "http://reviews.shop/feedback", nil).status != 403 {
			if time.Now().After(deadline) {
				t.Error("the restored policy never applied")
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	edit := string(data) + `
# Added by the end-to-end suite while traffic flows.
allowed_by contains "frontend-feedback" if {
	principal == frontend
	method == "POST"
	input.parsed_path[0] == "feedback"
}
`
	if err := replaceFile(path, []byte(edit)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := do(t, "web/frontend", false, http.MethodPost, "http://reviews.shop/feedback", nil)
		if r.status == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the edited policy never applied: %d %s", r.status, r.body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // a little traffic on the new policy too
	stop.Store(true)
	wg.Wait()
	close(failures)
	for f := range failures {
		t.Errorf("request failed during the policy change: %s", f)
	}
	t.Logf("%d requests during the change", requests.Load())
}

// waitLog waits until a process's log has a line containing every fragment.
func waitLog(t *testing.T, process string, fragments ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := mesh.WaitLog(ctx, process, fragments...); err != nil {
		t.Fatal(err)
	}
}

func keys(m map[string]json.RawMessage) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// A mesh client reaches a server outside the mesh over plain TCP (§5.4).
func TestPlainTCPToServerOutsideMesh(t *testing.T) {
	for _, url := range []string{"http://legacy.outside/x", "http://" + podIP(t, "outside/legacy") + ":8080/x"} {
		r := do(t, "web/frontend", false, http.MethodGet, url, nil)
		if r.status != 200 || r.echo == nil || r.echo.Pod != "legacy" {
			t.Fatalf("%s: %d %s", url, r.status, r.body)
		}
	}
	waitLog(t, "nodeproxy-node-a", `"dst_workload":"outside/legacy"`, `"hop":"tcp `)
}

// With the control plane down, proxies keep serving new connections on the
// last configuration and certificates. It stops the control plane, so it
// runs last.
func TestZZControlPlaneDown(t *testing.T) {
	if err := mesh.StopProcess("controlplane"); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if r := do(t, "web/frontend", false, http.MethodGet, "http://reviews.shop/", nil); r.status != 200 {
			t.Fatalf("via waypoint with the control plane down: %d %s", r.status, r.body)
		}
		if r := do(t, "web/frontend", false, http.MethodGet, "http://echo.direct/", nil); r.status != 200 {
			t.Fatalf("direct with the control plane down: %d %s", r.status, r.body)
		}
	}
}

// replaceFile swaps path's content in one rename, as an editor or git-sync would.
func replaceFile(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
