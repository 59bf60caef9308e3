package config

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/backendtls/backendtlstest"
)

// tlsSecret is a kubernetes.io/tls Secret holding a real key pair for dns.
func tlsSecret(t *testing.T, ca *backendtlstest.CA, ns, name string, dns ...string) *corev1.Secret {
	t.Helper()
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Type: corev1.SecretTypeTLS, Data: ca.SecretData(t, dns...)}
}

func lookup(secrets ...*corev1.Secret) SecretLookup {
	return func(ns, name string) *corev1.Secret {
		for _, s := range secrets {
			if s.Namespace == ns && s.Name == name {
				return s
			}
		}
		return nil
	}
}

func certRef(ns, name string) gwv1.SecretObjectReference {
	r := gwv1.SecretObjectReference{Name: gwv1.ObjectName(name)}
	if ns != "" {
		n := gwv1.Namespace(ns)
		r.Namespace = &n
	}
	return r
}

func https(name string, port gwv1.PortNumber, host string, refs ...gwv1.SecretObjectReference) gwv1.Listener {
	l := gwv1.Listener{Name: gwv1.SectionName(name), Port: port, Protocol: gwv1.HTTPSProtocolType,
		TLS: &gwv1.ListenerTLSConfig{CertificateRefs: refs}}
	if host != "" {
		h := gwv1.Hostname(host)
		l.Hostname = &h
	}
	return l
}

func http(name string, port gwv1.PortNumber, host string) gwv1.Listener {
	l := gwv1.Listener{Name: gwv1.SectionName(name), Port: port, Protocol: gwv1.HTTPProtocolType}
	if host != "" {
		h := gwv1.Hostname(host)
		l.Hostname = &h
	}
	return l
}

func ingressGateway(ls ...gwv1.Listener) *gwv1.Gateway {
	return &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "ingress"},
		Spec: gwv1.GatewaySpec{GatewayClassName: IngressClass, Listeners: ls}}
}

// grant lets Gateways of fromNS refer to Secret name (every Secret when
// name is empty) in ns.
func grant(ns, fromNS, name string) *gwv1.ReferenceGrant {
	to := gwv1.ReferenceGrantTo{Kind: "Secret"}
	if name != "" {
		n := gwv1.ObjectName(name)
		to.Name = &n
	}
	return &gwv1.ReferenceGrant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "certs"},
		Spec: gwv1.ReferenceGrantSpec{
			From: []gwv1.ReferenceGrantFrom{{Group: gatewayGroup, Kind: "Gateway", Namespace: gwv1.Namespace(fromNS)}},
			To:   []gwv1.ReferenceGrantTo{to},
		}}
}

