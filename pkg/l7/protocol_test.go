package l7

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

func TestHTTP2(t *testing.T) {
	h := newHarness(t)
	h.addService("web", "http")
	h.backend("h1", "http", false)
	h.backend("h2", "http2", true)
	h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch, to("h1", prefixM("/h1")), to("h2", prefixM("/h2")))}, nil)

	// An "http" port: HTTP/1.1, or HTTP/2 when the client opens with the preface.
	addr := h.front(webInfo(trust.Unauthenticated()))
	for _, tc := range []struct {
		name       string
		client     *http.Client
		path       string
		wantUpProt string
	}{
		{"h1 to h1", h1Client(addr), "/h1", "HTTP/1.1"},
		{"h2c to h1", h2cClient(addr), "/h1", "HTTP/1.1"},
		{"h1 to h2", h1Client(addr), "/h2", "HTTP/2.0"},
		{"h2c to h2", h2cClient(addr), "/h2", "HTTP/2.0"},
	} {
		res := do(t, tc.client, "POST", tc.path, []byte("body-"+tc.name), nil)
		if res.status != 200 || res.echo.Proto != tc.wantUpProt || res.echo.Body != "body-"+tc.name {
			t.Errorf("%s: %d proto %q body %q", tc.name, res.status, res.echo.Proto, res.echo.Body)
		}
	}

	// An "http2" port takes HTTP/2 with prior knowledge only.
	info := webInfo(trust.Unauthenticated())
	info.Protocol = ProtocolHTTP2
	addr2 := h.front(info)
	if res := get(t, h2cClient(addr2), "/h2", nil); res.status != 200 || res.echo.Proto != "HTTP/2.0" {
		t.Errorf("prior knowledge h2c: %d %q", res.status, res.echo.Proto)
	}
	if _, err := h1Client(addr2).Get("http://web/h2"); err == nil {
		t.Error("HTTP/1.1 on an http2 port was served")
	}

	// Many concurrent streams share one client connection and are all answered.
	c := h2cClient(addr)
	errs := make(chan error, 50)
	for i := 0; i < 50; i++ {
		go func(i int) {
			resp, err := c.Get(fmt.Sprintf("http://web/h2/%d", i))
			if err != nil {
				errs <- err
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
			errs <- err
		}(i)
	}
	for i := 0; i < 50; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// HTTP/2 upstream: all of it multiplexed over one tunnel.
	if n := h.dialer.count(h.backends["h2"].addr); n != 1 {
		t.Errorf("h2 backend dialed %d times, want 1", n)
	}
}

func TestHeaderLimits(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.MaxHeaderBytes = 4 << 10 })
	h.backend("web", "http", false)
	h.update(nil, nil)
	addr := h.front(webInfo(trust.Unauthenticated()))
	big := strings.Repeat("a", 16<<10)
	req, _ := http.NewRequest("GET", "http://web/", nil)
	req.Header.Set("X-Big", big)
	if resp, err := h1Client(addr).Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("HTTP/1.1 oversized headers: %d", resp.StatusCode)
		}
	}
	if resp, err := h2cClient(addr).Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Error("HTTP/2 oversized headers were served")
		}
	}
	if n := h.backends["web"].count.Load(); n != 0 {
		t.Errorf("oversized requests reached the backend %d times", n)
	}
	// A client that never finishes its headers is cut off.
	h2 := newHarness(t, func(o *Options) { o.ReadHeaderTimeout = 200 * time.Millisecond })
	h2.backend("web", "http", false)
	h2.update(nil, nil)
	conn := dialFront(t, h2.front(webInfo(trust.Unauthenticated())))
	fmt.Fprint(conn, "GET / HTTP/1.1\r\nHost: web\r\n")
	if _, err := io.ReadAll(bufio.NewReader(conn)); err != nil {
		t.Fatalf("connection not closed after the header timeout: %v", err)
	}
}

// grpcBackend runs a gRPC server with the health service on 127.0.0.1.
func grpcBackend(t *testing.T, serving healthpb.HealthCheckResponse_ServingStatus) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("svc", serving)
	healthpb.RegisterHealthServer(s, hs)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return netip.MustParseAddrPort(ln.Addr().String())
}

