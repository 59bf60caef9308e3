package xdsserver

import (
	"fmt"
	"strings"
	"testing"

	"github.com/causeway-mesh/causeway/pkg/trust/caclient"
	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// workloadSync is the workload type's exchange with the one client of cp.
func workloadSync(cp *testCP) (xds.TypeSync, error) {
	clients := cp.server.Clients()
	if len(clients) != 1 {
		return xds.TypeSync{}, fmt.Errorf("%d clients, want 1", len(clients))
	}
	for _, ts := range clients[0].Types {
		if ts.Type == "workload" {
			return ts, nil
		}
	}
	return xds.TypeSync{}, fmt.Errorf("client %s reports no workload exchange: %+v", clients[0].NodeID, clients[0].Types)
}

// The server reports, per client and type, the version it sent and the
// one the client acknowledged, and a rejection until a later response is
// taken (what meshctl proxy-status shows).
func TestClientsReportSyncState(t *testing.T) {
	env := newEnv(t)
	cp := env.startCP(t, "127.0.0.1:0")
	good := workload("a", "w1", "127.0.10.1")
	if err := cp.server.Update(resources(good)); err != nil {
		t.Fatal(err)
	}
	c := env.startClient(t, cp.addr, xds.ClientOptions{NodeID: xds.NodeProxyID("node-a"), Token: caclient.StaticToken(nodeProxyToken),
		Subscriptions: []xds.Subscription{{TypeURL: meshv1.WorkloadTypeURL}}})
	waitReady(t, c)
	synced := func(version string) func() bool {
		return func() bool {
			ts, err := workloadSync(cp)
			return err == nil && ts.Status == xds.SyncSynced && ts.AckedVersion == version && ts.SentVersion == version && ts.NACK == nil
		}
	}
	v1 := cp.server.Version()
	eventually(t, "the client acknowledged version "+v1, synced(v1))
	if cl := cp.server.Clients()[0]; cl.NodeID != "nodeproxy~node-a" || !strings.Contains(cl.Caller, "nodeproxy") {
		t.Errorf("client %+v, want node proxy node-a", cl)
	}

	bad := workload("a", "w2", "127.0.10.2")
	bad.Identity = "spiffe://cluster.local/not-a-workload"
	if err := cp.server.Update(resources(good, bad)); err != nil {
		t.Fatal(err)
	}
	v2 := cp.server.Version()
	eventually(t, "the rejection of version "+v2, func() bool {
		ts, err := workloadSync(cp)
		return err == nil && ts.Status == xds.SyncNACKed && ts.SentVersion == v2 && ts.AckedVersion == v1 &&
			ts.NACK != nil && ts.NACK.Version == v2 && strings.Contains(ts.NACK.Message, "not-a-workload")
	})

	if err := cp.server.Update(resources(good, workload("a", "w2", "127.0.10.2"))); err != nil {
		t.Fatal(err)
	}
	v3 := cp.server.Version()
	eventually(t, "the client acknowledged version "+v3+" and the rejection is gone", synced(v3))
}
