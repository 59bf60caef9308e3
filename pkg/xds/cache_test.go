package xds

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"google.golang.org/protobuf/proto"

	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// watchOnce opens a delta watch and returns the immediate response, or nil
// when the watch was parked (and cancels it). A request the server did not
// stamp reads as a trusted node proxy.
func watchOnce(t *testing.T, c *deltaCache, req *discovery.DeltaDiscoveryRequest, sub *stream.Subscription) *discovery.DeltaDiscoveryResponse {
	t.Helper()
	if req.GetNode() == nil {
		stampReader(req, reader{trusted: true})
	}
	ch := make(chan cache.DeltaResponse, 1)
	cancel, err := c.CreateDeltaWatch(req, sub, ch)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-ch:
		out, err := r.GetDeltaDiscoveryResponse()
		if err != nil {
			t.Fatal(err)
		}
		sub.SetReturnedResources(r.GetReturnedResources())
		return out
	default:
		cancel()
		return nil
	}
}

func respNames(r *discovery.DeltaDiscoveryResponse) string {
	var n []string
	for _, res := range r.GetResources() {
		n = append(n, res.GetName())
	}
	return strings.Join(n, ",") + " -" + strings.Join(r.GetRemovedResources(), ",")
}

func TestCacheReconnectSendsOnlyDifferences(t *testing.T) {
	c := newDeltaCache()
	if _, err := c.set(resources(workload("a", "w1", "127.0.10.1"), workload("a", "w2", "127.0.10.2"))); err != nil {
		t.Fatal(err)
	}
	first := stream.NewDeltaSubscription([]string{"*"}, nil, nil, false)
	r := watchOnce(t, c, &discovery.DeltaDiscoveryRequest{TypeUrl: meshv1.WorkloadTypeURL, ResourceNamesSubscribe: []string{"*"}}, &first)
	if got := respNames(r); got != "a/w1,a/w2 -" {
		t.Fatalf("first sync: %s", got)
	}
	known := map[string]string{}
	for _, res := range r.Resources {
		known[res.Name] = res.Version
	}

	// Same content, new update: versions are content hashes, nothing changes.
	changed, err := c.set(resources(workload("a", "w1", "127.0.10.1"), workload("a", "w2", "127.0.10.22"), workload("a", "w3", "127.0.10.3")))
	if err != nil {
		t.Fatal(err)
	}
	if changed[meshv1.WorkloadTypeURL] != 2 {
		t.Errorf("changed = %v, want 2 workloads (w2 modified, w3 added)", changed)
	}
	// A client reconnecting with what it holds gets only the differences.
	known["a/gone"] = "123"
	re := stream.NewDeltaSubscription([]string{"*"}, nil, known, false)
	r = watchOnce(t, c, &discovery.DeltaDiscoveryRequest{TypeUrl: meshv1.WorkloadTypeURL, ResourceNamesSubscribe: []string{"*"}, InitialResourceVersions: known}, &re)
	if got := respNames(r); got != "a/w2,a/w3 -a/gone" {
		t.Errorf("reconnect: %s", got)
	}
	// Nothing left to send: an ACK parks the watch.
	if r := watchOnce(t, c, &discovery.DeltaDiscoveryRequest{TypeUrl: meshv1.WorkloadTypeURL, ResponseNonce: "1"}, &re); r != nil {
		t.Errorf("ACK answered with %s", respNames(r))
	}
}

