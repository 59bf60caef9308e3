package l7

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/tracing"
	"github.com/causeway-mesh/causeway/pkg/tracing/otlpexport"
	"github.com/causeway-mesh/causeway/pkg/tracing/otlptest"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// BenchmarkRouteMatch: one request against 50 rules of mixed match kinds,
// matching the last-ranked one.
func BenchmarkRouteMatch(b *testing.B) {
	var rules []*meshv1.HTTPRouteRule
	for i := 0; i < 50; i++ {
		m := prefixM(fmt.Sprintf("/api/v%d", i))
		m.Headers = []*meshv1.StringMatch{hdr("x-tenant", fmt.Sprint(i))}
		rules = append(rules, to("v1", m))
	}
	rules = append(rules, to("v2", prefixM("/")))
	c := Compile([]*meshv1.HTTPRoute{httpRoute("r", epoch, rules...)}, nil, backendServices(), nil)
	t := c.tables[tableKey{ServiceRef{testNS, "web"}, 80}]
	r := httptest.NewRequest("GET", "http://web/other/path?x=1", nil)
	r.Header.Set("X-Tenant", "7")
	b.ReportAllocs()
	for b.Loop() {
		p, _ := normalizePath(r.URL.EscapedPath())
		if v := newReqView(r, p); t.route(&v) == nil {
			b.Fatal("no route")
		}
	}
}

// BenchmarkProxyH1 measures requests through the engine (HTTP/1.1 in and
// out, one route, allow-all) and, as the baseline in the same run, directly
// to the backend; it reports proxied/direct as proxy_cost_ratio.
func BenchmarkProxyH1(b *testing.B) { benchProxyH1(b) }

// BenchmarkProxyH1Traced is BenchmarkProxyH1 with tracing on at 1 %
// sampling, exporting to a real OTLP receiver on loopback.
func BenchmarkProxyH1Traced(b *testing.B) {
	rcv := otlptest.Start(b)
	p, err := otlpexport.New(otlpexport.Options{Settings: tracing.Settings{Endpoint: rcv.GRPCAddr, Protocol: tracing.GRPC, Sampling: 1}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	benchProxyH1(b, func(o *Options) { o.Tracer = p.Tracer() })
}

func benchProxyH1(b *testing.B, opts ...harnessOpt) {
	h := newHarness(b, opts...)
	be := h.backend("v1", "http", false)
	be.setBehave(func(_ int64, w http.ResponseWriter, _ *http.Request) bool {
		_, _ = io.WriteString(w, "ok")
		return true
	})
	h.addService("web", "http")
	h.update([]*meshv1.HTTPRoute{httpRoute("r", epoch, to("v1"))}, nil)
	proxied := h1Client(h.front(webInfo(trust.Unauthenticated())))
	direct := h1Client(be.addr.String())
	fetch := func(c *http.Client) {
		resp, err := c.Get("http://web/")
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	fetch(direct) // connections up before timing
	fetch(proxied)
	b.ResetTimer()
	t0 := time.Now()
	for i := 0; i < b.N; i++ {
		fetch(direct)
	}
	base := time.Since(t0)
	t0 = time.Now()
	for i := 0; i < b.N; i++ {
		fetch(proxied)
	}
	cost := time.Since(t0)
	b.ReportMetric(float64(cost)/float64(base), "proxy_cost_ratio")
	b.ReportMetric(float64(base.Nanoseconds())/float64(b.N), "direct_ns/req")
	b.ReportMetric(float64(cost.Nanoseconds())/float64(b.N), "proxied_ns/req")
}
