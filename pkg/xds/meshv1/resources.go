package meshv1

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/causeway-mesh/causeway/pkg/trust"
)

// Type URLs of the mesh resources as they travel over delta ADS.
const (
	typePrefix       = "type.googleapis.com/"
	WorkloadTypeURL  = typePrefix + "causeway.mesh.v1.Workload"
	ServiceTypeURL   = typePrefix + "causeway.mesh.v1.Service"
	WaypointTypeURL  = typePrefix + "causeway.mesh.v1.Waypoint"
	HTTPRouteTypeURL = typePrefix + "causeway.mesh.v1.HTTPRoute"
	GRPCRouteTypeURL = typePrefix + "causeway.mesh.v1.GRPCRoute"
	// ConnectionPolicyTypeURL carries Rego policies for connections.
	ConnectionPolicyTypeURL = typePrefix + "causeway.mesh.v1.ConnectionPolicy"
	// IngressGatewayTypeURL carries ingress Gateways with their TLS keys:
	// served to each gateway's own identity alone.
	IngressGatewayTypeURL = typePrefix + "causeway.mesh.v1.IngressGateway"
)

// TypeURLs lists every mesh resource type, in the order a consumer should
// apply them (workloads before the services whose endpoints name them).
var TypeURLs = []string{WorkloadTypeURL, ServiceTypeURL, WaypointTypeURL, HTTPRouteTypeURL, GRPCRouteTypeURL, ConnectionPolicyTypeURL, IngressGatewayTypeURL}

// NewResource returns an empty message of the given type URL.
func NewResource(typeURL string) (proto.Message, error) {
	switch typeURL {
	case WorkloadTypeURL:
		return &Workload{}, nil
	case ServiceTypeURL:
		return &Service{}, nil
	case WaypointTypeURL:
		return &Waypoint{}, nil
	case HTTPRouteTypeURL:
		return &HTTPRoute{}, nil
	case GRPCRouteTypeURL:
		return &GRPCRoute{}, nil
	case ConnectionPolicyTypeURL:
		return &ConnectionPolicy{}, nil
	case IngressGatewayTypeURL:
		return &IngressGateway{}, nil
	}
	return nil, fmt.Errorf("unknown mesh resource type %q", typeURL)
}

// ResourceName is the name a resource is served under: a workload's uid,
// "<namespace>/<name>" for everything else.
func ResourceName(m proto.Message) string {
	switch r := m.(type) {
	case *Workload:
		return r.GetUid()
	case *Service:
		return r.GetNamespace() + "/" + r.GetName()
	case *Waypoint:
		return r.GetNamespace() + "/" + r.GetName()
	case *HTTPRoute:
		return r.GetNamespace() + "/" + r.GetName()
	case *GRPCRoute:
		return r.GetNamespace() + "/" + r.GetName()
	case *ConnectionPolicy:
		return r.GetNamespace() + "/" + r.GetName()
	case *IngressGateway:
		return r.GetNamespace() + "/" + r.GetName()
	}
	return ""
}

// ResourceNamespace is the namespace a resource belongs to.
func ResourceNamespace(m proto.Message) string {
	if r, ok := m.(interface{ GetNamespace() string }); ok {
		return r.GetNamespace()
	}
	return ""
}

// ParentNamespaces lists the namespaces of a route's parent Services other
// than the route's own: a consumer route (GEP-1294) belongs to the
// waypoints of those namespaces too. Nil for anything but a route.
func ParentNamespaces(m proto.Message) []string {
	r, ok := m.(interface {
		GetNamespace() string
		GetParents() []*ParentRef
	})
	if !ok {
		return nil
	}
	var out []string
	for _, p := range r.GetParents() {
		if ns := p.GetNamespace(); ns != "" && ns != r.GetNamespace() && !slices.Contains(out, ns) {
			out = append(out, ns)
		}
	}
	return out
}

