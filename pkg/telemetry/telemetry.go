// Package telemetry holds Istio's standard metric labels (the ones Kiali's
// graph and Istio's Grafana dashboards query) and what fills them: the
// identity labels of a connection's two sides and of its destination
// service, the names a caller's node proxy sends in the HBONE CONNECT's
// baggage (baggage.go), and the TCP metrics the node proxy reports with
// them, its byte counters read as bytes flow (bytes.go).
//
// Labels describing a caller come only from what authenticated it: the
// principal is the tunnel's verified identity, and the workload at the
// caller's address is named only when its identity is that same one. The
// only header believed is the baggage of an authenticated tunnel's
// CONNECT, and only for a caller the index does not hold, within its
// identity's namespace (baggage.go).
package telemetry

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// Unknown is the value of a label whose truth is not known (Istio's).
const Unknown = "unknown"

// Cluster is the value of source_cluster and destination_cluster for a
// known workload: the mesh spans one cluster, named as Istio names a
// cluster it was not given a name for.
const Cluster = "Kubernetes"

// Connection security policies: mutual_tls for a tunnel whose caller
// proved an identity, none otherwise (plaintext, or a TLS-only tunnel).
const (
	MutualTLS = "mutual_tls"
	None      = "none"
)

// Reporters: the node proxy on the caller's side, on the callee's, and the
// waypoint.
const (
	ReporterSource      = "source"
	ReporterDestination = "destination"
	ReporterWaypoint    = "waypoint"
)

// Peer is what the labels say about one side of a connection.
type Peer struct {
	Workload, Namespace, Principal, App, Version, CanonicalService, CanonicalRevision, Cluster string
}

// UnknownPeer is a side nothing is known of.
var UnknownPeer = Peer{Unknown, Unknown, Unknown, Unknown, Unknown, Unknown, Unknown, Unknown}

// Caller is the peer that opened a connection: peer is who the TLS
// handshake authenticated, w the workload the index holds at the
// connection's source address (nil: none), baggage the tunnel's CONNECT
// baggage (the caller's node proxy's word, ParseBaggage; never a request's
// own baggage).
//
// The workload in the index is named only when its identity is the
// authenticated one; a workload of another identity at that address makes
// the whole side unknown (one of the two is lying or stale, and neither
// may be believed). The index wins over the baggage: it is the control
// plane's, checked against the identity; the baggage is a claim, of which
// only the namespace can be checked. An authenticated caller at an address
// the index does not know keeps its principal and namespace, and is named
// by its baggage when that is well-formed and of the same namespace. An
// unauthenticated caller (plaintext, a TLS-only tunnel) is unknown. The
// error says why baggage there was not believed (a *BaggageError).
func Caller(peer trust.Peer, w *meshv1.Workload, baggage string) (Peer, error) {
	id, ok := peer.Identity()
	if !ok {
		if baggage != "" {
			return UnknownPeer, &BaggageError{Reason: BaggageUnauthenticated, Err: errTLSOnly}
		}
		return UnknownPeer, nil
	}
	if w == nil {
		return callerFromBaggage(id, baggage)
	}
	if w.GetIdentity() != id.String() {
		return UnknownPeer, nil
	}
	return Of(w), nil
}

// Of is a workload the proxy itself chose or serves (a destination, a
// local pod): its index entry is the truth, its identity the principal.
func Of(w *meshv1.Workload) Peer {
	if w == nil {
		return UnknownPeer
	}
	p := Peer{
		Workload:          orUnknown(w.GetWorkloadName()),
		Namespace:         orUnknown(w.GetNamespace()),
		Principal:         orUnknown(w.GetIdentity()),
		CanonicalService:  orUnknown(w.GetCanonicalService()),
		CanonicalRevision: orUnknown(w.GetCanonicalRevision()),
		Cluster:           Cluster,
	}
	// The app and version labels, else the canonical ones (ztunnel reports
	// those in their place).
	p.App, p.Version = w.GetApp(), w.GetVersion()
	if p.App == "" {
		p.App = p.CanonicalService
	}
	if p.Version == "" {
		p.Version = p.CanonicalRevision
	}
	return p
}

// Service is the destination service's labels.
type Service struct{ Host, Name, Namespace string }

// UnknownService is a destination addressed by workload, not by service.
var UnknownService = Service{Unknown, Unknown, Unknown}

// ServiceOf is s's labels: its FQDN, name and namespace.
func ServiceOf(s *meshv1.Service) Service {
	if s == nil {
		return UnknownService
	}
	return Service{orUnknown(s.GetHostname()), orUnknown(s.GetName()), orUnknown(s.GetNamespace())}
}

// SecurityPolicy is the connection_security_policy of a connection whose
// caller is peer.
func SecurityPolicy(peer trust.Peer) string {
	if peer.Authenticated() {
		return MutualTLS
	}
	return None
}

func orUnknown(s string) string {
	if s == "" {
		return Unknown
	}
	return s
}

// peerLabels names a side's labels, in Peer's field order, for prefix
// "source" or "destination".
func peerLabels(prefix string) []string {
	return []string{prefix + "_workload", prefix + "_workload_namespace", prefix + "_principal", prefix + "_app",
		prefix + "_version", prefix + "_canonical_service", prefix + "_canonical_revision", prefix + "_cluster"}
}

// Labels are the standard labels shared by the TCP and the HTTP metrics,
// in the order Values gives them.
var Labels = concat([]string{"reporter"}, peerLabels("source"), peerLabels("destination"),
	[]string{"destination_service", "destination_service_name", "destination_service_namespace",
		"request_protocol", "response_flags", "connection_security_policy"})

// Connection is what the standard labels say about one connection (or,
// in the waypoint, one request).
type Connection struct {
	Reporter            string
	Source, Destination Peer
	Service             Service
	Protocol            string // request_protocol: tcp, http or grpc
	Flags               string // response_flags: "-" when none
	SecurityPolicy      string
}

// Values are c's label values, in Labels' order, appended to dst.
func (c *Connection) Values(dst []string) []string {
	dst = append(dst, c.Reporter)
	dst = c.Source.append(dst)
	dst = c.Destination.append(dst)
	flags := c.Flags
	if flags == "" {
		flags = "-"
	}
	return append(dst, c.Service.Host, c.Service.Name, c.Service.Namespace, c.Protocol, flags, c.SecurityPolicy)
}

func (p *Peer) append(dst []string) []string {
	return append(dst, p.Workload, p.Namespace, p.Principal, p.App, p.Version, p.CanonicalService, p.CanonicalRevision, p.Cluster)
}

func concat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// TCP are the node proxy's standard connection metrics. As Istio's,
// received bytes are the request's (caller to destination), sent bytes the
// response's.
type TCP struct {
	Opened, Closed *prometheus.CounterVec
	Bytes          *Bytes // istio_tcp_received_bytes_total, istio_tcp_sent_bytes_total
}

// NewTCP makes the TCP metrics (unregistered).
func NewTCP() *TCP {
	return &TCP{
		Opened: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "istio_tcp_connections_opened_total",
			Help: "TCP connections opened (Istio standard metric)."}, Labels),
		Closed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "istio_tcp_connections_closed_total",
			Help: "TCP connections closed (Istio standard metric)."}, Labels),
		Bytes: newBytes(),
	}
}