// TestListenersCertificates: each HTTPS listener resolves its own
// certificates; a missing, malformed, mistyped or ungranted Secret makes
// that listener's ResolvedRefs false with the reason the spec gives, and
// the other listeners serve as before.
func TestListenersCertificates(t *testing.T) {
	ca, err := backendtlstest.NewCA("listeners test")
	if err != nil {
		t.Fatal(err)
	}
	good := tlsSecret(t, ca, "edge", "shop-cert", "shop.example.com")
	other := tlsSecret(t, ca, "certs", "api-cert", "api.example.com")
	malformed := tlsSecret(t, ca, "edge", "broken", "broken.example.com")
	malformed.Data[corev1.TLSCertKey] = []byte("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
	opaque := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "opaque"}, Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{corev1.TLSCertKey: good.Data[corev1.TLSCertKey], corev1.TLSPrivateKeyKey: good.Data[corev1.TLSPrivateKeyKey]}}
	secrets := lookup(good, other, malformed, opaque)

	gw := ingressGateway(
		http("plain", 80, ""),
		https("shop", 443, "shop.example.com", certRef("", "shop-cert")),
		https("missing", 443, "missing.example.com", certRef("", "absent")),
		https("malformed", 443, "broken.example.com", certRef("", "broken")),
		https("opaque", 443, "opaque.example.com", certRef("", "opaque")),
		https("api", 443, "api.example.com", certRef("certs", "api-cert")),
		https("some-good", 443, "some.example.com", certRef("", "absent"), certRef("", "shop-cert")),
		https("none", 443, "none.example.com"),
	)
	want := map[gwv1.SectionName]struct {
		serves bool
		reason gwv1.ListenerConditionReason
		msg    string
		certs  int
	}{
		"plain":     {true, gwv1.ListenerReasonResolvedRefs, "", 0},
		"shop":      {true, gwv1.ListenerReasonResolvedRefs, "", 1},
		"missing":   {false, gwv1.ListenerReasonInvalidCertificateRef, "edge/absent: Secret not found", 0},
		"malformed": {false, gwv1.ListenerReasonInvalidCertificateRef, "edge/broken: malformed tls.crt/tls.key", 0},
		"opaque":    {false, gwv1.ListenerReasonInvalidCertificateRef, `Secret of type "Opaque"`, 0},
		"api":       {false, gwv1.ListenerReasonRefNotPermitted, "no ReferenceGrant in certs", 0},
		"some-good": {true, gwv1.ListenerReasonInvalidCertificateRef, "edge/absent: Secret not found", 1},
		"none":      {false, gwv1.ListenerReasonInvalidCertificateRef, "needs tls.certificateRefs", 0},
	}
	check := func(got []ListenerReport, override map[gwv1.SectionName]gwv1.ListenerConditionReason) {
		t.Helper()
		if len(got) != len(gw.Spec.Listeners) {
			t.Fatalf("%d reports for %d listeners", len(got), len(gw.Spec.Listeners))
		}
		for _, r := range got {
			w := want[r.Name]
			if reason, ok := override[r.Name]; ok {
				w.serves, w.reason, w.msg, w.certs = true, reason, "", 1
			}
			if !r.Accepted || r.Conflicted {
				t.Errorf("%s: accepted %v (%s), conflicted %v (%s): %s", r.Name, r.Accepted, r.AcceptedReason, r.Conflicted, r.ConflictedReason, r.Message)
			}
			if r.Serves() != w.serves || r.RefsReason != w.reason || r.ResolvedRefs != (w.reason == gwv1.ListenerReasonResolvedRefs) ||
				!strings.Contains(r.Message, w.msg) || w.msg == "" && r.Message != "" || len(r.Certificates) != w.certs {
				t.Errorf("%s: serves %v, ResolvedRefs %v %s %q, %d certificates; want serves %v, %s %q, %d",
					r.Name, r.Serves(), r.ResolvedRefs, r.RefsReason, r.Message, len(r.Certificates), w.serves, w.reason, w.msg, w.certs)
			}
		}
	}
	check(Listeners(gw, secrets, nil), nil)

	// A grant for another Secret, or from another namespace's Gateways,
	// permits nothing; one for this Secret (or all of the namespace's) does.
	check(Listeners(gw, secrets, map[string][]*gwv1.ReferenceGrant{"certs": {grant("certs", "edge", "other-cert"), grant("certs", "elsewhere", "")}}), nil)
	for _, g := range []*gwv1.ReferenceGrant{grant("certs", "edge", "api-cert"), grant("certs", "edge", "")} {
		check(Listeners(gw, secrets, map[string][]*gwv1.ReferenceGrant{"certs": {g}}),
			map[gwv1.SectionName]gwv1.ListenerConditionReason{"api": gwv1.ListenerReasonResolvedRefs})
	}
}