// Waypoint-for values (label causeway.dev/waypoint-for).
const (
	WaypointForService  = "service"
	WaypointForWorkload = "workload"
	WaypointForAll      = "all"
)

// Validate checks what a consumer relies on: names, addresses, identities,
// port ranges and regular expressions. The xDS client NACKs a response with a
// resource that fails; the control plane checks its own output with it too.
func Validate(m proto.Message) error {
	switch r := m.(type) {
	case *Workload:
		return validateWorkload(r)
	case *Service:
		return validateService(r)
	case *Waypoint:
		return validateWaypoint(r)
	case *HTTPRoute:
		return validateHTTPRoute(r)
	case *GRPCRoute:
		return validateGRPCRoute(r)
	case *ConnectionPolicy:
		return validateConnectionPolicy(r)
	case *IngressGateway:
		return validateIngressGateway(r)
	}
	return fmt.Errorf("unknown mesh resource %T", m)
}

func validateWorkload(w *Workload) error {
	if w.GetUid() == "" {
		return errors.New("workload: empty uid")
	}
	if err := nonEmpty("workload "+w.GetUid(), w.GetNamespace(), w.GetName()); err != nil {
		return err
	}
	if _, err := trust.ParseIdentity(w.GetIdentity()); err != nil {
		return fmt.Errorf("workload %s: %w", w.GetUid(), err)
	}
	for _, a := range w.GetAddresses() {
		if err := checkIP(a); err != nil {
			return fmt.Errorf("workload %s: address: %w", w.GetUid(), err)
		}
	}
	if a := w.GetAppAddress(); a != "" {
		if err := checkIP(a); err != nil {
			return fmt.Errorf("workload %s: app address: %w", w.GetUid(), err)
		}
	}
	for _, p := range w.GetServingPorts() {
		if err := checkPort(p); err != nil {
			return fmt.Errorf("workload %s: serving port: %w", w.GetUid(), err)
		}
	}
	if w.GetWaypoint() != nil {
		if err := checkRef(w.GetWaypoint()); err != nil {
			return fmt.Errorf("workload %s: waypoint: %w", w.GetUid(), err)
		}
	}
	if w.GetWaypointForGateway() != nil {
		if err := checkRef(w.GetWaypointForGateway()); err != nil {
			return fmt.Errorf("workload %s: waypoint gateway: %w", w.GetUid(), err)
		}
	}
	return nil
}

func validateService(s *Service) error {
	name := s.GetNamespace() + "/" + s.GetName()
	if err := nonEmpty("service", s.GetNamespace(), s.GetName()); err != nil {
		return err
	}
	for _, v := range s.GetVips() {
		if err := checkIP(v); err != nil {
			return fmt.Errorf("service %s: VIP: %w", name, err)
		}
	}
	for _, p := range s.GetPorts() {
		if err := checkPort(p.GetPort()); err != nil {
			return fmt.Errorf("service %s: port: %w", name, err)
		}
		if p.GetTargetPort() > 65535 {
			return fmt.Errorf("service %s: target port %d out of range", name, p.GetTargetPort())
		}
		if bt := p.GetBackendTls(); bt != nil {
			if err := validateBackendTLS(bt); err != nil {
				return fmt.Errorf("service %s: port %d: backend TLS: %w", name, p.GetPort(), err)
			}
		}
	}
	for _, e := range s.GetEndpoints() {
		if err := checkIP(e.GetAddress()); err != nil {
			return fmt.Errorf("service %s: endpoint: %w", name, err)
		}
		for sp, tp := range e.GetPorts() {
			if checkPort(sp) != nil || checkPort(tp) != nil {
				return fmt.Errorf("service %s: endpoint %s: port mapping %d->%d out of range", name, e.GetAddress(), sp, tp)
			}
		}
		if h := e.GetHostname(); h != "" {
			if label, rest, ok := strings.Cut(h, "."); !ok || rest != s.GetHostname() || !isDNSLabel(label) {
				return fmt.Errorf("service %s: endpoint %s: hostname %q is not <DNS label>.%s", name, e.GetAddress(), h, s.GetHostname())
			}
		}
	}
	if s.GetWaypoint() != nil {
		if err := checkRef(s.GetWaypoint()); err != nil {
			return fmt.Errorf("service %s: waypoint: %w", name, err)
		}
	}
	return nil
}

