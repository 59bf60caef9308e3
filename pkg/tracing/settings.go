// Package tracing holds a waypoint's tracing settings (a Gateway's
// annotations, the waypoint's flags) and their checks. It links no
// OpenTelemetry code, so the control plane's deployer can check the
// annotations; pkg/tracing/otlpexport ships the spans.
package tracing

import (
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
)

// Protocol is how spans reach the receiver.
type Protocol string

const (
	// GRPC is OTLP over gRPC (a receiver's port 4317).
	GRPC Protocol = "grpc"
	// HTTP is OTLP over HTTP with protobuf bodies, POST /v1/traces (port 4318).
	HTTP Protocol = "http"
)

// DefaultSampling is the percentage of new traces sampled when none is
// given: Istio's default.
const DefaultSampling = 1.0

// Settings are a waypoint's tracing settings. The zero value is tracing
// off.
type Settings struct {
	// Endpoint is the receiver's host:port (plaintext); "" turns tracing off.
	Endpoint string
	Protocol Protocol
	// Sampling is the percentage (0 to 100) of traces the waypoint starts
	// that are sampled. A request that arrives with a trace context keeps
	// its caller's decision (parent-based sampling).
	Sampling float64
}

// Enabled reports whether spans are exported.
func (s Settings) Enabled() bool { return s.Endpoint != "" }

// Parse checks tracing settings given as text (flags, annotations): an
// endpoint host:port, a protocol ("" is grpc) and a sampling percentage
// ("" is DefaultSampling). An empty endpoint is tracing off, whatever the
// rest says.
func Parse(endpoint, protocol, sampling string) (Settings, error) {
	s := Settings{Endpoint: endpoint, Protocol: GRPC, Sampling: DefaultSampling}
	switch Protocol(protocol) {
	case "", GRPC:
	case HTTP:
		s.Protocol = HTTP
	default:
		return Settings{}, fmt.Errorf("tracing protocol %q: want grpc or http", protocol)
	}
	if sampling != "" {
		p, err := strconv.ParseFloat(strings.TrimSuffix(sampling, "%"), 64)
		if err != nil || math.IsNaN(p) || p < 0 || p > 100 {
			return Settings{}, fmt.Errorf("tracing sampling %q: want a percentage from 0 to 100 (e.g. 1 or 0.5)", sampling)
		}
		s.Sampling = p
	}
	if endpoint == "" {
		return Settings{}, nil
	}
	if err := checkEndpoint(endpoint); err != nil {
		return Settings{}, fmt.Errorf("tracing endpoint %q: %w", endpoint, err)
	}
	return s, nil
}

// Validate checks settings built by hand as Parse checks text: an enabled
// endpoint is host:port and the sampling a percentage.
func (s Settings) Validate() error {
	if s.Sampling < 0 || s.Sampling > 100 || math.IsNaN(s.Sampling) {
		return fmt.Errorf("tracing sampling %v: want a percentage from 0 to 100", s.Sampling)
	}
	if !s.Enabled() {
		return nil
	}
	if err := checkEndpoint(s.Endpoint); err != nil {
		return fmt.Errorf("tracing endpoint %q: %w", s.Endpoint, err)
	}
	return nil
}

// checkEndpoint accepts host:port with a host name or IP and a port from 1
// to 65535; a URL is refused, since the protocol says how to speak to it.
func checkEndpoint(endpoint string) error {
	const want = "want host:port of an OTLP receiver (e.g. jaeger.tracing:4317), no scheme or path"
	host, port, err := net.SplitHostPort(endpoint)
	if err != nil {
		return fmt.Errorf("%s: %v", want, err)
	}
	if host == "" || strings.ContainsAny(host, "/@?# ") {
		return fmt.Errorf("%s", want)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("port %q: want a number from 1 to 65535", port)
	}
	return nil
}
