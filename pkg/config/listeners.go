package config

import (
	"crypto/tls"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// Ports an ingress Gateway's pods hold for themselves (readiness and
// metrics, as a waypoint's), so no listener may take them.
var ingressReservedPorts = map[gwv1.PortNumber]string{15020: "metrics", 15021: "readiness"}

// ListenerReport is one listener of an ingress Gateway as the translation
// resolved it: its status conditions (Gateway API reasons) and, for a
// listener that serves, what it serves with.
type ListenerReport struct {
	Name  gwv1.SectionName
	HTTPS bool
	// Accepted false: the listener cannot serve at all (AcceptedReason says
	// why). Conflicted true: it shares its port with another listener in a
	// way the spec forbids, and serves nothing (ConflictedReason).
	Accepted         bool
	AcceptedReason   gwv1.ListenerConditionReason
	Conflicted       bool
	ConflictedReason gwv1.ListenerConditionReason
	// ResolvedRefs false: a certificate or route kind it names is not
	// usable (RefsReason, Message). A listener whose every certificate
	// failed serves nothing; the Gateway's other listeners are unaffected.
	ResolvedRefs bool
	RefsReason   gwv1.ListenerConditionReason
	Message      string
	// SupportedKinds are the route kinds it accepts (status.supportedKinds).
	SupportedKinds []gwv1.RouteGroupKind
	// Certificates are an HTTPS listener's key pairs that resolved (they
	// parse and match), in spec order (the first one whose names match a
	// client's SNI serves it). They hold private keys: never log them.
	Certificates []*meshv1.TLSKeyPair
}

// Serves says whether the listener takes connections.
func (l ListenerReport) Serves() bool {
	return l.Attachable() && (!l.HTTPS || len(l.Certificates) > 0)
}

// Attachable says whether routes attach to the listener (and count in its
// attachedRoutes): it is accepted and not conflicted. Attachment depends
// only on the listener's allowedRoutes and the route's parentRefs, so an
// HTTPS listener whose certificates do not resolve takes routes too,
// though it serves none of them until they do.
func (l ListenerReport) Attachable() bool {
	return l.Accepted && !l.Conflicted
}

// SecretLookup finds a Secret by namespace and name (nil: not found).
type SecretLookup func(ns, name string) *corev1.Secret

// Listeners resolves an ingress Gateway's listeners: protocol (HTTP or
// HTTPS, TLS terminated), port conflicts, the kinds allowedRoutes names,
// and an HTTPS listener's certificates from Secrets of type
// kubernetes.io/tls, another namespace's only when a ReferenceGrant there
// lets Gateways of the Gateway's namespace refer to it. grants are the
// ReferenceGrants by namespace. A listener's problem is its own: the
// others resolve as if it were not there, except that listeners sharing a
// port conflict whatever else is wrong with them.
func Listeners(gw *gwv1.Gateway, secrets SecretLookup, grants map[string][]*gwv1.ReferenceGrant) []ListenerReport {
	out := make([]ListenerReport, len(gw.Spec.Listeners))
	for i, l := range gw.Spec.Listeners {
		r := ListenerReport{Name: l.Name, HTTPS: l.Protocol == gwv1.HTTPSProtocolType, Accepted: true, AcceptedReason: gwv1.ListenerReasonAccepted,
			ResolvedRefs: true, RefsReason: gwv1.ListenerReasonResolvedRefs}
		switch {
		case l.Protocol != gwv1.HTTPProtocolType && l.Protocol != gwv1.HTTPSProtocolType:
			r.Accepted, r.AcceptedReason = false, gwv1.ListenerReasonUnsupportedProtocol
			r.Message = fmt.Sprintf("protocol %s is not supported: HTTP or HTTPS", l.Protocol)
		case ingressReservedPorts[l.Port] != "":
			r.Accepted, r.AcceptedReason = false, gwv1.ListenerReasonPortUnavailable
			r.Message = fmt.Sprintf("port %d is the gateway's own (%s)", l.Port, ingressReservedPorts[l.Port])
		}
		r.SupportedKinds, r.RefsReason, r.Message = routeKinds(l, r.Message)
		r.ResolvedRefs = r.RefsReason == gwv1.ListenerReasonResolvedRefs
		if r.Accepted && l.Protocol == gwv1.HTTPSProtocolType {
			certificates(gw, l, secrets, grants, &r)
		}
		if r.AcceptedReason == gwv1.ListenerReasonUnsupportedProtocol {
			// No route kind is served over a protocol the gateway does not
			// speak (empty, not null: the field is required).
			r.SupportedKinds = []gwv1.RouteGroupKind{}
		}
		out[i] = r
	}
	markConflicts(gw.Spec.Listeners, out)
	return out
}

// routeKinds are the route kinds a listener accepts: those allowedRoutes
// names that the ingress serves (HTTPRoute, GRPCRoute), or both when it
// names none. Any other kind makes ResolvedRefs false (InvalidRouteKinds).
func routeKinds(l gwv1.Listener, msg string) ([]gwv1.RouteGroupKind, gwv1.ListenerConditionReason, string) {
	group := gwv1.Group(gatewayGroup)
	served := []gwv1.RouteGroupKind{{Group: &group, Kind: "HTTPRoute"}, {Group: &group, Kind: "GRPCRoute"}}
	if l.AllowedRoutes == nil || len(l.AllowedRoutes.Kinds) == 0 {
		return served, gwv1.ListenerReasonResolvedRefs, msg
	}
	kinds := []gwv1.RouteGroupKind{}
	reason := gwv1.ListenerReasonResolvedRefs
	for _, k := range l.AllowedRoutes.Kinds {
		if (k.Group == nil || *k.Group == group) && (k.Kind == "HTTPRoute" || k.Kind == "GRPCRoute") {
			kinds = append(kinds, gwv1.RouteGroupKind{Group: &group, Kind: k.Kind})
			continue
		}
		g := gatewayGroup
		if k.Group != nil {
			g = string(*k.Group)
		}
		reason = gwv1.ListenerReasonInvalidRouteKinds
		msg = join(msg, fmt.Sprintf("route kind %s/%s is not supported: HTTPRoute or GRPCRoute", g, k.Kind))
	}
	return kinds, reason, msg
}

// certificates resolves an HTTPS listener's certificateRefs into r.
func certificates(gw *gwv1.Gateway, l gwv1.Listener, secrets SecretLookup, grants map[string][]*gwv1.ReferenceGrant, r *ListenerReport) {
	fail := func(reason gwv1.ListenerConditionReason, format string, args ...any) {
		r.ResolvedRefs = false
		// A kind problem stays the reason; the messages add up.
		if r.RefsReason == gwv1.ListenerReasonResolvedRefs {
			r.RefsReason = reason
		}
		r.Message = join(r.Message, fmt.Sprintf(format, args...))
	}
	if l.TLS == nil || len(l.TLS.CertificateRefs) == 0 {
		fail(gwv1.ListenerReasonInvalidCertificateRef, "an HTTPS listener needs tls.certificateRefs")
		return
	}
	if l.TLS.Mode != nil && *l.TLS.Mode != gwv1.TLSModeTerminate {
		r.Accepted, r.AcceptedReason = false, gwv1.ListenerReasonUnsupportedProtocol
		r.Message = join(r.Message, fmt.Sprintf("tls.mode %s is not supported on HTTPS: Terminate", *l.TLS.Mode))
		return
	}
	for _, ref := range l.TLS.CertificateRefs {
		ns := gw.Namespace
		if ref.Namespace != nil && *ref.Namespace != "" {
			ns = string(*ref.Namespace)
		}
		name := fmt.Sprintf("%s/%s", ns, ref.Name)
		switch {
		case ref.Group != nil && !isCoreGroup(string(*ref.Group)) || ref.Kind != nil && *ref.Kind != "Secret":
			fail(gwv1.ListenerReasonInvalidCertificateRef, "certificateRef %s: only core Secrets are supported", name)
			continue
		case ns != gw.Namespace && !grantAllows(grants[ns], "Gateway", gw.Namespace, "", "Secret", string(ref.Name)):
			fail(gwv1.ListenerReasonRefNotPermitted, "certificateRef %s: no ReferenceGrant in %s lets Gateways of %s refer to it", name, ns, gw.Namespace)
			continue
		}
		s := secrets(ns, string(ref.Name))
		if s == nil {
			fail(gwv1.ListenerReasonInvalidCertificateRef, "certificateRef %s: Secret not found", name)
			continue
		}
		if s.Type != corev1.SecretTypeTLS {
			fail(gwv1.ListenerReasonInvalidCertificateRef, "certificateRef %s: Secret of type %q, want %s", name, s.Type, corev1.SecretTypeTLS)
			continue
		}
		chain, key := s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]
		if _, err := tls.X509KeyPair(chain, key); err != nil {
			// crypto/tls's errors name what is wrong, never the key's bytes.
			fail(gwv1.ListenerReasonInvalidCertificateRef, "certificateRef %s: malformed %s/%s: %v", name, corev1.TLSCertKey, corev1.TLSPrivateKeyKey, err)
			continue
		}
		r.Certificates = append(r.Certificates, &meshv1.TLSKeyPair{Secret: name, CertificateChain: chain, PrivateKey: key})
	}
}

