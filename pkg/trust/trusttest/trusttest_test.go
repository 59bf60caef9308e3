package trusttest

import "testing"

func TestPeerThroughHandshake(t *testing.T) {
	ca := NewCA(t, "cluster.local")
	id := Identity(t, "spiffe://cluster.local/ns/a/sa/b")
	p := ca.Peer(t, ca.Certificate(t, id, 0))
	if got, ok := p.Identity(); !ok || got != id {
		t.Fatalf("peer = %v, want %v", p, id)
	}
	if p := ca.Peer(t, nil); p.Authenticated() {
		t.Fatalf("no certificate gave an authenticated peer: %v", p)
	}
}
