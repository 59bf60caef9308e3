package podns

import (
	"net/netip"
	"strings"
	"testing"
)

// Lines as the kernel writes them.
func TestGatewayLines(t *testing.T) {
	for _, tc := range []struct {
		line string
		v6   bool
		want string // "" for none
	}{
		{"eth0\t00000000\t01004D0A\t0003\t0\t0\t0\t00000000\t0\t0\t0", false, "10.77.0.1"},
		{"eth0\t00004D0A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0", false, ""}, // on-link subnet
		{"Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT", false, ""},
		{"00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd770000000000000000000000000001 00000400 00000001 00000000 00000003 eth0", true, "fd77::1"},
		{"fd770000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001 eth0", true, ""},
		{"00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200 lo", true, ""}, // unreachable default
	} {
		gw := gateway4
		if tc.v6 {
			gw = gateway6
		}
		a, ok := gw(strings.Fields(tc.line))
		got := ""
		if ok {
			got = a.String()
		}
		if got != tc.want {
			t.Errorf("%q: %q, want %q", tc.line, got, tc.want)
		}
	}
	if _, ok := gateway4([]string{"eth0", "00000000", "zz"}); ok {
		t.Error("a short line was read")
	}
}

func TestLookup(t *testing.T) {
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")
	idx := Index{a: {"/n/one"}, b: {"/n/one"}, netip.MustParseAddr("10.0.0.2"): {"/n/two", "/n/three"}}
	if p, err := idx.Lookup(a, b); err != nil || p != "/n/one" {
		t.Errorf("Lookup of a dual-stack pod = %q, %v", p, err)
	}
	if _, err := idx.Lookup(netip.MustParseAddr("10.0.0.2")); err == nil {
		t.Error("an address held by two namespaces was resolved")
	}
	if _, err := idx.Lookup(netip.MustParseAddr("10.0.0.9")); err == nil {
		t.Error("an unknown address was resolved")
	}
}
