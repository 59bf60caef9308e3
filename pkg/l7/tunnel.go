package l7

import (
	"net/netip"
	"strconv"
	"sync"

	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/telemetry"
	"github.com/causeway-mesh/causeway/pkg/trust"
)

// A served tunnel: what the waypoint knows of it (ConnInfo) and what its
// requests share (tunnel).

// ConnInfo describes a tunnel the waypoint terminated.
type ConnInfo struct {
	// Peer is the tunnel's peer (from trust.PeerFromTLS): authenticated, or
	// not, for a TLS-only tunnel. Nothing in the traffic can change it.
	Peer trust.Peer
	// Source is the caller's address.
	Source netip.AddrPort
	// Destination is the address the caller addressed (the CONNECT
	// :authority): a service VIP:port, or a workload IP:port.
	Destination netip.AddrPort
	// Service is the destination service; zero for a workload-addressed
	// destination, which is then served without routes.
	Service ServiceRef
	// Port is the service port addressed (default: Destination's port).
	Port uint32
	// Protocol is the port's protocol, from its appProtocol (ProtocolFor).
	Protocol Protocol
	// Ingress: the connection came to an ingress gateway's listener port
	// (Port): each request is routed by the listener of that port its
	// host selects (Config from CompileGateway). Listener is the listener
	// a TLS connection's server name selected: a request whose host
	// selects another is misdirected (421).
	Ingress  bool
	Listener string
	// TLS: the ingress terminated TLS on the connection, so its requests'
	// scheme is https (a redirect without a scheme keeps it).
	TLS bool
	// Baggage is the tunnel's CONNECT baggage (hbone.Request.Baggage): the
	// caller's node proxy's word on its names, believed only as
	// telemetry.Caller says. A request's own baggage header is never read
	// for it.
	Baggage string
}

// tunnel is a served tunnel's ConnInfo with the strings every request's
// log line, metrics and headers use, made once per tunnel.
type tunnel struct {
	ConnInfo
	source    string // Source
	principal string // Peer: the identity or "unauthenticated"
	service   string // "{namespace}/{name}", or Destination for a workload
	// forwardedFor and forwarded are what the caller adds to
	// X-Forwarded-For and Forwarded; the header values of a request that
	// had none, and the identity header's, are made once per tunnel and
	// shared by its requests (an upstream header value is never changed in
	// place).
	forwardedFor, forwarded  string
	xffValues, forwardValues []string
	identityValues           []string // nil: unauthenticated
	// callerNS is the namespace of the authenticated caller's identity
	// ("" when unauthenticated): it selects consumer routes.
	callerNS string

	// std is what the standard metrics say of the tunnel's caller and
	// service (identify).
	std telemetry.Connection

	// accessLog is the engine's access logger with the tunnel's fields
	// (source, identity, destination, service) encoded once, not per
	// request.
	accessLog *zap.Logger

	// mu guards metrics: HTTP/2 streams finish concurrently. The map holds
	// the label sets this tunnel's requests used; it goes with the tunnel.
	mu      sync.Mutex
	metrics map[metricsKey]labelled
	last    metricsKey // the key of the previous request's label set, held in lastSet
	lastSet labelled
}

func newTunnel(info ConnInfo, log *zap.Logger) *tunnel {
	t := &tunnel{ConnInfo: info, source: info.Source.String(), principal: info.Peer.String(),
		forwardedFor: info.Source.Addr().Unmap().String(), forwarded: forwardedElement(info.Source)}
	destination := info.Destination.String()
	t.xffValues, t.forwardValues = []string{t.forwardedFor}, []string{t.forwarded}
	if id, ok := info.Peer.Identity(); ok {
		t.identityValues = []string{id.String()}
		t.callerNS = id.Namespace()
	}
	t.service = info.Service.String()
	if info.Service.IsZero() {
		t.service = destination
	}
	t.accessLog = log.With(zap.String("source", t.source), zap.String("identity", t.principal),
		zap.String("destination", destination), zap.String("service", t.service))
	return t
}

// forwardedElement is the caller's Forwarded (RFC 7239) element.
func forwardedElement(a netip.AddrPort) string {
	if a.Addr().Unmap().Is6() {
		return `for="[` + a.Addr().String() + "]:" + strconv.Itoa(int(a.Port())) + `"`
	}
	return `for="` + a.Addr().Unmap().String() + ":" + strconv.Itoa(int(a.Port())) + `"`
}
