package config

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// ingressIdentity is the identity an ingress Gateway's pods hold: the
// service account the deployer names after the Gateway, as for waypoints.
// It alone reads the Gateway's TLS keys.
func (t *translator) ingressIdentity(id nsName) (trust.Identity, error) {
	return trust.NewIdentity(t.opts.TrustDomain, id.ns, id.name)
}

// reserveIngressIdentities records every ingress Gateway's identity as a
// gateway's own (Snapshot.IsWaypoint): the CA never grants it to a node
// proxy, and checkPodIdentities refuses an application pod that would hold
// it, since whoever holds it reads the Gateway's private keys. Every
// translation does this, whatever else it holds (Incremental's namespace
// shards see every Gateway).
func (t *translator) reserveIngressIdentities() {
	for _, id := range t.gwOrder {
		if string(t.gateways[id].gw.Spec.GatewayClassName) != IngressClass {
			continue
		}
		if ident, err := t.ingressIdentity(id); err == nil {
			t.out.waypointIdentities[ident.String()] = id.String()
		}
	}
}

// translateIngress builds an IngressGateway for every Gateway of class
// IngressClass: its serving listeners (Listeners: a listener whose
// certificate Secret is missing or malformed is left out, the others
// serve) and the HTTPRoutes and GRPCRoutes whose parentRefs attach them
// (Attach), their hostnames intersected with each listener's.
func (t *translator) translateIngress() {
	httpRules, grpcRules := map[string][]*meshv1.HTTPRouteRule{}, map[string][]*meshv1.GRPCRouteRule{}
	meshHTTPRules := func(k string) ([]*meshv1.HTTPRouteRule, bool) {
		r, ok := t.out.HTTPRoutes[k]
		return r.GetRules(), ok
	}
	meshGRPCRules := func(k string) ([]*meshv1.GRPCRouteRule, bool) {
		r, ok := t.out.GRPCRoutes[k]
		return r.GetRules(), ok
	}
	for _, id := range t.gwOrder {
		g := t.gateways[id]
		if string(g.gw.Spec.GatewayClassName) != IngressClass {
			continue
		}
		ident, err := t.ingressIdentity(id)
		if err != nil {
			t.problem(g.origin, "Gateway "+id.String(), "identity: %v", err)
			continue
		}
		reports := Listeners(g.gw, t.secret, t.grants)
		out := &meshv1.IngressGateway{Name: id.name, Namespace: id.ns, Identity: ident.String()}
		byName := map[gwv1.SectionName]*meshv1.IngressListener{}
		for i, l := range g.gw.Spec.Listeners {
			r := reports[i]
			if !r.Serves() {
				continue
			}
			ml := &meshv1.IngressListener{Name: string(l.Name), Port: uint32(l.Port), Hostname: strings.ToLower(string(hostnameOf(l)))}
			if r.HTTPS {
				ml.Protocol, ml.Certificates = meshv1.IngressListener_HTTPS, r.Certificates
			}
			byName[l.Name] = ml
			out.Listeners = append(out.Listeners, ml)
		}
		meta := func(m *metav1.ObjectMeta) (string, string, *timestamppb.Timestamp) {
			return m.Name, m.Namespace, creationTime(m.CreationTimestamp.Time)
		}
		for _, r := range t.httpRoutes {
			m, s := &r.route.ObjectMeta, &r.route.Spec
			attachIngress(t, g.gw, reports, httpRules, meshHTTPRules, r.origin, "HTTPRoute", m, s.ParentRefs, s.Hostnames, s.Rules, t.httpRule,
				func(l gwv1.SectionName, hosts []string, rules []*meshv1.HTTPRouteRule) {
					if byName[l] == nil {
						return // attached, but the listener does not serve
					}
					hr := &meshv1.HTTPRoute{Hostnames: hosts, Rules: rules}
					hr.Name, hr.Namespace, hr.CreationTime = meta(m)
					byName[l].HttpRoutes = append(byName[l].HttpRoutes, hr)
				})
		}
		for _, r := range t.grpcRoutes {
			m, s := &r.route.ObjectMeta, &r.route.Spec
			attachIngress(t, g.gw, reports, grpcRules, meshGRPCRules, r.origin, "GRPCRoute", m, s.ParentRefs, s.Hostnames, s.Rules, t.grpcRule,
				func(l gwv1.SectionName, hosts []string, rules []*meshv1.GRPCRouteRule) {
					if byName[l] == nil {
						return // attached, but the listener does not serve
					}
					gr := &meshv1.GRPCRoute{Hostnames: hosts, Rules: rules}
					gr.Name, gr.Namespace, gr.CreationTime = meta(m)
					byName[l].GrpcRoutes = append(byName[l].GrpcRoutes, gr)
				})
		}
		t.translateIngresses(id, g.gw, reports, byName)
		t.out.IngressGateways[id.String()] = out
	}
}

// attachIngress calls add for each listener of ingress Gateway gw that a
// route's parentRefs naming it attach it to (once a listener), with the
// route's hostnames there and its rules: those the mesh's translation
// made when it serves the route too (meshRules, by "<namespace>/<name>"),
// else translated here once (cache), so that a problem is reported once.
// A refused route attaches nowhere (its status says why).
func attachIngress[GR, R any](t *translator, gw *gwv1.Gateway, reports []ListenerReport, cache map[string][]R, meshRules func(string) ([]R, bool),
	origin, kind string, m *metav1.ObjectMeta, refs []gwv1.ParentReference, hs []gwv1.Hostname, rules []GR, rule func(routeCtx, int, GR) R,
	add func(listener gwv1.SectionName, hostnames []string, rules []R)) {
	var atts []Attachment
	seen := map[gwv1.SectionName]bool{}
	for _, ref := range refs {
		if !namesGateway(ref, m.Namespace, gw) {
			continue
		}
		as, _, _ := Attach(gw, reports, ref, kind, m.Namespace, t.namespaces[m.Namespace].labels(), hs)
		for _, a := range as {
			if !seen[a.Listener] {
				seen[a.Listener] = true
				atts = append(atts, a)
			}
		}
	}
	key := m.Namespace + "/" + m.Name
	if len(atts) == 0 || t.refused(kind+" "+key) {
		return
	}
	rs, ok := cache[key]
	if !ok {
		if rs, ok = meshRules(key); !ok {
			rs = translateRules(newRouteCtx(origin, kind, m), m, nil, rules, rule).rules
		}
		cache[key] = rs
	}
	if t.refused(kind + " " + key) {
		return
	}
	for _, a := range atts {
		add(a.Listener, a.Hostnames, rs)
	}
}

// namesGateway: parentRef ref of a route in namespace routeNS names gw.
func namesGateway(ref gwv1.ParentReference, routeNS string, gw *gwv1.Gateway) bool {
	if ref.Group != nil && string(*ref.Group) != gatewayGroup || ref.Kind != nil && *ref.Kind != "Gateway" {
		return false
	}
	ns := routeNS
	if ref.Namespace != nil && *ref.Namespace != "" {
		ns = string(*ref.Namespace)
	}
	return ns == gw.Namespace && string(ref.Name) == gw.Name
}

// secret is the translation's SecretLookup.
func (t *translator) secret(ns, name string) *corev1.Secret { return t.secrets[nsName{ns, name}] }
