package xdsserver

import (
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/caclient"
	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// attempts records when something was tried.
type attempts struct {
	mu sync.Mutex
	at []time.Time
}

func (a *attempts) add() {
	a.mu.Lock()
	a.at = append(a.at, time.Now())
	a.mu.Unlock()
}

func (a *attempts) times() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]time.Time(nil), a.at...)
}

// checkSpacing fails unless the gaps between attempts follow the policy:
// the k-th wait is drawn in [b/2, b] with b doubling from initial to max.
// Timers never fire early, so every gap is at least its lower bound (less
// 10 % for clock granularity) however loaded the machine; and the attempts
// are at least min (the policy makes more, unless the machine stalls).
func checkSpacing(t *testing.T, at []time.Time, initial, maxWait time.Duration, min int) {
	t.Helper()
	if len(at) < min {
		t.Errorf("%d attempts, want at least %d: the backoff is slower than the policy", len(at), min)
	}
	b := initial
	for k := 1; k < len(at); k++ {
		gap := at[k].Sub(at[k-1])
		if low := b / 2 * 9 / 10; gap < low {
			t.Errorf("attempt %d of %d came %v after the one before, want at least %v (b=%v)", k+1, len(at), gap, low, b)
			return
		}
		b = min2(b*2, maxWait)
	}
}

func min2(a, b time.Duration) time.Duration {
	if a < b {
		return a
	}
	return b
}

// The control plane away (its port accepts and closes: every attempt is
// seen): attempts are spaced as the policy says, neither a tight loop nor
// gRPC's own slower backoff; once it is back the client resyncs within
// about one longest wait.
func TestReconnectFollowsThePolicy(t *testing.T) {
	env := newEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	var tried attempts
	served := make(chan struct{})
	go func() {
		defer close(served)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tried.add()
			c.Close()
		}
	}()
	const initial, maxWait = 100 * time.Millisecond, 800 * time.Millisecond
	c := env.startClient(t, addr, xds.ClientOptions{NodeID: xds.NodeProxyID("node-a"), Token: caclient.StaticToken(nodeProxyToken),
		Subscriptions: []xds.Subscription{{TypeURL: meshv1.WorkloadTypeURL}}, InitialBackoff: initial, MaxBackoff: maxWait})
	time.Sleep(4 * time.Second)
	ln.Close()
	<-served
	// Waits of at most 100, 200, 400, 800, 800 ms: 6 attempts in 2.3 s.
	checkSpacing(t, tried.times(), initial, maxWait, 5)

	cp := env.startCP(t, addr)
	if err := cp.server.Update(resources(workload("a", "w1", "127.0.10.1"))); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	eventually(t, "the client syncs with the control plane back", c.Ready)
	// One longest wait and the attempt's handshake; a second wait would
	// mean gRPC's backoff held the attempt back.
	if took := time.Since(back); took > maxWait+time.Second {
		t.Errorf("synced %v after the control plane was back, want within %v", took, maxWait+time.Second)
	}
}

// flakyADS accepts a stream, answers its first request, then ends it: a
// control plane that fails right after accepting (a crash loop, a
// misconfigured one).
type flakyADS struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	streams attempts
}

func (f *flakyADS) DeltaAggregatedResources(st discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	f.streams.add()
	req, err := st.Recv()
	if err != nil {
		return err
	}
	if err := st.Send(&discovery.DeltaDiscoveryResponse{TypeUrl: req.GetTypeUrl(), Nonce: "1"}); err != nil {
		return err
	}
	return status.Error(codes.Unavailable, "failing after the first response")
}

