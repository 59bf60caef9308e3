package config

import (
	"crypto/tls"
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	networkingv1beta1 "k8s.io/api/networking/v1beta1"
	"k8s.io/apimachinery/pkg/util/validation"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// Kubernetes Ingress objects (networking.k8s.io/v1), translated onto the
// ingress Gateway that serves them, as Istio does: an IngressClass whose
// spec.controller is IngressClassController names, in spec.parameters, a
// Gateway of class IngressClass (DefaultIngressGateway when it names
// none); every Ingress of that IngressClass (by spec.ingressClassName, or
// without one when the class is the cluster's only default) becomes
// HTTPRoutes of that Gateway's IngressGateway, attached to its listeners
// as an HTTPRoute of the Ingress's namespace would be (allowedRoutes and
// hostnames apply), and its spec.tls key pairs serve its hosts on the
// Gateway's HTTPS listeners.
const (
	// IngressClassController is spec.controller of the IngressClasses this
	// mesh serves.
	IngressClassController = "causeway.dev/ingress-controller"
	// DefaultIngressGatewayNamespace/Name is the Gateway an IngressClass of
	// ours without spec.parameters names.
	DefaultIngressGatewayNamespace = "causeway-system"
	DefaultIngressGatewayName      = "causeway-ingress"
)

// ingressClassInfo is an IngressClass of ours and the Gateway it names
// (gateway nil: the class is refused, its Ingresses are not served).
type ingressClassInfo struct {
	origin  string
	class   *networkingv1.IngressClass
	gateway *nsName
}

// resolveIngressClasses finds the Gateway of each IngressClass of ours. A
// class naming anything but a Gateway (namespace-scoped, of class
// IngressClass) is refused.
func (t *translator) resolveIngressClasses() {
	for _, name := range sortedKeys(t.ingressClasses) {
		c := t.ingressClasses[name]
		obj := "IngressClass " + name
		gw := nsName{DefaultIngressGatewayNamespace, DefaultIngressGatewayName}
		if p := c.class.Spec.Parameters; p != nil {
			switch {
			case p.APIGroup == nil || *p.APIGroup != gatewayGroup || p.Kind != "Gateway":
				t.problem(c.origin, obj, "spec.parameters must name a Gateway (apiGroup %s, kind Gateway)", gatewayGroup)
				continue
			case p.Scope == nil || *p.Scope != networkingv1.IngressClassParametersReferenceScopeNamespace || p.Namespace == nil || *p.Namespace == "":
				t.problem(c.origin, obj, "spec.parameters: a Gateway is namespaced: scope Namespace and a namespace are required")
				continue
			}
			gw = nsName{*p.Namespace, p.Name}
		}
		g := t.gateways[gw]
		switch {
		case g == nil:
			t.problem(c.origin, obj, "Gateway %s not found", gw)
		case string(g.gw.Spec.GatewayClassName) != IngressClass:
			t.problem(c.origin, obj, "Gateway %s is of class %s, not %s", gw, g.gw.Spec.GatewayClassName, IngressClass)
		default:
			c.gateway = &gw
		}
	}
}

// ingressClassOf is the IngressClass of ours that ing belongs to, or nil:
// spec.ingressClassName (else the legacy annotation), or, without either,
// the default class when exactly one class of the cluster is marked so and
// it is ours.
func (t *translator) ingressClassOf(ing *networkingv1.Ingress) *ingressClassInfo {
	name := ing.Annotations[networkingv1beta1.AnnotationIngressClass] // deprecated, still honoured by the API server's defaulting
	if ing.Spec.IngressClassName != nil {
		name = *ing.Spec.IngressClassName
	}
	if name != "" {
		return t.ingressClasses[name]
	}
	if len(t.defaultIngressClasses) == 1 {
		return t.ingressClasses[t.defaultIngressClasses[0]]
	}
	return nil
}

// translateIngresses adds every Ingress that the IngressClass of ingress
// Gateway id serves to out, the IngressGateway of id (whose listeners
// resolved to reports; byName holds those that serve). A refused Ingress
// serves nowhere.
func (t *translator) translateIngresses(id nsName, gw *gwv1.Gateway, reports []ListenerReport, byName map[gwv1.SectionName]*meshv1.IngressListener) {
	for _, ii := range t.ingresses {
		ing := ii.route
		c := t.ingressClassOf(ing)
		if c == nil || c.gateway == nil || *c.gateway != id {
			continue
		}
		key := ing.Namespace + "/" + ing.Name
		obj := "Ingress " + key
		t.reportIngress(key, IngressReport{})
		routes, certs := t.ingressRoutes(ii.origin, obj, ing), t.ingressCertificates(ii.origin, obj, ing)
		if t.refused(obj) {
			continue
		}
		ref := gwv1.ParentReference{Name: gwv1.ObjectName(gw.Name)}
		attached := map[gwv1.SectionName]bool{} // and serving
		var listeners []gwv1.SectionName
		var why string
		for _, r := range routes {
			hs := make([]gwv1.Hostname, len(r.Hostnames))
			for i, h := range r.Hostnames {
				hs[i] = gwv1.Hostname(h)
			}
			as, _, msg := Attach(gw, reports, ref, "HTTPRoute", ing.Namespace, t.namespaces[ing.Namespace].labels(), hs)
			for _, a := range as {
				if !slices.Contains(listeners, a.Listener) {
					listeners = append(listeners, a.Listener)
				}
				l := byName[a.Listener]
				if l == nil {
					why = fmt.Sprintf("listener %s does not serve (its certificates do not resolve)", a.Listener)
					continue
				}
				hr := &meshv1.HTTPRoute{Name: r.Name, Namespace: r.Namespace, CreationTime: r.CreationTime, Hostnames: a.Hostnames, Rules: r.Rules}
				l.HttpRoutes = append(l.HttpRoutes, hr)
				attached[a.Listener] = true
			}
			if len(as) == 0 {
				why = msg
			}
		}
		if len(attached) == 0 && len(routes) > 0 {
			t.problem(ii.origin, obj, "not served by Gateway %s: %s", id, why)
			continue
		}
		t.reportIngress(key, IngressReport{Gateway: id.String(), Listeners: listeners})
		// After the listener's own, which serve clients without SNI and
		// come first for the names they cover; these serve only their
		// hosts (meshv1.IngressListener.certificates).
		for _, n := range sortedKeys(attached) {
			if l := byName[n]; l.Protocol == meshv1.IngressListener_HTTPS {
				l.Certificates = append(l.Certificates, certs...)
			}
		}
	}
}

// reportIngress records where Ingress key is served.
func (t *translator) reportIngress(key string, r IngressReport) {
	if t.reports != nil {
		t.reports.Ingresses[key] = r
	}
}

func sortedKeys[K ~string, V any](m map[K]V) []K {
	ks := make([]K, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	return ks
}

// ingressRoutes translates an Ingress's rules into one HTTPRoute per host
// (in the order the rules name them, then one for any host): the host's
// paths, then those of rules without a host (they apply to every host),
// then defaultBackend for any path (PathPrefix "/", the least precedence).
// Every problem refuses the Ingress (problem on obj).
func (t *translator) ingressRoutes(origin, obj string, ing *networkingv1.Ingress) []*meshv1.HTTPRoute {
	var hosts []string
	byHost := map[string][]*meshv1.HTTPRouteRule{}
	for i, r := range ing.Spec.Rules {
		where := fmt.Sprintf("rule %d", i)
		h := strings.ToLower(r.Host)
		if h != "" && !t.ingressHost(origin, obj, where, h) {
			continue
		}
		if _, ok := byHost[h]; !ok && h != "" {
			hosts = append(hosts, h) // a host without paths still gets its route
			byHost[h] = nil
		}
		if r.HTTP == nil {
			continue
		}
		for j, p := range r.HTTP.Paths {
			if rule := t.ingressPath(origin, obj, fmt.Sprintf("%s path %d", where, j), ing, p); rule != nil {
				byHost[h] = append(byHost[h], rule)
			}
		}
	}
	var fallback []*meshv1.HTTPRouteRule
	if b := ing.Spec.DefaultBackend; b != nil {
		if be := t.ingressBackend(origin, obj, "defaultBackend", ing, *b); be != nil {
			fallback = []*meshv1.HTTPRouteRule{{
				Matches:  []*meshv1.HTTPRouteMatch{{Path: &meshv1.PathMatch{Type: meshv1.PathMatch_PATH_PREFIX, Value: "/"}}},
				Backends: []*meshv1.HTTPBackendRef{{Backend: be, Weight: 1}},
			}}
		}
	}
	var routes []*meshv1.HTTPRoute
	add := func(hostnames []string, rules []*meshv1.HTTPRouteRule) {
		if len(rules) == 0 {
			return
		}
		routes = append(routes, &meshv1.HTTPRoute{Name: ing.Name, Namespace: ing.Namespace, CreationTime: creationTime(ing.CreationTimestamp.Time),
			Hostnames: hostnames, Rules: rules})
	}
	anyHost := append(append([]*meshv1.HTTPRouteRule(nil), byHost[""]...), fallback...)
	for _, h := range hosts {
		add([]string{h}, append(append([]*meshv1.HTTPRouteRule(nil), byHost[h]...), anyHost...))
	}
	add(nil, anyHost)
	return routes
}

// CheckIngress runs the translation's checks of an Ingress that need no
// other object (hosts, paths and their types, the form of its backends,
// the hosts of its tls entries), for the admission webhook: what it
// returns, the translation would refuse wherever the Ingress is served.
// Its Services and Secrets are not looked up (they may come later).
func CheckIngress(ing *networkingv1.Ingress) []string {
	t := newTranslator(Options{})
	const obj = "Ingress"
	t.ingressRoutes("", obj, ing)
	for i, e := range ing.Spec.TLS {
		for _, h := range e.Hosts {
			t.ingressHost("", obj, fmt.Sprintf("tls %d", i), strings.ToLower(h))
		}
	}
	return t.reasons[obj]
}

// ingressHost checks a rule's or tls entry's host: a DNS name, or one
// whose first label alone is "*" (a wildcard for one label or more, as a
// Gateway API hostname's).
func (t *translator) ingressHost(origin, obj, where, h string) bool {
	var errs []string
	if strings.HasPrefix(h, "*.") {
		errs = validation.IsWildcardDNS1123Subdomain(h)
	} else {
		errs = validation.IsDNS1123Subdomain(h)
	}
	if len(errs) > 0 {
		t.problem(origin, obj, "%s: host %q: %s", where, h, strings.Join(errs, "; "))
		return false
	}
	return true
}

// ingressPath translates one path of a rule. Prefix is the Ingress spec's
// element-wise prefix (the l7 engine's PathPrefix: /foo matches /foo and
// /foo/bar, not /foobar); ImplementationSpecific means Prefix here.
func (t *translator) ingressPath(origin, obj, where string, ing *networkingv1.Ingress, p networkingv1.HTTPIngressPath) *meshv1.HTTPRouteRule {
	path := p.Path
	if path == "" {
		path = "/"
	}
	if !strings.HasPrefix(path, "/") {
		t.problem(origin, obj, "%s: path %q must begin with /", where, p.Path)
		return nil
	}
	m := &meshv1.PathMatch{Type: meshv1.PathMatch_PATH_PREFIX, Value: path}
	switch {
	case p.PathType == nil:
		t.problem(origin, obj, "%s: pathType is required (Exact, Prefix or ImplementationSpecific)", where)
		return nil
	case *p.PathType == networkingv1.PathTypeExact:
		m.Type = meshv1.PathMatch_EXACT
	case *p.PathType != networkingv1.PathTypePrefix && *p.PathType != networkingv1.PathTypeImplementationSpecific:
		t.problem(origin, obj, "%s: unknown pathType %q: Exact, Prefix or ImplementationSpecific", where, *p.PathType)
		return nil
	}
	be := t.ingressBackend(origin, obj, where, ing, p.Backend)
	if be == nil {
		return nil
	}
	return &meshv1.HTTPRouteRule{Matches: []*meshv1.HTTPRouteMatch{{Path: m}}, Backends: []*meshv1.HTTPBackendRef{{Backend: be, Weight: 1}}}
}

// ingressBackend is a backend Service of the Ingress's namespace, its port
// by number or by name. A Service that does not exist is no problem (it
// may come later): the gateway answers its requests 503 meanwhile; a port
// name that it does not have is one.
func (t *translator) ingressBackend(origin, obj, where string, ing *networkingv1.Ingress, b networkingv1.IngressBackend) *meshv1.BackendRef {
	if b.Resource != nil {
		t.problem(origin, obj, "%s: resource backends are not supported: a Service is required", where)
		return nil
	}
	if b.Service == nil || b.Service.Name == "" {
		t.problem(origin, obj, "%s: a backend Service name is required", where)
		return nil
	}
	out := &meshv1.BackendRef{Namespace: ing.Namespace, Name: b.Service.Name}
	port := b.Service.Port
	switch {
	case port.Number != 0 && port.Name != "", port.Number == 0 && port.Name == "":
		t.problem(origin, obj, "%s: Service %s: exactly one of port number and port name is required", where, b.Service.Name)
		return nil
	case port.Number < 0 || port.Number > 65535:
		t.problem(origin, obj, "%s: Service %s: port %d is not a port", where, b.Service.Name, port.Number)
		return nil
	case port.Number != 0:
		out.Port = uint32(port.Number)
		return out
	}
	s := t.services[nsName{ing.Namespace, b.Service.Name}]
	if s == nil {
		return out // no port to resolve the name with; its requests get 503
	}
	for _, sp := range s.svc.Spec.Ports {
		if sp.Name == port.Name {
			out.Port = uint32(sp.Port)
			return out
		}
	}
	t.problem(origin, obj, "%s: Service %s has no port named %q", where, b.Service.Name, port.Name)
	return nil
}

// ingressCertificates resolves spec.tls: each entry's Secret, of type
// kubernetes.io/tls in the Ingress's own namespace (an Ingress needs no
// ReferenceGrant), must hold a key pair whose certificate is valid for
// every host the entry names. The key pair carries those hosts, the only
// names the gateway serves it for ("*": any, for an entry naming none).
func (t *translator) ingressCertificates(origin, obj string, ing *networkingv1.Ingress) []*meshv1.TLSKeyPair {
	var out []*meshv1.TLSKeyPair
	for i, e := range ing.Spec.TLS {
		where := fmt.Sprintf("tls %d", i)
		if e.SecretName == "" {
			t.problem(origin, obj, "%s: secretName is required", where)
			continue
		}
		name := ing.Namespace + "/" + e.SecretName
		s := t.secrets[nsName{ing.Namespace, e.SecretName}]
		switch {
		case s == nil:
			t.problem(origin, obj, "%s: Secret %s not found", where, name)
			continue
		case s.Type != corev1.SecretTypeTLS:
			t.problem(origin, obj, "%s: Secret %s of type %q, want %s", where, name, s.Type, corev1.SecretTypeTLS)
			continue
		}
		chain, key := s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]
		kp, err := tls.X509KeyPair(chain, key)
		if err != nil {
			// crypto/tls's errors name what is wrong, never the key's bytes.
			t.problem(origin, obj, "%s: Secret %s: malformed %s/%s: %v", where, name, corev1.TLSCertKey, corev1.TLSPrivateKeyKey, err)
			continue
		}
		ok, hosts := true, []string{}
		for _, h := range e.Hosts {
			h = strings.ToLower(h)
			if !t.ingressHost(origin, obj, where, h) {
				ok = false
			} else if err := kp.Leaf.VerifyHostname(h); err != nil {
				t.problem(origin, obj, "%s: the certificate of Secret %s is not valid for host %s", where, name, h)
				ok = false
			} else if !slices.Contains(hosts, h) {
				hosts = append(hosts, h)
			}
		}
		if len(e.Hosts) == 0 {
			hosts = []string{"*"} // the Ingress API's default: the controller's wildcard
		}
		if ok {
			out = append(out, &meshv1.TLSKeyPair{Secret: name, CertificateChain: chain, PrivateKey: key, Hosts: hosts})
		}
	}
	return out
}
