package policy

import (
	"context"
	"net/netip"
	"strconv"
	"testing"
)

const typicalRequest = `GET /api/v1/orders/42?expand=items HTTP/1.1
Host: checkout.shop.svc.cluster.local:8080
User-Agent: Go-http-client/1.1
Accept: application/json
Accept-Encoding: gzip
Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.abc
Traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01
Baggage: k8s.namespace.name=shop
X-Request-Id: 7d1c7ba1-5b9c-4c4f-9a8e-0e1c4e0e2c11

`

func benchRequest(b testing.TB) *Request {
	p := newPeers(b)
	return &Request{
		HTTP:        readRequest(b, typicalRequest),
		Source:      p.frontend,
		SourceAddr:  netip.MustParseAddrPort("127.0.10.11:45678"),
		DestAddr:    netip.MustParseAddrPort("127.0.20.1:8080"),
		Destination: p.checkout,
		ID:          "1",
	}
}

// BenchmarkDecide is the policy cost per request on the waypoint's path:
// input construction, evaluation of the example policy (set lookup by
// principal, object result) and result reading. The request repeats, so
// after the first one the decision cache answers (as it does for a caller
// repeating a call); BenchmarkDecideUncached evaluates every time.
func BenchmarkDecide(b *testing.B) { benchmarkDecide(b, false) }

// BenchmarkDecideUncached is BenchmarkDecide with the decision cache off:
// the cost of a request the cache has not seen.
func BenchmarkDecideUncached(b *testing.B) { benchmarkDecide(b, true) }

func benchmarkDecide(b *testing.B, noCache bool) {
	e, _ := loadEngine(b, Options{Dir: "testdata/example", NoDecisionCache: noCache})
	req := benchRequest(b)
	if d := e.Decide(context.Background(), req); !d.Allowed {
		b.Fatalf("typical request denied: %s", d.Reason)
	}
	b.ReportAllocs()
	for b.Loop() {
		e.Decide(context.Background(), req)
	}
}

// BenchmarkDecideMiss is a request the decision cache has not seen (each
// names another order), evaluated on the pruned input as the engine does by
// default; BenchmarkDecideMissWholeInput is the same with the cache off, so
// evaluated on the whole input.
func BenchmarkDecideMiss(b *testing.B)           { benchmarkDecideMiss(b, false) }
func BenchmarkDecideMissWholeInput(b *testing.B) { benchmarkDecideMiss(b, true) }

func benchmarkDecideMiss(b *testing.B, noCache bool) {
	e, _ := loadEngine(b, Options{Dir: "testdata/example", NoDecisionCache: noCache})
	req := benchRequest(b)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		req.HTTP.RequestURI = "/api/v1/orders/" + strconv.Itoa(i) + "?expand=items"
		if d := e.Decide(context.Background(), req); !d.Allowed {
			b.Fatal(d.Reason)
		}
	}
}

// BenchmarkDecideBoolean: OPA-Envoy's simplest policy shape (boolean allow on method).
func BenchmarkDecideBoolean(b *testing.B) {
	dir := b.TempDir()
	writeFiles(b, dir, map[string]string{"authz.rego": goodPolicy})
	e, _ := loadEngine(b, Options{Dir: dir})
	req := benchRequest(b)
	b.ReportAllocs()
	for b.Loop() {
		e.Decide(context.Background(), req)
	}
}

// BenchmarkBuildInput is the input construction alone.
func BenchmarkBuildInput(b *testing.B) {
	req := benchRequest(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := BuildInput(req, InputOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEvaluate is evaluation and result reading alone (input prebuilt,
// decision cache off).
func BenchmarkEvaluate(b *testing.B) {
	e, _ := loadEngine(b, Options{Dir: "testdata/example", NoDecisionCache: true})
	in, err := BuildInput(benchRequest(b), InputOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		e.DecideInput(context.Background(), in)
	}
}