// validateBackendTLS checks what the waypoint needs to verify a backend:
// a name to send and verify, and something to verify against. The CA
// certificates themselves are parsed where they are used; one that does
// not parse fails that port closed.
func validateBackendTLS(b *BackendTLS) error {
	if err := checkRef(b.GetPolicy()); err != nil {
		return fmt.Errorf("policy: %w", err)
	}
	if b.GetInvalidReason() != "" {
		return nil // the port's connections are refused, whatever else it says
	}
	if !isDNSName(b.GetHostname()) {
		return fmt.Errorf("hostname %q is not a DNS name", b.GetHostname())
	}
	if (len(b.GetCaCertificates()) > 0) == b.GetSystemRoots() {
		return errors.New("exactly one of CA certificates and system roots is needed")
	}
	for _, san := range b.GetSubjectAltNames() {
		if san.GetValue() == "" {
			return errors.New("empty subject alt name")
		}
		switch san.GetType() {
		case SubjectAltName_HOSTNAME, SubjectAltName_URI:
		default:
			return fmt.Errorf("subject alt name %q: unknown type %d", san.GetValue(), san.GetType())
		}
	}
	return nil
}

// isDNSName: lower-case labels separated by dots.
func isDNSName(s string) bool {
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if !isDNSLabel(l) {
			return false
		}
	}
	return true
}

func validateWaypoint(w *Waypoint) error {
	name := w.GetNamespace() + "/" + w.GetName()
	if err := nonEmpty("waypoint", w.GetNamespace(), w.GetName()); err != nil {
		return err
	}
	if _, err := trust.ParseIdentity(w.GetIdentity()); err != nil {
		return fmt.Errorf("waypoint %s: %w", name, err)
	}
	for _, a := range w.GetAddresses() {
		if err := checkIP(a); err != nil {
			return fmt.Errorf("waypoint %s: address: %w", name, err)
		}
	}
	if err := checkPort(w.GetHbonePort()); err != nil {
		return fmt.Errorf("waypoint %s: HBONE port: %w", name, err)
	}
	switch w.GetWaypointFor() {
	case WaypointForService, WaypointForWorkload, WaypointForAll:
	default:
		return fmt.Errorf("waypoint %s: waypoint-for %q: want service, workload or all", name, w.GetWaypointFor())
	}
	return nil
}

func validateHTTPRoute(r *HTTPRoute) error {
	name := "httproute " + r.GetNamespace() + "/" + r.GetName()
	if err := nonEmpty("httproute", r.GetNamespace(), r.GetName()); err != nil {
		return err
	}
	if err := validateParents(name, r.GetParents()); err != nil {
		return err
	}
	for i, rule := range r.GetRules() {
		for _, m := range rule.GetMatches() {
			if p := m.GetPath(); p != nil {
				switch p.GetType() {
				case PathMatch_REGULAR_EXPRESSION:
					if _, err := regexp.Compile(p.GetValue()); err != nil {
						return fmt.Errorf("%s rule %d: path regex: %w", name, i, err)
					}
				default:
					if !strings.HasPrefix(p.GetValue(), "/") {
						return fmt.Errorf("%s rule %d: path %q must start with /", name, i, p.GetValue())
					}
				}
			}
			if err := validateStringMatches(m.GetHeaders()); err != nil {
				return fmt.Errorf("%s rule %d: header match: %w", name, i, err)
			}
			if err := validateStringMatches(m.GetQueryParams()); err != nil {
				return fmt.Errorf("%s rule %d: query match: %w", name, i, err)
			}
		}
		if err := validateFilters(rule.GetFilters()); err != nil {
			return fmt.Errorf("%s rule %d: %w", name, i, err)
		}
		if err := validateBackends(rule.GetBackends()); err != nil {
			return fmt.Errorf("%s rule %d: %w", name, i, err)
		}
	}
	return nil
}

