package config

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

func TestIntersectHostnames(t *testing.T) {
	h := func(s string) *gwv1.Hostname { v := gwv1.Hostname(s); return &v }
	for _, tc := range []struct {
		listener *gwv1.Hostname
		route    []gwv1.Hostname
		want     string // fmt of the hosts, or "none"
	}{
		{nil, nil, "[]"},
		{nil, []gwv1.Hostname{"a.example.com"}, "[a.example.com]"},
		{h("a.example.com"), nil, "[a.example.com]"},
		{h("a.example.com"), []gwv1.Hostname{"a.example.com", "b.example.com"}, "[a.example.com]"},
		{h("*.example.com"), []gwv1.Hostname{"a.example.com", "x.y.example.com", "example.com", "a.example.org"}, "[a.example.com x.y.example.com]"},
		{h("a.example.com"), []gwv1.Hostname{"*.example.com"}, "[a.example.com]"},
		{h("*.example.com"), []gwv1.Hostname{"*.a.example.com", "*.com"}, "[*.a.example.com *.example.com]"},
		{h("a.example.com"), []gwv1.Hostname{"*.a.example.com", "b.example.com"}, "none"},
		{h("*.example.com"), []gwv1.Hostname{"example.com"}, "none"},
	} {
		hosts, ok := intersectHostnames(tc.listener, tc.route)
		got := fmt.Sprint(hosts)
		if !ok {
			got = "none"
		}
		if got != tc.want {
			l := "<none>"
			if tc.listener != nil {
				l = string(*tc.listener)
			}
			t.Errorf("listener %s, route %v: %s, want %s", l, tc.route, got, tc.want)
		}
	}
}

// TestAttach: a parentRef attaches to the accepted listeners its
// sectionName and port select (serving or not: an HTTPS listener whose
// certificates do not resolve takes routes too), whose allowedRoutes admit the route's kind
// and namespace and whose hostname it shares; otherwise the reason names
// the first of those that failed for every listener.
func TestAttach(t *testing.T) {
	all, selector := gwv1.NamespacesFromAll, gwv1.NamespacesFromSelector
	public := http("public", 80, "*.example.com")
	public.AllowedRoutes = &gwv1.AllowedRoutes{Namespaces: &gwv1.RouteNamespaces{From: &all}}
	teams := http("teams", 8080, "")
	teams.AllowedRoutes = &gwv1.AllowedRoutes{Namespaces: &gwv1.RouteNamespaces{From: &selector,
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"ingress": "yes"}}}}
	grpcOnly := http("grpc-only", 9090, "")
	grpcOnly.AllowedRoutes = &gwv1.AllowedRoutes{Kinds: []gwv1.RouteGroupKind{{Kind: "GRPCRoute"}}}
	// unresolved's Secret does not exist: routes attach to it all the same.
	unresolved := https("unresolved", 443, "own.example.com", certRef("", "absent"))
	gw := ingressGateway(public, teams, grpcOnly, http("own", 81, "own.example.com"), gwv1.Listener{Name: "tcp", Port: 82, Protocol: gwv1.TCPProtocolType}, unresolved)
	reports := Listeners(gw, lookup(), nil)

	section := func(s string) *gwv1.SectionName { v := gwv1.SectionName(s); return &v }
	port := func(p gwv1.PortNumber) *gwv1.PortNumber { return &p }
	labeled := map[string]string{"ingress": "yes"}
	for _, tc := range []struct {
		name      string
		ref       gwv1.ParentReference
		kind, ns  string
		labels    map[string]string
		hostnames []gwv1.Hostname
		want      string // attachments, or the reason
	}{
		{"own namespace, every listener", gwv1.ParentReference{}, "HTTPRoute", "edge", nil, nil,
			"[{public [*.example.com]} {own [own.example.com]} {unresolved [own.example.com]}]"},
		{"labelled namespace", gwv1.ParentReference{}, "HTTPRoute", "shop", labeled, []gwv1.Hostname{"shop.example.com"},
			"[{public [shop.example.com]} {teams [shop.example.com]}]"},
		{"other namespace", gwv1.ParentReference{}, "HTTPRoute", "shop", nil, nil, "[{public [*.example.com]}]"},
		{"grpc", gwv1.ParentReference{}, "GRPCRoute", "edge", nil, []gwv1.Hostname{"own.example.com"},
			"[{public [own.example.com]} {grpc-only [own.example.com]} {own [own.example.com]} {unresolved [own.example.com]}]"},
		{"by section", gwv1.ParentReference{SectionName: section("own")}, "HTTPRoute", "edge", nil, nil, "[{own [own.example.com]}]"},
		{"by port", gwv1.ParentReference{Port: port(8080)}, "HTTPRoute", "shop", labeled, nil, "[{teams []}]"},
		{"a selector does not admit the own namespace", gwv1.ParentReference{Port: port(8080)}, "HTTPRoute", "edge", nil, nil, string(gwv1.RouteReasonNotAllowedByListeners)},
		{"unknown section", gwv1.ParentReference{SectionName: section("nope")}, "HTTPRoute", "edge", nil, nil, string(gwv1.RouteReasonNoMatchingParent)},
		{"section and port disagree", gwv1.ParentReference{SectionName: section("own"), Port: port(80)}, "HTTPRoute", "edge", nil, nil, string(gwv1.RouteReasonNoMatchingParent)},
		{"certificates unresolved", gwv1.ParentReference{SectionName: section("unresolved")}, "HTTPRoute", "edge", nil, nil, "[{unresolved [own.example.com]}]"},
		{"listener not accepted", gwv1.ParentReference{SectionName: section("tcp")}, "HTTPRoute", "edge", nil, nil, string(gwv1.RouteReasonNoMatchingParent)},
		{"kind refused", gwv1.ParentReference{SectionName: section("grpc-only")}, "HTTPRoute", "edge", nil, nil, string(gwv1.RouteReasonNotAllowedByListeners)},
		{"namespace refused", gwv1.ParentReference{SectionName: section("own")}, "HTTPRoute", "shop", labeled, nil, string(gwv1.RouteReasonNotAllowedByListeners)},
		{"selector refused", gwv1.ParentReference{SectionName: section("teams")}, "HTTPRoute", "shop", map[string]string{"ingress": "no"}, nil, string(gwv1.RouteReasonNotAllowedByListeners)},
		{"no hostname in common", gwv1.ParentReference{}, "HTTPRoute", "shop", nil, []gwv1.Hostname{"shop.example.org"}, string(gwv1.RouteReasonNoMatchingListenerHostname)},
	} {
		got, reason, msg := Attach(gw, reports, tc.ref, tc.kind, tc.ns, tc.labels, tc.hostnames)
		s := fmt.Sprint(got)
		if len(got) == 0 {
			s = string(reason)
			if msg == "" {
				t.Errorf("%s: %s without a message", tc.name, reason)
			}
		} else if reason != gwv1.RouteReasonAccepted || msg != "" {
			t.Errorf("%s: attached with reason %s %q", tc.name, reason, msg)
		}
		if s != tc.want {
			t.Errorf("%s: %s (%s), want %s", tc.name, s, msg, tc.want)
		}
	}
}
