package nodeproxy

import (
	"fmt"
	"slices"
	"testing"

	"go.uber.org/zap/zaptest/observer"

	"github.com/causeway-mesh/causeway/pkg/trust/certmanager"
)

// A workload moved to another node (its pod recreated there): the new
// node's proxy fetches its identity's certificate and serves it, and the
// old node's, with no workload of that identity left, drops it and says so.
func TestCertificateFollowsWorkloadToAnotherNode(t *testing.T) {
	startApp(t, app(podC)+":8080", "C")
	m := startMesh(t, "node-a", "node-b")
	const idC = "spiffe://cluster.local/ns/t/sa/c"
	state := func(node string) string {
		for _, c := range m.proxies[node].opts.Certificates.Snapshot() {
			if c.Identity == idC {
				return c.State
			}
		}
		return ""
	}
	if s := state("node-b"); s != certmanager.StateAvailable {
		t.Fatalf("node-b's certificate for c before the move: %q", s)
	}
	if s := state("node-a"); s != "" {
		t.Fatalf("node-a holds c's identity before the move: %q", s)
	}

	ws, ss, wps := meshResources()
	for _, w := range ws {
		if w.GetUid() == "c" {
			w.Node = "node-a"
		}
	}
	m.index.Set(caWorkloads(t, ws)...) // the CA's view follows the pod
	// The old node first: here both nodes' pods share the loopback, so the
	// new node can serve the pod's address only once the old one let go.
	for _, n := range []string{"node-b", "node-a"} {
		m.proxies[n].Update(NewRegistry(n, ws, ss, wps))
	}
	waitFor(t, "node-a's certificate for c", func() error {
		if s := state("node-a"); s != certmanager.StateAvailable {
			return fmt.Errorf("state %q", s)
		}
		return nil
	})
	if s := state("node-b"); s != "" {
		t.Fatalf("node-b still holds c's identity (%q) with no workload of it left", s)
	}
	dropped := m.logs["node-b"].FilterMessage("certificate dropped: no workload of its identity is left on this node").All()
	if !slices.ContainsFunc(dropped, func(e observer.LoggedEntry) bool { return e.ContextMap()["identity"] == idC }) {
		t.Fatalf("node-b did not log dropping c's certificate: %v", dropped)
	}
	// Traffic to the moved pod reaches it through its new node.
	if got, err := m.exchange(t, "node-b", podB, podC+":8080", "x"); err != nil || got != "C:x" {
		t.Fatalf("to the moved pod: %q, %v", got, err)
	}
}
