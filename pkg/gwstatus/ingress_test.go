package gwstatus

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/backendtls/backendtlstest"
	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/internal/kubetest"
)

// secret creates a Secret of type typ with the data.
func (f *fixture) secret(ns, name string, typ corev1.SecretType, data map[string][]byte) {
	f.t.Helper()
	if _, err := f.cs.CoreV1().Secrets(ns).Create(f.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Type: typ, Data: data},
		metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// ingressDeployment makes the deployer's Deployment (replicas, none
// ready) and LoadBalancer Service for ingress Gateway gw.
func (f *fixture) ingressDeployment(gw *gwv1.Gateway, replicas int32) *corev1.Service {
	f.t.Helper()
	owner, sel := f.gatewayDeployment(gw, replicas)
	svc, err := f.cs.CoreV1().Services(gw.Namespace).Create(f.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: gw.Name, Labels: sel, OwnerReferences: []metav1.OwnerReference{owner}},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: sel, Ports: []corev1.ServicePort{{Name: "http-80", Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return svc
}

// ingressFixture starts the status writer with the ingress GatewayClass
// ours and the namespaces made.
func ingressFixture(t *testing.T, namespaces ...string) *fixture {
	return ingressFixtureWithAddresses(t, config.AddressPool{}, namespaces...)
}

// ingressFixtureWithAddresses is ingressFixture with the static addresses
// of pool allowed.
func ingressFixtureWithAddresses(t *testing.T, pool config.AddressPool, namespaces ...string) *fixture {
	f := newFixture(t)
	f.startWriter(func(o *Options) { o.Addresses = pool })
	f.create(`
kind: GatewayClass
metadata: {name: causeway}
spec: {controllerName: causeway.dev/gateway-controller}
`)
	for _, n := range namespaces {
		f.create(fmt.Sprintf("kind: Namespace\nmetadata: {name: %s}\n", n))
	}
	return f
}

func listenerStatus(gw *gwv1.Gateway, name string) *gwv1.ListenerStatus {
	for i := range gw.Status.Listeners {
		if gw.Status.Listeners[i].Name == gwv1.SectionName(name) {
			return &gw.Status.Listeners[i]
		}
	}
	return nil
}

func ingressParentOf(r *gwv1.HTTPRoute) *gwv1.RouteParentStatus {
	for i := range r.Status.Parents {
		if r.Status.Parents[i].ControllerName == IngressControllerName {
			return &r.Status.Parents[i]
		}
	}
	return nil
}

// An ingress Gateway's status: each listener's own conditions (a missing,
// malformed, unpermitted or non-TLS certificate Secret is that listener's
// ResolvedRefs=False, and the others serve), the routes attached to each
// (a listener that cannot serve for its certificates takes routes too),
// the route's entry for the Gateway (Attach's reasons), the Service's
// address (its load balancer's once set), Programmed once a pod is ready.
func TestIngressGatewayStatus(t *testing.T) {
	const ns, certs, other = "st-in", "st-in-certs", "st-in-other"
	f := ingressFixture(t, ns, certs, other)
	_, good := backendtlstest.TLSSecretData(t, "shop.example.com")
	f.secret(certs, "shop-cert", corev1.SecretTypeTLS, good)
	f.secret(certs, "ungranted", corev1.SecretTypeTLS, good)
	f.secret(ns, "malformed", corev1.SecretTypeTLS, map[string][]byte{corev1.TLSCertKey: []byte("not PEM"), corev1.TLSPrivateKeyKey: good[corev1.TLSPrivateKeyKey]})
	// Not kubernetes.io/tls: the control plane never sees it.
	f.secret(ns, "opaque", corev1.SecretTypeOpaque, good)
	f.create(fmt.Sprintf(`
kind: ReferenceGrant
metadata: {name: gateways-of-st-in, namespace: %s}
spec:
  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: %s}]
  to: [{group: "", kind: Secret, name: shop-cert}]
`, certs, ns))
	f.create(fmt.Sprintf(`
kind: Gateway
metadata: {name: edge, namespace: %[1]s}
spec:
  gatewayClassName: causeway
  listeners:
  - {name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}
  - name: https
    port: 443
    protocol: HTTPS
    hostname: shop.example.com
    tls: {certificateRefs: [{name: shop-cert, namespace: %[2]s}]}
  - {name: malformed, port: 8443, protocol: HTTPS, tls: {certificateRefs: [{name: malformed}]}}
  - {name: ungranted, port: 9443, protocol: HTTPS, tls: {certificateRefs: [{name: ungranted, namespace: %[2]s}]}}
  - {name: opaque, port: 10443, protocol: HTTPS, tls: {certificateRefs: [{name: opaque}]}}
`, ns, certs))
	f.create(fmt.Sprintf(`
kind: HTTPRoute
metadata: {name: shop, namespace: %s}
spec:
  parentRefs: [{name: edge}]
  hostnames: [shop.example.com]
  rules: [{backendRefs: [{name: reviews, port: 9080}]}]
`, ns))
	f.create(fmt.Sprintf(`
kind: HTTPRoute
metadata: {name: from-other, namespace: %[1]s}
spec:
  parentRefs: [{name: edge, namespace: %[2]s, sectionName: http}, {name: edge, namespace: %[2]s, sectionName: https}]
  # No ReferenceGrant in st-in lets routes of st-in-other refer to it.
  rules: [{backendRefs: [{name: reviews, namespace: %[2]s, port: 9080}]}]
`, other, ns))
	f.create(fmt.Sprintf("kind: Service\nmetadata: {name: reviews, namespace: %s}\nspec: {ports: [{port: 9080}]}\n", ns))

	f.waitFor("each listener's status, with its attached routes", func() (bool, error) {
		gw := f.gateway(ns, "edge")
		h, s, m, u, o := listenerStatus(gw, "http"), listenerStatus(gw, "https"), listenerStatus(gw, "malformed"), listenerStatus(gw, "ungranted"), listenerStatus(gw, "opaque")
		if h == nil || s == nil || m == nil || u == nil || o == nil {
			return false, nil
		}
		mr, ur, or := cond(m.Conditions, "ResolvedRefs"), cond(u.Conditions, "ResolvedRefs"), cond(o.Conditions, "ResolvedRefs")
		return is(cond(h.Conditions, "ResolvedRefs"), metav1.ConditionTrue, "ResolvedRefs") && h.AttachedRoutes == 2 &&
			is(cond(s.Conditions, "ResolvedRefs"), metav1.ConditionTrue, "ResolvedRefs") && s.AttachedRoutes == 1 &&
			is(cond(s.Conditions, "Conflicted"), metav1.ConditionFalse, "NoConflicts") && len(s.SupportedKinds) == 2 &&
			is(mr, metav1.ConditionFalse, "InvalidCertificateRef") && strings.Contains(mr.Message, "malformed") && m.AttachedRoutes == 1 &&
			is(cond(m.Conditions, "Programmed"), metav1.ConditionFalse, "Invalid") &&
			is(ur, metav1.ConditionFalse, "RefNotPermitted") &&
			is(or, metav1.ConditionFalse, "InvalidCertificateRef") && strings.Contains(or.Message, "Secret not found") &&
			is(cond(gw.Status.Conditions, "Accepted"), metav1.ConditionTrue, "ListenersNotValid") &&
			is(cond(gw.Status.Conditions, "Programmed"), metav1.ConditionFalse, "Pending"), nil
	})
	f.waitFor("the routes' entries for the Gateway", func() (bool, error) {
		p := ingressParentOf(f.route(ns, "shop"))
		if p == nil {
			return false, nil
		}
		var otherHTTP, otherHTTPS, otherRefs *metav1.Condition
		for _, op := range f.route(other, "from-other").Status.Parents {
			switch {
			case op.ControllerName != IngressControllerName:
			case *op.ParentRef.SectionName == "http":
				otherHTTP, otherRefs = cond(op.Conditions, "Accepted"), cond(op.Conditions, "ResolvedRefs")
			case *op.ParentRef.SectionName == "https":
				otherHTTPS = cond(op.Conditions, "Accepted")
			}
		}
		a := cond(p.Conditions, "Accepted")
		return is(a, metav1.ConditionTrue, "Accepted") && a.Message == "attached to Gateway st-in/edge, listeners http, https, malformed, ungranted, opaque" &&
			is(cond(p.Conditions, "ResolvedRefs"), metav1.ConditionTrue, "ResolvedRefs") &&
			is(otherHTTP, metav1.ConditionTrue, "Accepted") && is(otherHTTPS, metav1.ConditionFalse, "NotAllowedByListeners") &&
			is(otherRefs, metav1.ConditionFalse, "RefNotPermitted"), nil
	})

	// The deployer's Service and Deployment: the cluster IP until a load
	// balancer sets its address; Programmed once a pod is ready.
	svc := f.ingressDeployment(f.gateway(ns, "edge"), 2)
	f.waitFor("the cluster IP as the address", func() (bool, error) {
		a := f.gateway(ns, "edge").Status.Addresses
		return len(a) == 1 && a[0].Value == svc.Spec.ClusterIP && *a[0].Type == gwv1.IPAddressType, nil
	})
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.10"}, {Hostname: "edge.lb.example.com"}}
	if _, err := f.cs.CoreV1().Services(ns).UpdateStatus(f.ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the load balancer's addresses", func() (bool, error) {
		a := f.gateway(ns, "edge").Status.Addresses
		return len(a) == 2 && a[0].Value == "192.0.2.10" && *a[0].Type == gwv1.IPAddressType &&
			a[1].Value == "edge.lb.example.com" && *a[1].Type == gwv1.HostnameAddressType, nil
	})
	f.setReady(ns, "edge", 1)
	f.waitFor("Programmed, and the serving listeners with it", func() (bool, error) {
		gw := f.gateway(ns, "edge")
		return is(cond(gw.Status.Conditions, "Programmed"), metav1.ConditionTrue, "Programmed") &&
			is(cond(listenerStatus(gw, "https").Conditions, "Programmed"), metav1.ConditionTrue, "Programmed") &&
			is(cond(listenerStatus(gw, "malformed").Conditions, "Programmed"), metav1.ConditionFalse, "Invalid"), nil
	})

	// The malformed Secret fixed: its listener resolves.
	s, err := f.cs.CoreV1().Secrets(ns).Get(f.ctx, "malformed", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Data = good
	if _, err := f.cs.CoreV1().Secrets(ns).Update(f.ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the fixed listener resolved and serving", func() (bool, error) {
		l := listenerStatus(f.gateway(ns, "edge"), "malformed")
		return is(cond(l.Conditions, "ResolvedRefs"), metav1.ConditionTrue, "ResolvedRefs") && l.AttachedRoutes == 1, nil
	})

	// A route attached but refused by the translation, and one with a
	// filter the gateway cannot carry out: not accepted, saying why.
	route := func(name, rule string) string {
		return fmt.Sprintf("kind: HTTPRoute\nmetadata: {name: %s, namespace: %s}\nspec:\n  parentRefs: [{name: edge, sectionName: http}]\n  rules: [%s]\n", name, ns, rule)
	}
	f.create(route("bad-regex", `{matches: [{path: {type: RegularExpression, value: "(["}}], backendRefs: [{name: reviews, port: 9080}]}`))
	f.create(route("magic", `{filters: [{type: ExtensionRef, extensionRef: {group: example.com, kind: Magic, name: m}}], backendRefs: [{name: reviews, port: 9080}]}`))
	f.waitFor("the refused route and the unsupported filter not accepted", func() (bool, error) {
		b, m := ingressParentOf(f.route(ns, "bad-regex")), ingressParentOf(f.route(ns, "magic"))
		if b == nil || m == nil {
			return false, nil
		}
		ba, ma := cond(b.Conditions, "Accepted"), cond(m.Conditions, "Accepted")
		return is(ba, metav1.ConditionFalse, "UnsupportedValue") && strings.HasPrefix(ba.Message, "refused, not programmed: ") &&
			is(ma, metav1.ConditionFalse, "UnsupportedValue") && strings.HasPrefix(ma.Message, "the gateway cannot carry out these filters") &&
			strings.Contains(ma.Message, "ExtensionRef"), nil
	})
}

// A Gateway of class causeway whose GatewayClass belongs to another
// controller is that controller's: no status from us, on the class, the
// Gateway or its routes. (An apiserver of its own: the class is
// cluster-wide and its controllerName immutable.)
func TestIngressOfAnotherControllerIgnored(t *testing.T) {
	f := fixtureOn(t, kubetest.Start(t))
	f.startWriter()
	f.create("kind: Namespace\nmetadata: {name: st-in-foreign}\n")
	f.create(`
kind: GatewayClass
metadata: {name: causeway}
spec: {controllerName: example.com/gateway-controller}
`)
	f.create(`
kind: Gateway
metadata: {name: edge, namespace: st-in-foreign}
spec:
  gatewayClassName: causeway
  listeners: [{name: http, port: 80, protocol: HTTP}]
`)
	f.create(`
kind: HTTPRoute
metadata: {name: r, namespace: st-in-foreign}
spec:
  parentRefs: [{name: edge}]
`)
	time.Sleep(3 * time.Second) // several passes of the writer
	c, err := f.gw.GatewayV1().GatewayClasses().Get(f.ctx, "causeway", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a := cond(c.Status.Conditions, "Accepted"); a != nil && a.Reason != "Pending" {
		t.Errorf("another controller's GatewayClass got status %+v", c.Status.Conditions)
	}
	if gw := f.gateway("st-in-foreign", "edge"); len(gw.Status.Listeners) > 0 || len(gw.Status.Addresses) > 0 ||
		cond(gw.Status.Conditions, "Accepted") != nil && cond(gw.Status.Conditions, "Accepted").Reason != "Pending" {
		t.Errorf("another controller's Gateway got status %+v", gw.Status)
	}
	if ps := f.route("st-in-foreign", "r").Status.Parents; len(ps) > 0 {
		t.Errorf("a route of another controller's Gateway got parents %+v", ps)
	}
}

// What an ingress Gateway asks beyond its listeners: an IPAddress without
// a value (any address) is met, with the Service's; a fixed address (the
// operator allows none here), a host name, or
// infrastructure parameters (an ingress Gateway takes none), reject the
// Gateway as a whole.
func TestIngressGatewayRejections(t *testing.T) {
	const ns = "st-rej"
	f := ingressFixture(t, ns)
	for name, spec := range map[string]string{
		"any-address": "addresses: [{type: IPAddress}]",
		"fixed":       "addresses: [{type: IPAddress, value: 192.0.2.7}]",
		"hostname":    "addresses: [{type: Hostname, value: edge.example.com}]",
		"parameters":  "infrastructure: {parametersRef: {group: invalid.io, kind: InvalidParameters, name: invalid}}",
		"labels-only": "infrastructure: {labels: {team: shop}}",
	} {
		f.create(fmt.Sprintf(`
kind: Gateway
metadata: {name: %s, namespace: %s}
spec:
  gatewayClassName: causeway
  listeners: [{name: http, port: 80, protocol: HTTP}]
  %s
`, name, ns, spec))
	}
	want := map[string][2]string{
		"any-address": {"True", "Accepted"},
		"fixed":       {"False", "UnsupportedAddress"},
		"hostname":    {"False", "UnsupportedAddress"},
		"parameters":  {"False", "InvalidParameters"},
		"labels-only": {"True", "Accepted"},
	}
	f.waitFor("each Gateway's Accepted", func() (bool, error) {
		for name, w := range want {
			if !is(cond(f.gateway(ns, name).Status.Conditions, "Accepted"), metav1.ConditionStatus(w[0]), w[1]) {
				return false, nil
			}
		}
		return true, nil
	})
	if m := cond(f.gateway(ns, "fixed").Status.Conditions, "Accepted").Message; !strings.Contains(m, "the operator allows no static addresses (control plane flag --gateway-address-cidrs)") {
		t.Errorf("UnsupportedAddress message %q: want the operator's setting named", m)
	}
	if m := cond(f.gateway(ns, "parameters").Status.Conditions, "Accepted").Message; !strings.Contains(m, "invalid.io/InvalidParameters invalid") {
		t.Errorf("InvalidParameters message %q: want the reference named", m)
	}
}

// Static addresses, as the conformance suite's GatewayStaticAddresses
// walks them: an address of a type an ingress gateway cannot hold rejects
// the Gateway (UnsupportedAddress); one off the operator's pool leaves it
// accepted but not programmed (AddressNotUsable), and so does one of the
// pool its Service does not hold yet; held, it is the Gateway's one
// address (not the Service's cluster IP, unless an address without a
// value asks for that too).
func TestIngressStaticAddressStatus(t *testing.T) {
	const ns = "st-static"
	pool, err := config.ParseAddressPool("192.0.2.0/28")
	if err != nil {
		t.Fatal(err)
	}
	f := ingressFixtureWithAddresses(t, pool, ns)
	f.create(fmt.Sprintf(`
kind: Gateway
metadata: {name: static, namespace: %s}
spec:
  gatewayClassName: causeway
  listeners: [{name: http, port: 80, protocol: HTTP}]
  addresses:
  - {type: test/fake-invalid-type, value: "fake address"}
  - {type: IPAddress, value: 198.51.100.1}
  - {type: IPAddress, value: 192.0.2.1}
`, ns))
	f.waitFor("Accepted=False UnsupportedAddress", func() (bool, error) {
		return is(cond(f.gateway(ns, "static").Status.Conditions, "Accepted"), metav1.ConditionFalse, "UnsupportedAddress"), nil
	})
	setAddresses := func(addrs ...gwv1.GatewaySpecAddress) {
		t.Helper()
		gw := f.gateway(ns, "static")
		gw.Spec.Addresses = addrs
		if _, err := f.gw.GatewayV1().Gateways(ns).Update(f.ctx, gw, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ip := func(v string) gwv1.GatewaySpecAddress {
		return gwv1.GatewaySpecAddress{Type: ptr(gwv1.IPAddressType), Value: v}
	}
	setAddresses(ip("198.51.100.1"), ip("192.0.2.1"))
	gw := f.gateway(ns, "static")
	svc := f.ingressDeployment(gw, 1)
	f.setReady(ns, "static", 1)
	// programmed waits for the Gateway's current generation accepted, with
	// Programmed as wanted.
	programmed := func(what string, status metav1.ConditionStatus, reason, message string) {
		t.Helper()
		f.waitFor(what, func() (bool, error) {
			g := f.gateway(ns, "static")
			acc, prog := cond(g.Status.Conditions, "Accepted"), cond(g.Status.Conditions, "Programmed")
			return is(acc, metav1.ConditionTrue, "Accepted") && is(prog, status, reason) &&
				prog.ObservedGeneration == g.Generation && strings.Contains(prog.Message, message), nil
		})
	}
	programmed("Programmed=False AddressNotUsable for the address off the pool", metav1.ConditionFalse, "AddressNotUsable",
		"198.51.100.1 is not among the addresses the operator allows Gateways to claim (192.0.2.0/28)")
	setAddresses(ip("192.0.2.1"))
	programmed("Programmed=False AddressNotUsable while the Service does not hold the address", metav1.ConditionFalse, "AddressNotUsable",
		"the gateway's Service does not hold 192.0.2.1")
	if a := f.gateway(ns, "static").Status.Addresses; len(a) != 0 {
		t.Errorf("status addresses %v before the Service holds the static address: want none (not its cluster IP %s)", a, svc.Spec.ClusterIP)
	}
	svc, err = f.cs.CoreV1().Services(ns).Get(f.ctx, "static", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Spec.ExternalIPs = []string{"192.0.2.1"}
	if svc, err = f.cs.CoreV1().Services(ns).Update(f.ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	programmed("Programmed=True once the Service holds the address", metav1.ConditionTrue, "Programmed", "")
	if a := f.gateway(ns, "static").Status.Addresses; len(a) != 1 || a[0].Value != "192.0.2.1" || a[0].Type == nil || *a[0].Type != gwv1.IPAddressType {
		t.Errorf("status addresses %v: want the IPAddress 192.0.2.1 alone", a)
	}
	// An address without a value next to it: the cluster's address too.
	setAddresses(ip("192.0.2.1"), gwv1.GatewaySpecAddress{Type: ptr(gwv1.IPAddressType)})
	f.waitFor("the static address and the cluster IP", func() (bool, error) {
		a := f.gateway(ns, "static").Status.Addresses
		return len(a) == 2 && a[0].Value == "192.0.2.1" && a[1].Value == svc.Spec.ClusterIP, nil
	})
}
