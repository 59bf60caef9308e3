package nodeproxy

import (
	"net/netip"
	"testing"
	"time"
)

// TestEjectedHopTriedLast: a hop whose dial failed is tried after the
// others (never dropped) until its ejection ends (5 s, then 10, 20, 40, at
// most 60 after consecutive failures) or a connection through it succeeds.
func TestEjectedHopTriedLast(t *testing.T) {
	now := time.Unix(1000, 0)
	o := newOutliers()
	o.now = func() time.Time { return now }
	p := &Proxy{active: map[netip.AddrPort]int{}, outliers: o}
	dead, alive := netip.MustParseAddrPort("127.0.71.9:15008"), netip.MustParseAddrPort("127.0.71.10:15008")
	hops := []Hop{{Kind: ViaWaypoint, Address: dead}, {Kind: ViaWaypoint, Address: alive}}
	firsts := func() map[netip.AddrPort]int {
		n := map[netip.AddrPort]int{}
		for range 200 {
			got := p.order(hops)
			if len(got) != 2 {
				t.Fatalf("order returned %d hops, want 2", len(got))
			}
			n[got[0].Address]++
		}
		return n
	}
	if n := firsts(); n[dead] == 0 || n[alive] == 0 {
		t.Fatalf("before any failure, first choices %v: want both", n)
	}
	for i, want := range []time.Duration{5, 10, 20, 40, 60, 60} {
		if d, fresh := o.failed(dead); d != want*time.Second || fresh != (i == 0) {
			t.Fatalf("failure %d: ejected for %v (fresh %v), want %v (fresh %v)", i+1, d, fresh, want*time.Second, i == 0)
		}
	}
	if n := firsts(); n[dead] != 0 {
		t.Fatalf("ejected hop tried first %d of 200 times", n[dead])
	}
	now = now.Add(61 * time.Second)
	if n := firsts(); n[dead] == 0 {
		t.Fatal("hop still ejected after its ejection ended")
	}
	if d, _ := o.failed(dead); d != time.Minute {
		t.Fatalf("a failure after the ejection ended, with no success between: %v, want 1m", d)
	}
	o.succeeded(dead)
	if n := firsts(); n[dead] == 0 {
		t.Fatal("hop still ejected after a success")
	}
	if d, _ := o.failed(dead); d != 5*time.Second {
		t.Fatalf("first failure after a success: ejected for %v, want 5s", d)
	}
}

// TestOutliersForgetDroppedHops: a hop that failed and was never tried
// again (its pod gone) is forgotten once its ejection is long over, so the
// map stays as small as the set of recently failing hops.
func TestOutliersForgetDroppedHops(t *testing.T) {
	now := time.Unix(1000, 0)
	o := newOutliers()
	o.now = func() time.Time { return now }
	for i := range 100 {
		o.failed(netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 72, byte(i)}), 15008))
	}
	now = now.Add(baseEjection + maxEjection + time.Second)
	recent := netip.MustParseAddrPort("127.0.71.9:15008")
	if d, _ := o.failed(recent); d != baseEjection {
		t.Fatalf("first failure: ejected for %v, want %v", d, baseEjection)
	}
	if len(o.m) != 1 {
		t.Fatalf("%d hops remembered, want only the one failing now", len(o.m))
	}
}