func TestCacheNamesAndNamespaces(t *testing.T) {
	c := newDeltaCache()
	sub := stream.NewDeltaSubscription([]string{"a/*", "b/s3", "b/none"}, nil, nil, false)
	req := &discovery.DeltaDiscoveryRequest{TypeUrl: meshv1.ServiceTypeURL, ResourceNamesSubscribe: []string{"a/*", "b/s3", "b/none"}}
	if r := watchOnce(t, c, req, &sub); r != nil {
		t.Fatal("answered before the first configuration")
	}
	// A parked first watch is answered by the first configuration.
	ch := make(chan cache.DeltaResponse, 1)
	if _, err := c.CreateDeltaWatch(req, &sub, ch); err != nil {
		t.Fatal(err)
	}
	if _, err := c.set(resources(service("a", "s1", "127.0.20.1"), service("a", "s2", "127.0.20.2"), service("b", "s3", "127.0.20.3"), service("b", "s4", "127.0.20.4"))); err != nil {
		t.Fatal(err)
	}
	resp := <-ch
	sub.SetReturnedResources(resp.GetReturnedResources())
	r, _ := resp.GetDeltaDiscoveryResponse()
	if got := respNames(r); got != "a/s1,a/s2,b/s3 -b/none" {
		t.Errorf("first sync: %s (b/none must be reported absent)", got)
	}
	// Absence is said once.
	if r := watchOnce(t, c, &discovery.DeltaDiscoveryRequest{TypeUrl: meshv1.ServiceTypeURL, ResponseNonce: "1"}, &sub); r != nil {
		t.Errorf("ACK answered with %s", respNames(r))
	}
	// Namespace membership follows the configuration; b/none appears.
	if _, err := c.set(resources(service("a", "s2", "127.0.20.2"), service("a", "s5", "127.0.20.5"), service("b", "s3", "127.0.20.3"), service("b", "none", "127.0.20.6"))); err != nil {
		t.Fatal(err)
	}
	r = watchOnce(t, c, &discovery.DeltaDiscoveryRequest{TypeUrl: meshv1.ServiceTypeURL, ResponseNonce: "2"}, &sub)
	if got := respNames(r); got != "a/s5,b/none -a/s1" {
		t.Errorf("after change: %s", got)
	}
	// Workloads match a namespace by their namespace field, not their uid.
	w := workload("a", "w1", "127.0.10.1")
	w.Uid = "0b4f0c9e-1111-4d0e-9c3b-000000000001"
	if _, err := c.set(resources(w, workload("b", "w2", "127.0.10.2"))); err != nil {
		t.Fatal(err)
	}
	ws := stream.NewDeltaSubscription([]string{"a/*"}, nil, nil, false)
	r = watchOnce(t, c, &discovery.DeltaDiscoveryRequest{TypeUrl: meshv1.WorkloadTypeURL, ResourceNamesSubscribe: []string{"a/*"}}, &ws)
	if got := respNames(r); got != "0b4f0c9e-1111-4d0e-9c3b-000000000001 -" {
		t.Errorf("workloads of namespace a: %s", got)
	}
	if _, err := c.CreateDeltaWatch(&discovery.DeltaDiscoveryRequest{TypeUrl: "type.googleapis.com/x.Y"}, &ws, ch); err == nil {
		t.Error("unknown type accepted")
	}
}

// A parked wildcard watch answered from the names a set changed gets what
// a full comparison would give it, over a random run of changes.
func TestChangedNamesAnswerEqualsFullAnswer(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	res := map[string]map[string]proto.Message{meshv1.WorkloadTypeURL: {}}
	put := func(i int) {
		w := workload("a", fmt.Sprintf("w%d", i), fmt.Sprintf("127.0.10.%d", i+1))
		w.Labels = map[string]string{"rev": fmt.Sprint(rng.IntN(1000))}
		res[meshv1.WorkloadTypeURL][w.Uid] = w
	}
	for i := range 20 {
		put(i)
	}
	c := newDeltaCache()
	if _, err := c.set(res); err != nil {
		t.Fatal(err)
	}
	type watcher struct {
		sub stream.Subscription
		ch  chan cache.DeltaResponse
	}
	open := func(w *watcher, first bool) func() {
		req := &discovery.DeltaDiscoveryRequest{TypeUrl: meshv1.WorkloadTypeURL}
		if first {
			req.ResourceNamesSubscribe = []string{"*"}
		} else {
			req.ResponseNonce = "n"
		}
		stampReader(req, reader{trusted: true})
		cancel, err := c.CreateDeltaWatch(req, &w.sub, w.ch)
		if err != nil {
			t.Fatal(err)
		}
		return cancel
	}
	take := func(w *watcher) *discovery.DeltaDiscoveryResponse {
		select {
		case r := <-w.ch:
			w.sub.SetReturnedResources(r.GetReturnedResources())
			out, _ := r.GetDeltaDiscoveryResponse()
			return out
		default:
			return nil
		}
	}
	fast := &watcher{sub: stream.NewDeltaSubscription([]string{"*"}, nil, nil, false), ch: make(chan cache.DeltaResponse, 1)}
	open(fast, true)
	take(fast)
	parked := false
	for step := range 200 {
		if !parked {
			open(fast, false) // parked, current
			parked = true
		}
		for range 1 + rng.IntN(3) {
			i := rng.IntN(25)
			if rng.IntN(4) == 0 {
				delete(res[meshv1.WorkloadTypeURL], fmt.Sprintf("a/w%d", i))
			} else {
				put(i)
			}
		}
		// The reference: a client holding what fast held, compared in full.
		ref := &watcher{sub: stream.NewDeltaSubscription([]string{"*"}, nil, maps.Clone(fast.sub.ReturnedResources()), false), ch: make(chan cache.DeltaResponse, 1)}
		if _, err := c.set(res); err != nil {
			t.Fatal(err)
		}
		got := take(fast)
		parked = got == nil
		cancelRef := open(ref, false)
		want := take(ref)
		cancelRef()
		if respNames(got) != respNames(want) {
			t.Fatalf("step %d: answered %q, a full comparison gives %q", step, respNames(got), respNames(want))
		}
		if got == nil {
			continue
		}
		if !maps.Equal(fast.sub.ReturnedResources(), ref.sub.ReturnedResources()) {
			t.Fatalf("step %d: version maps differ", step)
		}
	}
}
