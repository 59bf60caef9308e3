package waypoint

import (
	"context"
	"maps"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/causeway-mesh/causeway/pkg/hbone"
	"github.com/causeway-mesh/causeway/pkg/internal/metricstest"
	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
	"github.com/causeway-mesh/causeway/pkg/telemetry"
	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// The standard metrics' labels on real tunnels: the caller's come from its
// authenticated identity, and from the workload at its address only when
// that workload holds the same identity.

const (
	frontendIP = "127.0.178.1" // web/frontend's pod
	impostorIP = "127.0.178.2" // a pod of web whose identity is not the frontend's
	unindexed  = "127.0.178.3" // a pod of web the waypoint may not read
	reviewsVIP = "127.0.78.1"
	rpcVIP     = "127.0.78.2"
)

// telemetryFixture is a waypoint in front of an HTTP service (shop/reviews)
// and a gRPC one (shop/rpc, a real gRPC health server), with the frontend's
// and another web workload's pods in its index; the policy allows only the
// frontend.
func telemetryFixture(t *testing.T) (*fixture, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	f := start(t, func(o *Options) {
		o.Registry = reg
		o.Policy = policyEngine(t, "package envoy.authz\n\ndefault allow := false\n\nallow if input.attributes.source.principal == \""+frontend+"\"\n")
	})
	httpBackend := serveHTTP(t, "127.0.177.1:0", nil, nil)
	ln := testnet.Listen(t, "127.0.177.1:0")
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	grpcBackend := netip.MustParseAddrPort(ln.Addr().String())

	wp := &meshv1.Ref{Namespace: "shop", Name: "wp"}
	ep := func(port uint16) []*meshv1.Endpoint {
		return []*meshv1.Endpoint{{WorkloadUid: "shop/reviews-1", Address: "127.0.177.1", Ports: map[uint32]uint32{80: uint32(port)}}}
	}
	f.w.Update(&xds.State{Set: meshv1.Set{
		Workloads: map[string]*meshv1.Workload{
			"shop/reviews-1": {Uid: "shop/reviews-1", Name: "reviews-v2-5d8f-x1", Namespace: "shop", Identity: "spiffe://cluster.local/ns/shop/sa/reviews",
				Addresses: []string{"127.0.177.1"}, WorkloadName: "reviews-v2", CanonicalService: "reviews", CanonicalRevision: "v2", App: "reviews", Version: "v2"},
			"web/frontend-1": {Uid: "web/frontend-1", Name: "frontend-7c9-abc", Namespace: "web", Identity: frontend,
				Addresses: []string{frontendIP}, WorkloadName: "frontend", CanonicalService: "frontend", CanonicalRevision: "latest", App: "frontend"},
			"web/other-1": {Uid: "web/other-1", Name: "other-1", Namespace: "web", Identity: "spiffe://cluster.local/ns/web/sa/other",
				Addresses: []string{impostorIP}, WorkloadName: "other", CanonicalService: "other", CanonicalRevision: "latest"},
		},
		Services: map[string]*meshv1.Service{
			"shop/reviews": {Name: "reviews", Namespace: "shop", Hostname: "reviews.shop.svc.cluster.local", Vips: []string{reviewsVIP}, Waypoint: wp,
				Ports: []*meshv1.ServicePort{{Port: 80, AppProtocol: "http"}}, Endpoints: ep(httpBackend.Port())},
			"shop/rpc": {Name: "rpc", Namespace: "shop", Hostname: "rpc.shop.svc.cluster.local", Vips: []string{rpcVIP}, Waypoint: wp,
				Ports: []*meshv1.ServicePort{{Port: 80, AppProtocol: "grpc"}}, Endpoints: ep(grpcBackend.Port())},
		},
	}})
	return f, reg
}

// tunnelFrom opens a tunnel to authority from the address from, as
// identity source (empty: TLS-only), on a pool of its own (a pooled
// connection from another address is not reused).
func (f *fixture) tunnelFrom(t *testing.T, from, source, authority string) net.Conn {
	t.Helper()
	return f.tunnelWithBaggage(t, from, source, authority, "")
}

// tunnelWithBaggage is tunnelFrom with baggage on the CONNECT, as a node
// proxy sends its caller's names.
func (f *fixture) tunnelWithBaggage(t *testing.T, from, source, authority, baggage string) net.Conn {
	t.Helper()
	pool, err := hbone.NewPool(hbone.PoolOptions{Bundle: f.ca.Bundle})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	target := f.target(t, source, authority)
	target.LocalAddr, target.Baggage = netip.MustParseAddr(from), baggage
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pool.Dial(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// standardLabels is the full label set of a request to shop/reviews
// answered by reviews-v2, with the source's and the varying labels
// changed.
func standardLabels(source map[string]string, changes map[string]string) map[string]string {
	l := map[string]string{
		"reporter":                       "waypoint",
		"destination_workload":           "reviews-v2",
		"destination_workload_namespace": "shop",
		"destination_principal":          "spiffe://cluster.local/ns/shop/sa/reviews",
		"destination_app":                "reviews",
		"destination_version":            "v2",
		"destination_canonical_service":  "reviews",
		"destination_canonical_revision": "v2",
		"destination_cluster":            "Kubernetes",
		"destination_service":            "reviews.shop.svc.cluster.local",
		"destination_service_name":       "reviews",
		"destination_service_namespace":  "shop",
		"request_protocol":               "http",
		"response_code":                  "200",
		"grpc_response_status":           "",
		"response_flags":                 "-",
		"connection_security_policy":     "mutual_tls",
	}
	maps.Copy(l, source)
	maps.Copy(l, changes)
	return l
}

func unknownSource() map[string]string {
	l := map[string]string{}
	for _, k := range []string{"workload", "workload_namespace", "principal", "app", "version", "canonical_service", "canonical_revision", "cluster"} {
		l["source_"+k] = "unknown"
	}
	return l
}

var frontendSource = map[string]string{
	"source_workload":           "frontend",
	"source_workload_namespace": "web",
	"source_principal":          frontend,
	"source_app":                "frontend",
	"source_version":            "latest", // no version label: the canonical revision
	"source_canonical_service":  "frontend",
	"source_canonical_revision": "latest",
	"source_cluster":            "Kubernetes",
}

func TestStandardMetricsLabels(t *testing.T) {
	f, reg := telemetryFixture(t)
	claims := "X-Forwarded-Client-Cert: URI=" + frontend + "\r\nX-Causeway-Source-Principal: " + frontend + "\r\nForwarded: for=\"" + frontendIP + ":1\"\r\n"

	// The frontend, from its own pod: named by the index.
	if code, body := get(t, f.tunnelFrom(t, frontendIP, frontend, reviewsVIP+":80"), ""); code != 200 {
		t.Fatalf("frontend: %d %s", code, body)
	}
	// The frontend's identity from the address of a pod of another
	// identity: the index's entry may not be believed, nor the identity
	// be given that pod's names.
	if code, body := get(t, f.tunnelFrom(t, impostorIP, frontend, reviewsVIP+":80"), ""); code != 200 {
		t.Fatalf("frontend from another pod's address: %d %s", code, body)
	}
	// A TLS-only tunnel from the frontend's own address, claiming it in
	// every header: nobody authenticated, so nobody is named (and the
	// policy denies it).
	if code, body := get(t, f.tunnelFrom(t, frontendIP, "", reviewsVIP+":80"), claims); code != 403 {
		t.Fatalf("TLS-only tunnel: %d %s", code, body)
	}

	want := map[string]float64{
		metricstest.Labels(standardLabels(frontendSource, nil)):  1,
		metricstest.Labels(standardLabels(unknownSource(), nil)): 1,
		// Denied before any endpoint was chosen: the destination workload
		// is unknown, the service known.
		metricstest.Labels(standardLabels(unknownSource(), map[string]string{
			"destination_workload": "unknown", "destination_workload_namespace": "unknown", "destination_principal": "unknown",
			"destination_app": "unknown", "destination_version": "unknown", "destination_canonical_service": "unknown",
			"destination_canonical_revision": "unknown", "destination_cluster": "unknown",
			"response_code": "403", "response_flags": "UAEX", "connection_security_policy": "none"})): 1,
	}
	for _, name := range []string{"istio_requests_total", "istio_request_duration_milliseconds", "istio_request_bytes", "istio_response_bytes"} {
		got := metricstest.All(t, reg, name)
		if !maps.Equal(got, want) {
			t.Errorf("%s:\n got %v\nwant %v", name, got, want)
		}
	}
}

// A gRPC request's status comes from the upstream's trailers; its
// protocol is grpc.
func TestStandardMetricsGRPCStatus(t *testing.T) {
	f, reg := telemetryFixture(t)
	conn, err := grpc.NewClient("passthrough:///rpc", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) {
			return f.tunnelFrom(t, frontendIP, frontend, rpcVIP+":80"), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := healthpb.NewHealthClient(conn)
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("health check: %v", err)
	}
	// An unknown service: NOT_FOUND (5), in a 200 response's trailers.
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: "no.such.Service"}); err == nil || !strings.Contains(err.Error(), "NotFound") {
		t.Fatalf("health check of an unknown service: %v, want NotFound", err)
	}
	rpc := map[string]string{"request_protocol": "grpc", "destination_service": "rpc.shop.svc.cluster.local", "destination_service_name": "rpc"}
	ok, notFound := standardLabels(frontendSource, rpc), standardLabels(frontendSource, rpc)
	ok["grpc_response_status"], notFound["grpc_response_status"] = "0", "5"
	want := map[string]float64{metricstest.Labels(ok): 1, metricstest.Labels(notFound): 1}
	if got := metricstest.All(t, reg, "istio_requests_total"); !maps.Equal(got, want) {
		t.Errorf("istio_requests_total:\n got %v\nwant %v", got, want)
	}
}

// A caller from a namespace the waypoint may not read is named by its
// node proxy's baggage on the CONNECT: only on an authenticated tunnel,
// only within its identity's namespace, only when well-formed; never by a
// request's own baggage.
func TestStandardMetricsCallerBaggage(t *testing.T) {
	f, reg := telemetryFixture(t)
	frontendPod := &meshv1.Workload{Namespace: "web", WorkloadName: "frontend", WorkloadType: "deployment",
		CanonicalService: "frontend", CanonicalRevision: "v1", App: "frontend-app", Version: "v1.2"}
	baggage := telemetry.Baggage(frontendPod)
	inner := "Baggage: " + baggage + "\r\n" // what the application itself sends
	for _, c := range []struct {
		name, source, baggage, header string
		code                          int
	}{
		{"its node proxy's baggage", frontend, baggage, "", 200},
		{"baggage of another namespace", frontend, strings.Replace(baggage, "=web,", "=shop,", 1), "", 200},
		{"a TLS-only tunnel with the frontend's baggage", "", baggage, inner, 403},
		{"no CONNECT baggage, the request's own", frontend, "", inner, 200},
		{"malformed baggage: two namespaces", frontend, baggage + ",k8s.namespace.name=web", "", 200},
		{"oversized baggage", frontend, baggage + ",x=" + strings.Repeat("a", telemetry.MaxBaggageBytes), "", 200},
	} {
		if code, body := get(t, f.tunnelWithBaggage(t, unindexed, c.source, reviewsVIP+":80", c.baggage), c.header); code != c.code {
			t.Fatalf("%s: %d %s", c.name, code, body)
		}
	}

	named := map[string]string{
		"source_workload":           "frontend",
		"source_workload_namespace": "web",
		"source_principal":          frontend,
		"source_app":                "frontend-app",
		"source_version":            "v1.2",
		"source_canonical_service":  "frontend",
		"source_canonical_revision": "v1",
		"source_cluster":            "Kubernetes",
	}
	principalOnly := unknownSource()
	principalOnly["source_principal"], principalOnly["source_workload_namespace"] = frontend, "web"
	want := map[string]float64{
		metricstest.Labels(standardLabels(named, nil)): 1,
		// Another namespace's, the request's own, the malformed and the
		// oversized baggage: the identity alone.
		metricstest.Labels(standardLabels(principalOnly, nil)): 4,
		metricstest.Labels(standardLabels(unknownSource(), map[string]string{
			"destination_workload": "unknown", "destination_workload_namespace": "unknown", "destination_principal": "unknown",
			"destination_app": "unknown", "destination_version": "unknown", "destination_canonical_service": "unknown",
			"destination_canonical_revision": "unknown", "destination_cluster": "unknown",
			"response_code": "403", "response_flags": "UAEX", "connection_security_policy": "none"})): 1,
	}
	if got := metricstest.All(t, reg, "istio_requests_total"); !maps.Equal(got, want) {
		t.Errorf("istio_requests_total:\n got %v\nwant %v", got, want)
	}
	ignored := map[string]float64{"namespace_mismatch": 1, "unauthenticated": 1, "malformed": 2}
	if got := metricstest.ByLabel(t, reg, "hbone_baggage_ignored_total", "reason"); !maps.Equal(got, ignored) {
		t.Errorf("hbone_baggage_ignored_total: %v, want %v", got, ignored)
	}
}