func validateGRPCRoute(r *GRPCRoute) error {
	name := "grpcroute " + r.GetNamespace() + "/" + r.GetName()
	if err := nonEmpty("grpcroute", r.GetNamespace(), r.GetName()); err != nil {
		return err
	}
	if err := validateParents(name, r.GetParents()); err != nil {
		return err
	}
	for i, rule := range r.GetRules() {
		for _, m := range rule.GetMatches() {
			if mm := m.GetMethod(); mm != nil && mm.GetType() == GRPCMethodMatch_REGULAR_EXPRESSION {
				for _, re := range []string{mm.GetService(), mm.GetMethod()} {
					if _, err := regexp.Compile(re); err != nil {
						return fmt.Errorf("%s rule %d: method regex: %w", name, i, err)
					}
				}
			}
			if err := validateStringMatches(m.GetHeaders()); err != nil {
				return fmt.Errorf("%s rule %d: header match: %w", name, i, err)
			}
		}
		if err := validateFilters(rule.GetFilters()); err != nil {
			return fmt.Errorf("%s rule %d: %w", name, i, err)
		}
		if err := validateBackends(rule.GetBackends()); err != nil {
			return fmt.Errorf("%s rule %d: %w", name, i, err)
		}
	}
	return nil
}

func validateConnectionPolicy(p *ConnectionPolicy) error {
	name := "connection policy " + p.GetNamespace() + "/" + p.GetName()
	if err := nonEmpty("connection policy", p.GetNamespace(), p.GetName()); err != nil {
		return err
	}
	if p.GetInvalidReason() != "" {
		// It denies what it selects, whatever else it says (a refused
		// policy is sent as it was written).
		return nil
	}
	if p.GetPolicy() == "" {
		return fmt.Errorf("%s: no policy set named", name)
	}
	if len(p.GetSelector()) > 0 && len(p.GetTargetGateways()) > 0 {
		return fmt.Errorf("%s: selector and target gateways are exclusive", name)
	}
	if p.GetRevision() == "" || len(p.GetSources()) == 0 {
		return fmt.Errorf("%s: a valid policy carries its revision and files", name)
	}
	return nil
}

// validateIngressGateway checks an ingress Gateway's listeners: ports,
// protocols, hostnames, an HTTPS listener's key pairs present (parsed
// where they are used: one that does not parse fails its listener
// alone), and the routes as the mesh's own.
func validateIngressGateway(g *IngressGateway) error {
	name := "ingress gateway " + g.GetNamespace() + "/" + g.GetName()
	if err := nonEmpty("ingress gateway", g.GetNamespace(), g.GetName()); err != nil {
		return err
	}
	if _, err := trust.ParseIdentity(g.GetIdentity()); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	seen := map[string]bool{}
	for _, l := range g.GetListeners() {
		where := fmt.Sprintf("%s listener %q", name, l.GetName())
		if l.GetName() == "" || seen[l.GetName()] {
			return fmt.Errorf("%s: listener names must be set and unique", where)
		}
		seen[l.GetName()] = true
		if err := checkPort(l.GetPort()); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		if h := l.GetHostname(); h != "" && !isDNSName(strings.TrimPrefix(h, "*.")) {
			return fmt.Errorf("%s: hostname %q is not a DNS name or *.<DNS name>", where, h)
		}
		switch l.GetProtocol() {
		case IngressListener_HTTP:
			if len(l.GetCertificates()) > 0 {
				return fmt.Errorf("%s: an HTTP listener has no certificates", where)
			}
		case IngressListener_HTTPS:
			if len(l.GetCertificates()) == 0 {
				return fmt.Errorf("%s: an HTTPS listener needs a certificate", where)
			}
			for _, kp := range l.GetCertificates() {
				if len(kp.GetCertificateChain()) == 0 || len(kp.GetPrivateKey()) == 0 {
					return fmt.Errorf("%s: key pair of %s: certificate chain and private key are required", where, kp.GetSecret())
				}
				for _, h := range kp.GetHosts() {
					if h != "*" && !isDNSName(strings.TrimPrefix(h, "*.")) {
						return fmt.Errorf("%s: key pair of %s: host %q is not a DNS name, *.<DNS name> or *", where, kp.GetSecret(), h)
					}
				}
			}
		default:
			return fmt.Errorf("%s: unknown protocol %d", where, l.GetProtocol())
		}
		for _, r := range l.GetHttpRoutes() {
			if err := validateHTTPRoute(r); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
		}
		for _, r := range l.GetGrpcRoutes() {
			if err := validateGRPCRoute(r); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
		}
	}
	return nil
}

