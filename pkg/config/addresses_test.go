package config

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

func TestParseAddressPool(t *testing.T) {
	p, err := ParseAddressPool(" 192.0.2.0/28, 2001:db8::/120,198.51.100.7 ,")
	if err != nil {
		t.Fatal(err)
	}
	for a, want := range map[string]bool{
		"192.0.2.0": true, "192.0.2.15": true, "192.0.2.16": false, "2001:db8::ff": true, "2001:db8::100": false,
		"198.51.100.7": true, "198.51.100.8": false, "::ffff:192.0.2.3": true, "10.0.0.1": false,
	} {
		if got := p.Contains(netip.MustParseAddr(a)); got != want {
			t.Errorf("%s in %s: %v, want %v", a, p, got, want)
		}
	}
	if p.String() != "192.0.2.0/28, 2001:db8::/120, 198.51.100.7/32" {
		t.Errorf("String %q", p)
	}
	if e, err := ParseAddressPool(""); err != nil || !e.Empty() || e.Contains(netip.MustParseAddr("192.0.2.1")) {
		t.Errorf("empty pool: %v %v", e, err)
	}
	for in, want := range map[string]string{
		"192.0.2.1/28":      "host bits set (the network is 192.0.2.0/28)",
		"edge.example.com":  "not a CIDR or an IP address",
		"192.0.2.0/33":      "not a CIDR or an IP address",
		"fe80::1%eth0":      "not a CIDR or an IP address",
		"192.0.2.0/28,nope": `"nope": not a CIDR`,
	} {
		if _, err := ParseAddressPool(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}

func staticGateway(ns, name string, created time.Time, class string, addrs ...string) *gwv1.Gateway {
	gw := &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(created)},
		Spec: gwv1.GatewaySpec{GatewayClassName: gwv1.ObjectName(class)}}
	for _, a := range addrs {
		gw.Spec.Addresses = append(gw.Spec.Addresses, gwv1.GatewaySpecAddress{Value: a})
	}
	return gw
}

// A Gateway may hold the addresses of the pool that no accepted ingress
// Gateway claimed before it; the others are unusable, with a message
// naming the address and why.
func TestResolveAddresses(t *testing.T) {
	pool, err := ParseAddressPool("192.0.2.0/28,2001:db8::/120")
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	first := staticGateway("a", "first", t0, IngressClass, "192.0.2.1")
	tied := staticGateway("b", "tied", t0, IngressClass, "192.0.2.1")
	waypoint := staticGateway("a", "wp", t0.Add(-time.Hour), WaypointClass, "192.0.2.2")
	rejected := staticGateway("a", "rejected", t0.Add(-time.Hour), IngressClass, "192.0.2.3")
	rejected.Spec.Addresses = append(rejected.Spec.Addresses, gwv1.GatewaySpecAddress{Type: new(gwv1.HostnameAddressType), Value: "edge.example.com"})
	later := staticGateway("c", "later", t0.Add(time.Minute), IngressClass, "192.0.2.1", "192.0.2.2", "192.0.2.3", "2001:db8:0::5", "192.0.2.16")
	all := []*gwv1.Gateway{later, tied, first, waypoint, rejected}

	got := ResolveAddresses(later, pool, all)
	if want := []string{"192.0.2.2", "192.0.2.3", "2001:db8::5"}; !slices.Equal(got.Usable, want) {
		t.Errorf("later: usable %v, want %v (a waypoint's or a rejected Gateway's claim holds nothing)", got.Usable, want)
	}
	if len(got.Unusable) != 2 || !strings.Contains(got.Unusable[0], "192.0.2.1 is held by Gateway a/first") ||
		!strings.Contains(got.Unusable[1], "192.0.2.16 is not among the addresses the operator allows Gateways to claim (192.0.2.0/28, 2001:db8::/120)") {
		t.Errorf("later: unusable %q", got.Unusable)
	}
	if got := ResolveAddresses(first, pool, all); !slices.Equal(got.Usable, []string{"192.0.2.1"}) || len(got.Unusable) != 0 {
		t.Errorf("first: %+v, want 192.0.2.1 held (same age as b/tied, and a/ comes first)", got)
	}
	if got := ResolveAddresses(tied, pool, all); len(got.Usable) != 0 || len(got.Unusable) != 1 {
		t.Errorf("tied: %+v, want 192.0.2.1 unusable", got)
	}
	// Gone (or not yet listed), the first claimant leaves the address to the next.
	if got := ResolveAddresses(tied, pool, []*gwv1.Gateway{later, tied}); !slices.Equal(got.Usable, []string{"192.0.2.1"}) {
		t.Errorf("tied without a/first: %+v, want 192.0.2.1 held", got)
	}
	if got := ResolveAddresses(later, AddressPool{}, nil); len(got.Usable) != 0 || len(got.Unusable) != 5 {
		t.Errorf("empty pool: %+v, want every address unusable", got)
	}
}

func TestAssignedAddress(t *testing.T) {
	for _, c := range []struct {
		addrs []gwv1.GatewaySpecAddress
		want  bool
	}{
		{nil, true},
		{[]gwv1.GatewaySpecAddress{{}}, true},
		{[]gwv1.GatewaySpecAddress{{Value: "192.0.2.1"}}, false},
		{[]gwv1.GatewaySpecAddress{{Value: "192.0.2.1"}, {Type: new(gwv1.IPAddressType)}}, true},
	} {
		if got := AssignedAddress(&gwv1.Gateway{Spec: gwv1.GatewaySpec{Addresses: c.addrs}}); got != c.want {
			t.Errorf("%+v: %v, want %v", c.addrs, got, c.want)
		}
	}
}
