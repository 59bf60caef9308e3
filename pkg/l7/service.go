package l7

import (
	"net/netip"
	"strings"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// What routes and endpoints are named by: services, their ports and
// protocols, the protocol spoken upstream, and the endpoints (Target).

// ServiceRef names a Service.
type ServiceRef struct{ Namespace, Name string }

func (s ServiceRef) String() string { return s.Namespace + "/" + s.Name }

// IsZero reports whether s names no service.
func (s ServiceRef) IsZero() bool { return s.Namespace == "" && s.Name == "" }

// PodRef names a pod.
type PodRef struct{ Namespace, Name string }

// Protocol is how the waypoint parses a service port.
type Protocol uint8

const (
	// ProtocolTCP is an opaque byte stream: not handled by this package.
	ProtocolTCP Protocol = iota
	// ProtocolHTTP is HTTP/1.1, with prior-knowledge HTTP/2 detected by its preface.
	ProtocolHTTP
	// ProtocolHTTP2 is cleartext HTTP/2 with prior knowledge.
	ProtocolHTTP2
	// ProtocolGRPC is gRPC: cleartext HTTP/2 with prior knowledge.
	ProtocolGRPC
)

func (p Protocol) String() string {
	switch p {
	case ProtocolHTTP:
		return "http"
	case ProtocolHTTP2:
		return "http2"
	case ProtocolGRPC:
		return "grpc"
	}
	return "tcp"
}

// ProtocolFor maps a Service port's appProtocol to how it is parsed (DESIGN
// section 6): http, http2 or kubernetes.io/h2c, grpc; anything else is TCP.
func ProtocolFor(appProtocol string) Protocol {
	switch strings.ToLower(appProtocol) {
	case "http":
		return ProtocolHTTP
	case "http2", "kubernetes.io/h2c":
		return ProtocolHTTP2
	case "grpc":
		return ProtocolGRPC
	}
	return ProtocolTCP
}

// upstreamProto is the protocol spoken to a backend.
type upstreamProto uint8

const (
	upstreamAuto upstreamProto = iota // unknown appProtocol: as the caller spoke
	upstreamH1
	upstreamH2
)

func upstreamFor(appProtocol string) upstreamProto {
	switch ProtocolFor(appProtocol) {
	case ProtocolHTTP:
		return upstreamH1
	case ProtocolHTTP2, ProtocolGRPC:
		return upstreamH2
	}
	return upstreamAuto
}

type tableKey struct {
	svc  ServiceRef
	port uint32
}

// backendDest is what a backendRef resolves to: the service port it names
// and the protocol spoken to it, or why it cannot be used (invalid). Rules'
// backends and mirrors are made of it.
type backendDest struct {
	svc     ServiceRef
	port    uint32
	name    string // "{namespace}/{name}:{port}", for logs
	invalid string
	// missing: the Service is not known (an Ingress may name one before it
	// exists); its requests get 503, as for a Service without endpoints.
	missing bool
	proto   upstreamProto
}

func (b *backendDest) String() string { return b.name }

// Target is one endpoint the waypoint sends requests to.
type Target struct {
	// Address is the endpoint's pod IP and the port on it (the service's
	// target port for this endpoint).
	Address netip.AddrPort
	// Identity is the identity the endpoint's workload must prove (the SAN
	// to verify); zero when its workload is unknown.
	Identity trust.Identity
	// Workload is the endpoint's workload, nil when unknown.
	Workload *meshv1.Workload
	// Service is the service the endpoint was selected for (zero for a
	// workload-addressed destination).
	Service ServiceRef
	// TLS is the BackendTLSPolicy of the service port, nil when none
	// applies: the dialer speaks TLS to the endpoint and verifies it
	// (inside the tunnel for a mesh workload). TLSKey identifies its
	// settings (backendtls.Key): pooled connections are kept per key.
	TLS    *meshv1.BackendTLS
	TLSKey string
	// ALPN is the application protocol the connection will carry ("h2",
	// "http/1.1"; "" for TCP), for the dialer to offer in its TLS
	// handshake. Set per dial.
	ALPN string
	// Via, when valid, is the HBONE address of the waypoint Address is
	// reached through (an ingress gateway's backend bound to a waypoint):
	// the tunnel goes there with Address as its authority, and Identity
	// is the waypoint's.
	Via netip.AddrPort
}