func validateParents(name string, parents []*ParentRef) error {
	for _, p := range parents {
		if p.GetNamespace() == "" || p.GetName() == "" {
			return fmt.Errorf("%s: parent without namespace or name", name)
		}
		if p.GetPort() > 65535 {
			return fmt.Errorf("%s: parent port %d out of range", name, p.GetPort())
		}
	}
	return nil
}

func validateStringMatches(ms []*StringMatch) error {
	for _, m := range ms {
		if m.GetName() == "" {
			return errors.New("empty name")
		}
		if m.GetType() == StringMatch_REGULAR_EXPRESSION {
			if _, err := regexp.Compile(m.GetValue()); err != nil {
				return fmt.Errorf("%s: %w", m.GetName(), err)
			}
		}
	}
	return nil
}

func validateFilters(fs []*HTTPRouteFilter) error {
	for _, f := range fs {
		switch {
		case f.GetRequestRedirect() != nil:
			switch f.GetRequestRedirect().GetStatusCode() {
			case 0, 301, 302, 303, 307, 308:
			default:
				return fmt.Errorf("redirect status %d not allowed", f.GetRequestRedirect().GetStatusCode())
			}
			if p := f.GetRequestRedirect().GetPort(); p != 0 && checkPort(p) != nil {
				return fmt.Errorf("redirect port %d out of range", p)
			}
		case f.GetRequestMirror() != nil:
			if f.GetRequestMirror().GetBackend() == nil {
				return errors.New("mirror without backend")
			}
			if p := f.GetRequestMirror().Percent; p != nil && (*p < 0 || *p > 100) {
				return fmt.Errorf("mirror percent %v out of range", *p)
			}
		case f.GetFilter() == nil:
			return errors.New("empty filter")
		}
	}
	return nil
}

func validateBackends(bs []*HTTPBackendRef) error {
	for _, b := range bs {
		if b.GetBackend() == nil {
			return errors.New("backend without reference")
		}
		if err := validateFilters(b.GetFilters()); err != nil {
			return fmt.Errorf("backend %s/%s: %w", b.GetBackend().GetNamespace(), b.GetBackend().GetName(), err)
		}
	}
	return nil
}

func nonEmpty(what, namespace, name string) error {
	if namespace == "" || name == "" {
		return fmt.Errorf("%s %s/%s: namespace and name are required", what, namespace, name)
	}
	return nil
}

func checkRef(r *Ref) error {
	if r.GetNamespace() == "" || r.GetName() == "" {
		return errors.New("reference needs namespace and name")
	}
	return nil
}

func checkIP(s string) error {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return fmt.Errorf("%q is not an IP address", s)
	}
	if a.IsUnspecified() {
		return fmt.Errorf("%q is the unspecified address", s)
	}
	return nil
}

func checkPort(p uint32) error {
	if p == 0 || p > 65535 {
		return fmt.Errorf("port %d out of range", p)
	}
	return nil
}

// isDNSLabel: 1-63 lower-case letters, digits and '-', starting and ending
// with a letter or digit (RFC 1123), as a pod's hostname must be.
func isDNSLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
