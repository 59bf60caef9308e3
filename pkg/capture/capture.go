// Package capture delivers workload connections to the node proxy: where they
// came from and where they were going. Local mode captures outbound traffic
// through a SOCKS5 listener; in-pod mode (package inpod) takes connections
// redirected inside each pod's network namespace (package rules) that the
// node agent hands over (package handoff).
package capture

import (
	"context"
	"net"
	"net/netip"
	"strconv"
)

// The in-pod contract (docs/design.md §2, §10) between the rules written in a pod
// and the node proxy's listeners there.
const (
	OutboundPort = 15001 // redirected outbound TCP
	InboundPort  = 15006 // redirected inbound plaintext TCP
	HBONEPort    = 15008 // inbound HBONE, never redirected
	// ProxyMark, under ProxyMarkMask, marks the node proxy's own sockets in
	// a pod, which the rules never redirect (ztunnel's values).
	ProxyMark     = 0x539
	ProxyMarkMask = 0xfff
)

// Destination is where a captured connection was going: an address, or a
// hostname the mesh registry must resolve (SOCKS5 domain requests).
type Destination struct {
	Addr netip.AddrPort // valid when Host is empty
	Host string
	Port uint16
}

func (d Destination) String() string {
	if d.Host != "" {
		return net.JoinHostPort(d.Host, strconv.Itoa(int(d.Port)))
	}
	return d.Addr.String()
}

// Outcome is how the proxy answers a captured connection before relaying.
type Outcome int

const (
	// Connected: the upstream is established; relay bytes.
	Connected Outcome = iota
	// Refused: policy or configuration forbids the connection.
	Refused
	// Unreachable: the destination (or its waypoint) could not be reached.
	Unreachable
	// HostUnknown: a hostname did not resolve in the mesh registry.
	HostUnknown
)

// Conn is one captured outbound connection.
type Conn interface {
	net.Conn
	// Source is the workload address the connection came from.
	Source() netip.AddrPort
	// Destination is where the workload was connecting.
	Destination() Destination
	// Answer tells the workload the outcome. It must be called exactly once,
	// before relaying (Connected) or before Close (any other outcome).
	Answer(Outcome) error
	// NetConn is the workload's own connection, to relay on once answered
	// (so relays can use the socket's fast paths).
	NetConn() net.Conn
}

// Handler takes captured connections; it owns and must close each one.
type Handler interface {
	HandleOutbound(ctx context.Context, c Conn)
}

// InboundHandler takes plaintext connections captured on their way into a
// pod, from outside the mesh; dst is where they were going. It owns and
// must close each one.
type InboundHandler interface {
	HandleInbound(ctx context.Context, c net.Conn, dst netip.AddrPort)
}