// A stream that delivered a response but did not stay up is not a stable
// connection: the backoff goes on growing instead of starting over (which
// retried such a control plane every 25 to 50 ms).
func TestReconnectBackoffStartsOverOnlyAfterAStableStream(t *testing.T) {
	env := newEnv(t)
	cert := env.cpCert
	tlsConf := trust.ServerConfig(env.ca.Bundle, func(net.Addr) (*tls.Certificate, error) { return cert, nil }, trust.VerifyIfGiven)
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsConf)))
	ads := &flakyADS{}
	discovery.RegisterAggregatedDiscoveryServiceServer(g, ads)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(ln)
	defer g.Stop()
	const initial, maxWait = 50 * time.Millisecond, 800 * time.Millisecond
	c := env.startClient(t, ln.Addr().String(), xds.ClientOptions{Subscriptions: []xds.Subscription{{TypeURL: meshv1.WorkloadTypeURL}},
		InitialBackoff: initial, MaxBackoff: maxWait})
	eventually(t, "a first stream", func() bool { return len(ads.streams.times()) > 0 })
	time.Sleep(3 * time.Second)
	at := ads.streams.times()
	// Waits of at least 25, 50, 100, 200, 400, 400 ... ms: at most 10 in 3 s.
	if len(at) > 10 {
		t.Errorf("%d streams in 3 s: the backoff started over after each unstable one", len(at))
	}
	checkSpacing(t, at, initial, maxWait, 4)
	if c.Ready() {
		t.Error("ready on a control plane that never completed a sync")
	}
}

// After a control plane restart, N clients holding the current resources
// say so (initial_resource_versions) and are sent nothing: no push storm.
func TestRestartResyncsWithoutAPushStorm(t *testing.T) {
	env := newEnv(t)
	var ws []proto.Message
	for i := range 50 {
		ws = append(ws, workload("a", fmt.Sprintf("w%d", i), fmt.Sprintf("127.0.10.%d", i+1)))
	}
	cp := env.startCP(t, "127.0.0.1:0")
	addr := cp.addr
	if err := cp.server.Update(resources(ws...)); err != nil {
		t.Fatal(err)
	}
	const clients = 5
	var cs []*testClient
	for range clients {
		c := env.startClient(t, addr, xds.ClientOptions{NodeID: xds.NodeProxyID("node-a"), Token: caclient.StaticToken(nodeProxyToken),
			Subscriptions: xds.NodeProxySubscriptions()})
		cs = append(cs, c)
	}
	for _, c := range cs {
		waitReady(t, c)
		eventually(t, "connected", c.Connected)
	}
	cp.stop()
	for _, c := range cs {
		eventually(t, "the client notices", func() bool { return !c.Connected() })
	}

	reg := prometheus.NewRegistry()
	cp2 := env.startCPWith(t, addr, reg)
	if err := cp2.server.Update(resources(ws...)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "every client reconnects", func() bool { return len(cp2.server.Clients()) == clients })
	time.Sleep(500 * time.Millisecond) // what would be pushed is pushed by now
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sent := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "causeway_xds_push_resources" {
			for _, m := range mf.GetMetric() {
				sent += m.GetHistogram().GetSampleSum()
			}
		}
	}
	if sent != 0 {
		t.Errorf("the restarted control plane sent %v resources to %d clients that held all %d; want 0", sent, clients, len(ws))
	}
	for _, c := range cs {
		if got := len(c.State().Workloads); got != len(ws) {
			t.Errorf("a client holds %d workloads after the restart, want %d", got, len(ws))
		}
	}
}

// The control plane's port closed (connection refused, so no listener
// sees the attempts: the client's log of failed streams does): the same
// spacing. A failed channel stays in TransientFailure through later
// attempts, so waiting for its state to tell an attempt's end cost each
// attempt 2 s.
func TestReconnectToAClosedPortFollowsThePolicy(t *testing.T) {
	env := newEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	const initial, maxWait = 100 * time.Millisecond, 800 * time.Millisecond
	c := env.startClient(t, addr, xds.ClientOptions{NodeID: xds.NodeProxyID("node-a"), Token: caclient.StaticToken(nodeProxyToken),
		Subscriptions: []xds.Subscription{{TypeURL: meshv1.WorkloadTypeURL}}, InitialBackoff: initial, MaxBackoff: maxWait})
	time.Sleep(4 * time.Second)
	var at []time.Time
	for _, e := range c.logs.FilterMessage("xDS stream ended; keeping the last state and reconnecting").All() {
		at = append(at, e.Time)
	}
	checkSpacing(t, at, initial, maxWait, 5)
}