// TestListenersAcceptance: protocols other than HTTP and HTTPS (and
// HTTPS other than Terminate: no supported kinds), the gateway's own ports, route kinds it
// does not serve, and listeners sharing a port against the spec.
func TestListenersAcceptance(t *testing.T) {
	ca, err := backendtlstest.NewCA("listeners test")
	if err != nil {
		t.Fatal(err)
	}
	secrets := lookup(tlsSecret(t, ca, "edge", "cert", "*.example.com"))
	passthrough := https("passthrough", 8443, "", certRef("", "cert"))
	mode := gwv1.TLSModePassthrough
	passthrough.TLS.Mode = &mode
	tcp := gwv1.Listener{Name: "tcp", Port: 9000, Protocol: gwv1.TCPProtocolType}
	kinds := http("kinds", 8080, "")
	tcpRoute, other := gwv1.Group("example.com"), gwv1.Group(gatewayGroup)
	kinds.AllowedRoutes = &gwv1.AllowedRoutes{Kinds: []gwv1.RouteGroupKind{{Kind: "HTTPRoute"}, {Group: &other, Kind: "TCPRoute"}, {Group: &tcpRoute, Kind: "HTTPRoute"}}}

	got := Listeners(ingressGateway(
		tcp, passthrough, http("readiness", 15021, ""), kinds,
		http("a", 80, "a.example.com"), http("b", 80, "b.example.com"), // share port 80 by hostname
		http("same1", 81, "c.example.com"), http("same2", 81, "c.example.com"),
		http("proto-http", 82, ""), https("proto-https", 82, "", certRef("", "cert")),
	), secrets, nil)
	type result struct {
		accepted   gwv1.ListenerConditionReason
		conflicted gwv1.ListenerConditionReason
		refs       gwv1.ListenerConditionReason
		serves     bool
	}
	ok, resolved := gwv1.ListenerReasonAccepted, gwv1.ListenerReasonResolvedRefs
	want := map[gwv1.SectionName]result{
		"tcp":         {gwv1.ListenerReasonUnsupportedProtocol, "", resolved, false},
		"passthrough": {gwv1.ListenerReasonUnsupportedProtocol, "", resolved, false},
		"readiness":   {gwv1.ListenerReasonPortUnavailable, "", resolved, false},
		"kinds":       {ok, "", gwv1.ListenerReasonInvalidRouteKinds, true},
		"a":           {ok, "", resolved, true},
		"b":           {ok, "", resolved, true},
		"same1":       {ok, gwv1.ListenerReasonHostnameConflict, resolved, false},
		"same2":       {ok, gwv1.ListenerReasonHostnameConflict, resolved, false},
		"proto-http":  {ok, gwv1.ListenerReasonProtocolConflict, resolved, false},
		"proto-https": {ok, gwv1.ListenerReasonProtocolConflict, resolved, false},
	}
	for _, r := range got {
		w := want[r.Name]
		if r.AcceptedReason != w.accepted || r.Accepted != (w.accepted == ok) || r.ConflictedReason != w.conflicted ||
			r.Conflicted != (w.conflicted != "") || r.RefsReason != w.refs || r.Serves() != w.serves {
			t.Errorf("%s: accepted %v %s, conflicted %v %s, refs %s, serves %v (%s); want %+v",
				r.Name, r.Accepted, r.AcceptedReason, r.Conflicted, r.ConflictedReason, r.RefsReason, r.Serves(), r.Message, w)
		}
		switch r.Name {
		case "kinds":
			if len(r.SupportedKinds) != 1 || r.SupportedKinds[0].Kind != "HTTPRoute" || *r.SupportedKinds[0].Group != gatewayGroup ||
				!strings.Contains(r.Message, "gateway.networking.k8s.io/TCPRoute") || !strings.Contains(r.Message, "example.com/HTTPRoute") {
				t.Errorf("kinds: supported %v, %q", r.SupportedKinds, r.Message)
			}
		case "a":
			if len(r.SupportedKinds) != 2 {
				t.Errorf("a: supported kinds %v, want HTTPRoute and GRPCRoute", r.SupportedKinds)
			}
		case "tcp", "passthrough", "readiness":
			if r.Message == "" {
				t.Errorf("%s: no message saying why it is not accepted", r.Name)
			}
			// An unsupported protocol serves no route kind; the gateway's
			// own port is HTTP all the same.
			if unsupported := r.Name != "readiness"; unsupported != (r.SupportedKinds != nil && len(r.SupportedKinds) == 0) {
				t.Errorf("%s: supported kinds %v", r.Name, r.SupportedKinds)
			}
		}
	}
}