func TestGRPC(t *testing.T) {
	h := newHarness(t)
	h.addService("web", "grpc")
	h.addService("up", "grpc", grpcBackend(t, healthpb.HealthCheckResponse_SERVING))
	h.addService("down", "grpc", grpcBackend(t, healthpb.HealthCheckResponse_NOT_SERVING))
	canary := &meshv1.GRPCRouteMatch{Headers: []*meshv1.StringMatch{hdr("x-canary", "1")}}
	healthOnly := &meshv1.GRPCRouteMatch{Method: &meshv1.GRPCMethodMatch{Service: "grpc.health.v1.Health"}}
	h.update(nil, []*meshv1.GRPCRoute{grpcRoute("g", epoch, grpcTo("up", healthOnly), grpcTo("down", canary))})

	info := webInfo(trust.Unauthenticated())
	info.Protocol = ProtocolGRPC
	conn, err := grpc.NewClient("passthrough:///"+h.front(info), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: "svc"})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Check: %v %v", resp, err)
	}
	// Characters in the matched service rank before header matches: the
	// service match wins over the canary header match.
	resp, err = client.Check(metadata.AppendToOutgoingContext(ctx, "x-canary", "1"), &healthpb.HealthCheckRequest{Service: "svc"})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Check with canary header: %v %v", resp, err)
	}

	// Server streaming works through the proxy.
	stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{Service: "svc"})
	if err != nil {
		t.Fatal(err)
	}
	if msg, err := stream.Recv(); err != nil || msg.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Watch: %v %v", msg, err)
	}

	// Routing by header when the method match does not apply.
	h.update(nil, []*meshv1.GRPCRoute{grpcRoute("g", epoch, grpcTo("up"), grpcTo("down", canary))})
	resp, err = client.Check(metadata.AppendToOutgoingContext(ctx, "x-canary", "1"), &healthpb.HealthCheckRequest{Service: "svc"})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("canary Check: %v %v", resp, err)
	}

	// Local answers to gRPC callers are gRPC statuses.
	other := &meshv1.GRPCRouteMatch{Method: &meshv1.GRPCMethodMatch{Service: "other.Service"}}
	h.update(nil, []*meshv1.GRPCRoute{grpcRoute("g", epoch, grpcTo("up", other))})
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: "svc"}); status.Code(err) != codes.Unimplemented {
		t.Errorf("no route: %v, want Unimplemented", err)
	}
	h.update(nil, []*meshv1.GRPCRoute{grpcRoute("g", epoch, grpcTo("up"))})
	h.setAuthz(AuthorizerFunc(func(context.Context, *AuthzRequest) Decision {
		return Decision{Allowed: false, Body: []byte("not you")}
	}))
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{Service: "svc"})
	if st, _ := status.FromError(err); st.Code() != codes.PermissionDenied || st.Message() != "not you" {
		t.Errorf("denied: %v, want PermissionDenied \"not you\"", err)
	}
	h.setAuthz(AllowAll())
	h.addService("dead", "grpc", deadAddr(t))
	h.update(nil, []*meshv1.GRPCRoute{grpcRoute("g", epoch, grpcTo("dead"))})
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: "svc"}); status.Code(err) != codes.Unavailable {
		t.Errorf("unreachable backend: %v, want Unavailable", err)
	}
}

// An HTTP/1.1 upgrade (WebSocket-style) is relayed both ways.
func TestUpgrade(t *testing.T) {
	h := newHarness(t)
	b := h.backend("web", "http", false)
	b.setBehave(func(_ int64, w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("Upgrade") != "echo" {
			return false
		}
		c, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return true
		}
		defer c.Close()
		// An informational response first: the upgrade path passes it on
		// too (ReverseProxy's trace, not forward's).
		_, _ = rw.WriteString("HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n")
		_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		_ = rw.Flush()
		line, err := rw.ReadString('\n')
		if err == nil {
			_, _ = rw.WriteString("echo: " + line)
			_ = rw.Flush()
		}
		return true
	})
	h.update(nil, nil)
	conn := dialFront(t, h.front(webInfo(trust.Unauthenticated())))
	fmt.Fprint(conn, "GET /ws HTTP/1.1\r\nHost: web\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusEarlyHints || resp.Header.Get("Link") != "</a.css>; rel=preload" {
		t.Fatalf("informational response: %v %v", resp, err)
	}
	resp, err = http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade response: %v %v", resp, err)
	}
	fmt.Fprint(conn, "hello\n")
	if line, err := br.ReadString('\n'); err != nil || line != "echo: hello\n" {
		t.Fatalf("relayed %q, %v", line, err)
	}
}

func TestDefaultRequestTimeout(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.DefaultRequestTimeout = 300 * time.Millisecond })
	h.addService("web", "http")
	slow := h.backend("slow", "http", false)
	slow.setBehave(func(_ int64, w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == "/fast" {
			return false
		}
		stall(w, r)
		return true
	})
	noLimit := to("slow", prefixM("/unbounded"))
	noLimit.RequestTimeout = dur(0) // explicit 0 disables the default
	h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch, to("slow", prefixM("/")), noLimit)}, nil)
	c := h1Client(h.front(webInfo(trust.Unauthenticated())))
	if res := get(t, c, "/slow", nil); res.status != 504 {
		t.Errorf("default request timeout: %d", res.status)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://web/unbounded", nil)
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
		t.Errorf("explicitly unbounded route answered %d instead of waiting", resp.StatusCode)
	}
}
