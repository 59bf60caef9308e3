// Package otlptest runs an OTLP trace receiver on loopback for tests: the
// OTLP protocol's own generated gRPC service (port "4317") and its HTTP
// binding, POST /v1/traces with a protobuf body ("4318"), keeping every
// span it is sent.
package otlptest

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/causeway-mesh/causeway/pkg/internal/testnet"
)

// Span is a received span with its resource's attributes.
type Span struct {
	*tracepb.Span
	Resource map[string]string
}

// TraceID and SpanID are the span's IDs in hex, as traceparent writes them.
func (s Span) TraceID() string { return hex.EncodeToString(s.GetTraceId()) }
func (s Span) SpanID() string  { return hex.EncodeToString(s.GetSpanId()) }

// ParentID is the parent's span ID in hex, "" for a root span.
func (s Span) ParentID() string { return hex.EncodeToString(s.GetParentSpanId()) }

// Attr is a string or integer attribute's value as text, "" when absent.
func (s Span) Attr(k string) string { return attrs(s.GetAttributes())[k] }

// Receiver collects the spans exported to it.
type Receiver struct {
	coltracepb.UnimplementedTraceServiceServer
	// GRPCAddr and HTTPAddr are where it listens (127.0.0.1:port).
	GRPCAddr, HTTPAddr string

	mu    sync.Mutex
	spans []Span
	ch    chan struct{} // closed and replaced when spans arrive
}

// Start starts a receiver on loopback; the test's cleanup stops it.
func Start(t testing.TB) *Receiver {
	t.Helper()
	r := &Receiver{ch: make(chan struct{})}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.GRPCAddr, r.HTTPAddr = gl.Addr().String(), hl.Addr().String()
	gs := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(gs, r)
	go func() { _ = gs.Serve(gl) }()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.serveHTTP)
	hs := &http.Server{Handler: mux}
	go func() { _ = hs.Serve(hl) }()
	t.Cleanup(func() {
		gs.Stop()
		_ = hs.Close()
	})
	return r
}

// StartStalled starts a receiver that is not one: it accepts connections
// on loopback, reads what it is sent and never answers, as a collector
// that hangs does. It returns its address.
func StartStalled(t testing.TB) string {
	t.Helper()
	ln := testnet.Listen(t, "127.0.0.1:0")
	testnet.Serve(t, ln, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	return ln.Addr().String()
}

// Export is the gRPC service's method.
func (r *Receiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.add(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, hr *http.Request) {
	b, err := io.ReadAll(io.LimitReader(hr.Body, 16<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req coltracepb.ExportTraceServiceRequest
	if hr.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "want application/x-protobuf", http.StatusUnsupportedMediaType)
		return
	}
	if err := proto.Unmarshal(b, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.add(&req)
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (r *Receiver) add(req *coltracepb.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, Span{Span: s, Resource: res})
			}
		}
	}
	close(r.ch)
	r.ch = make(chan struct{})
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Wait returns the received spans once there are at least n, or what
// there is when ctx ends.
func (r *Receiver) Wait(ctx context.Context, n int) []Span {
	for {
		r.mu.Lock()
		got, ch := len(r.spans), r.ch
		r.mu.Unlock()
		if got >= n {
			return r.Spans()
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return r.Spans()
		}
	}
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = strconv.FormatInt(v.IntValue, 10)
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = strconv.FormatBool(v.BoolValue)
		}
	}
	return m
}