// TestListenerFor: a host goes to the listener of its port naming it
// exactly, else the narrowest wildcard covering it, else the one without
// a hostname; listeners that do not serve are passed over.
func TestListenerFor(t *testing.T) {
	gw := ingressGateway(
		http("any", 80, ""), http("wild", 80, "*.example.com"), http("narrow", 80, "*.shop.example.com"),
		http("exact", 80, "cart.shop.example.com"), http("other-port", 8080, "api.example.com"),
		https("no-cert", 443, "secure.example.com", certRef("", "absent")),
	)
	reports := Listeners(gw, lookup(), nil)
	for _, tc := range []struct {
		port gwv1.PortNumber
		host string
		want string
	}{
		{80, "cart.shop.example.com", "exact"},
		{80, "CART.shop.example.com.", "exact"},
		{80, "pay.shop.example.com", "narrow"},
		{80, "api.example.com", "wild"},
		{80, "example.com", "any"},
		{80, "example.org", "any"},
		{8080, "api.example.com", "other-port"},
		{8080, "www.example.com", ""},
		{443, "secure.example.com", ""}, // its only certificate is missing
		{9999, "api.example.com", ""},
	} {
		i, ok := ListenerFor(gw, reports, tc.port, tc.host)
		got := ""
		if ok {
			got = string(gw.Spec.Listeners[i].Name)
		}
		if got != tc.want {
			t.Errorf("port %d host %s: listener %q, want %q", tc.port, tc.host, got, tc.want)
		}
	}
}

// An ingress Gateway is rejected as a whole for an address it cannot hold
// (any type but IPAddress, a value that is no IP, any value while the
// operator allows no static address) or infrastructure parameters; an
// IPAddress without a value, one with a value once the operator allows
// static addresses (in the pool or not: Programmed's matter), and
// infrastructure labels, are met.
func TestGatewayRejection(t *testing.T) {
	ip, host, fake := gwv1.IPAddressType, gwv1.HostnameAddressType, gwv1.AddressType("test/fake-invalid-type")
	params := &gwv1.GatewayInfrastructure{ParametersRef: &gwv1.LocalParametersReference{Group: "example.com", Kind: "Params", Name: "p"}}
	pool, err := ParseAddressPool("192.0.2.0/28")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		addrs []gwv1.GatewaySpecAddress
		inf   *gwv1.GatewayInfrastructure
		pool  AddressPool
		want  gwv1.GatewayConditionReason
	}{
		{"nothing asked", nil, nil, AddressPool{}, ""},
		{"an IPAddress", []gwv1.GatewaySpecAddress{{Type: &ip}}, nil, AddressPool{}, ""},
		{"an address of no type", []gwv1.GatewaySpecAddress{{}}, nil, AddressPool{}, ""},
		{"labels", nil, &gwv1.GatewayInfrastructure{Labels: map[gwv1.LabelKey]gwv1.LabelValue{"a": "b"}}, AddressPool{}, ""},
		{"a static IP, none allowed", []gwv1.GatewaySpecAddress{{Type: &ip}, {Type: &ip, Value: "192.0.2.1"}}, nil, AddressPool{}, gwv1.GatewayReasonUnsupportedAddress},
		{"a static IP of the pool", []gwv1.GatewaySpecAddress{{Type: &ip, Value: "192.0.2.1"}}, nil, pool, ""},
		{"a static IP off the pool", []gwv1.GatewaySpecAddress{{Value: "198.51.100.1"}}, nil, pool, ""},
		{"not an IP", []gwv1.GatewaySpecAddress{{Type: &ip, Value: "edge.example.com"}}, nil, pool, gwv1.GatewayReasonUnsupportedAddress},
		{"a hostname", []gwv1.GatewaySpecAddress{{Type: &host}}, nil, pool, gwv1.GatewayReasonUnsupportedAddress},
		{"another type next to a usable IP", []gwv1.GatewaySpecAddress{{Type: &fake, Value: "x"}, {Value: "192.0.2.1"}}, nil, pool, gwv1.GatewayReasonUnsupportedAddress},
		{"parameters", nil, params, AddressPool{}, gwv1.GatewayReasonInvalidParameters},
	} {
		gw := &gwv1.Gateway{Spec: gwv1.GatewaySpec{Addresses: tc.addrs, Infrastructure: tc.inf}}
		if got, msg := GatewayRejection(gw, tc.pool); got != tc.want || (got == "") != (msg == "") {
			t.Errorf("%s: %q %q, want %q", tc.name, got, msg, tc.want)
		}
	}
}