// markConflicts marks listeners sharing a port: with different protocols
// (ProtocolConflict), or with the same protocol and hostname
// (HostnameConflict). Listeners of one port and protocol with different
// hostnames share it (listener isolation picks by hostname).
func markConflicts(ls []gwv1.Listener, out []ListenerReport) {
	for i := range ls {
		for j := range ls {
			if i == j || ls[i].Port != ls[j].Port {
				continue
			}
			switch {
			case ls[i].Protocol != ls[j].Protocol:
				out[i].Conflicted, out[i].ConflictedReason = true, gwv1.ListenerReasonProtocolConflict
			case hostnameOf(ls[i]) == hostnameOf(ls[j]) && !out[i].Conflicted:
				out[i].Conflicted, out[i].ConflictedReason = true, gwv1.ListenerReasonHostnameConflict
			}
		}
	}
}

func hostnameOf(l gwv1.Listener) gwv1.Hostname {
	if l.Hostname == nil {
		return ""
	}
	return *l.Hostname
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// grantAllows: one of grants (a namespace's ReferenceGrants) lets objects
// of fromKind (Gateway API group) in fromNS refer to the object of
// toGroup/toKind named toName in the grants' namespace.
func grantAllows(grants []*gwv1.ReferenceGrant, fromKind, fromNS, toGroup, toKind, toName string) bool {
	for _, g := range grants {
		from, to := false, false
		for _, f := range g.Spec.From {
			if string(f.Group) == gatewayGroup && string(f.Kind) == fromKind && string(f.Namespace) == fromNS {
				from = true
			}
		}
		for _, tt := range g.Spec.To {
			if (string(tt.Group) == toGroup || isCoreGroup(toGroup) && isCoreGroup(string(tt.Group))) &&
				string(tt.Kind) == toKind && (tt.Name == nil || string(*tt.Name) == toName) {
				to = true
			}
		}
		if from && to {
			return true
		}
	}
	return false
}

// GatewayRejection says why an ingress Gateway is not accepted as a whole
// for what its spec asks beyond its listeners (empty: nothing): an address
// it cannot hold, or infrastructure parameters (an ingress Gateway takes
// none). Its addresses are its Service's: IPAddress entries only, either
// without a value (the address the cluster assigns) or with one, which
// the operator must allow static addresses for (pool; whether this one is
// in the pool is Programmed's matter, ResolveAddresses). The deployer runs
// no pods for a rejected Gateway.
func GatewayRejection(gw *gwv1.Gateway, pool AddressPool) (gwv1.GatewayConditionReason, string) {
	for _, a := range gw.Spec.Addresses {
		if a.Type != nil && *a.Type != gwv1.IPAddressType {
			return gwv1.GatewayReasonUnsupportedAddress,
				fmt.Sprintf("spec.addresses: type %s: an ingress gateway holds only IPAddress addresses (its Service's)", *a.Type)
		}
		if a.Value == "" {
			continue
		}
		if ip, err := netip.ParseAddr(a.Value); err != nil || ip.Zone() != "" {
			return gwv1.GatewayReasonUnsupportedAddress, fmt.Sprintf("spec.addresses: %q is not an IP address", a.Value)
		}
		if pool.Empty() {
			return gwv1.GatewayReasonUnsupportedAddress,
				fmt.Sprintf("spec.addresses: %s: the operator allows no static addresses (control plane flag --gateway-address-cidrs); ask for an IPAddress without a value to get the one the cluster assigns to the gateway's Service", a.Value)
		}
	}
	if inf := gw.Spec.Infrastructure; inf != nil && inf.ParametersRef != nil {
		p := inf.ParametersRef
		return gwv1.GatewayReasonInvalidParameters,
			fmt.Sprintf("infrastructure.parametersRef %s/%s %s: an ingress gateway takes no parameters (its Service type is annotation causeway.dev/service-type; labels and annotations are infrastructure.labels and .annotations)", p.Group, p.Kind, p.Name)
	}
	return "", ""
}
