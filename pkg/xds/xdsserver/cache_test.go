package xdsserver

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

	"github.com/causeway-mesh/causeway/pkg/xds"
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

// simStream is a delta stream as go-control-plane's server (v0.14) runs
// one against the cache: the subscription handed by value to each watch,
// the previous watch cancelled and the subscription updated before the
// next, and the returned map replaced by each response's NextVersionMap
// as it is sent. The server sends what is queued before it handles a
// request, but a change may answer the watch between the two (open).
type simStream struct {
	t      *testing.T
	c      *deltaCache
	id     int64
	first  bool
	sub    stream.Subscription
	ch     chan cache.DeltaResponse
	cancel func()
	nonce  int
	held   map[string]string // what the client holds
}

func newSimStream(t *testing.T, c *deltaCache, id int64, names []string, held map[string]string) *simStream {
	s := &simStream{t: t, c: c, id: id, first: true, ch: make(chan cache.DeltaResponse, 2), held: held}
	s.sub = stream.NewDeltaSubscription(names, nil, maps.Clone(held), false)
	s.open(&discovery.DeltaDiscoveryRequest{ResourceNamesSubscribe: names, InitialResourceVersions: maps.Clone(held)})
	return s
}

// request is a request from the client, handled after what is queued.
func (s *simStream) request(req *discovery.DeltaDiscoveryRequest) {
	for s.deliver() {
	}
	s.open(req)
}

// open handles a request now.
func (s *simStream) open(req *discovery.DeltaDiscoveryRequest) {
	s.t.Helper()
	req.TypeUrl = meshv1.WorkloadTypeURL
	if s.first {
		s.first = false
	} else {
		s.cancel()
		s.sub.UpdateResourceSubscriptions(req.ResourceNamesSubscribe, req.ResourceNamesUnsubscribe)
		req.ResponseNonce = fmt.Sprint(s.nonce)
	}
	stampReader(req, reader{stream: s.id, trusted: true})
	cancel, err := s.c.CreateDeltaWatch(req, s.sub, s.ch)
	if err != nil {
		s.t.Fatal(err)
	}
	s.cancel = cancel
}

// deliver sends one queued response to the client, if any.
func (s *simStream) deliver() bool {
	select {
	case r := <-s.ch:
		out, _ := r.GetDeltaDiscoveryResponse()
		for _, res := range out.GetResources() {
			s.held[res.GetName()] = res.GetVersion()
		}
		for _, name := range out.GetRemovedResources() {
			delete(s.held, name)
		}
		s.nonce++
		s.sub.SetReturnedResources(r.GetNextVersionMap())
		return true
	default:
		return false
	}
}

// settle delivers and acknowledges until the stream is parked.
func (s *simStream) settle() {
	for s.deliver() {
		s.request(&discovery.DeltaDiscoveryRequest{})
	}
}

// check fails unless the client holds want and the server's version map of
// the stream says so.
func (s *simStream) check(what string, want map[string]string) {
	s.t.Helper()
	if !maps.Equal(s.held, want) {
		s.t.Fatalf("%s: the client holds %v, the server serves %v", what, s.held, want)
	}
	if !maps.Equal(s.sub.ReturnedResources(), s.held) {
		s.t.Fatalf("%s: the server believes the client holds %v, it holds %v", what, s.sub.ReturnedResources(), s.held)
	}
}

// Over a random run of changes, acknowledgements (some after a change
// answered the watch they cancel), subscription changes and reconnections,
// a node proxy's stream whose watch is parked holds exactly the served
// workloads, and the server's version map of the stream says so: the
// answers computed from the names a change touched, and the
// acknowledgements parked without a comparison (deltaCache.current), lose
// nothing.
func TestIncrementalAnswersLoseNothing(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 2))
		res := map[string]map[string]proto.Message{meshv1.WorkloadTypeURL: {}, meshv1.ServiceTypeURL: {}}
		put := func(i int) {
			w := workload([]string{"a", "b"}[i%2], fmt.Sprintf("w%d", i), fmt.Sprintf("127.0.10.%d", i+1))
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
		nextID := int64(1)
		node := newSimStream(t, c, nextID, []string{xds.Wildcard}, map[string]string{})
		waypoint := newSimStream(t, c, 100, []string{"a" + xds.NamespaceWildcardSuffix}, map[string]string{})
		for step := range 300 {
			switch rng.IntN(7) {
			case 0, 1: // a change of workloads
				for range 1 + rng.IntN(3) {
					if i := rng.IntN(25); rng.IntN(4) == 0 {
						delete(res[meshv1.WorkloadTypeURL], fmt.Sprintf("%s/w%d", []string{"a", "b"}[i%2], i))
					} else {
						put(i)
					}
				}
			case 2: // a change of another type only
				sv := service("a", "s", "127.0.20.1")
				sv.Hostname = fmt.Sprint(rng.IntN(1000))
				res[meshv1.ServiceTypeURL][sv.Namespace+"/"+sv.Name] = sv
			case 3: // the client receives a response and acknowledges it
				if node.deliver() {
					node.request(&discovery.DeltaDiscoveryRequest{})
				}
			case 4: // a change answers the watch just before an acknowledgement cancels it
				for node.deliver() {
				}
				put(rng.IntN(25))
				if _, err := c.set(res); err != nil {
					t.Fatal(err)
				}
				node.open(&discovery.DeltaDiscoveryRequest{})
			case 5: // a name subscribed, then unsubscribed, over the wildcard
				name := fmt.Sprintf("a/w%d", 2*rng.IntN(12))
				node.request(&discovery.DeltaDiscoveryRequest{ResourceNamesSubscribe: []string{name}})
				node.request(&discovery.DeltaDiscoveryRequest{ResourceNamesUnsubscribe: []string{name}})
			case 6: // the client reconnects with what it holds
				node.settle()
				c.forget(node.id)
				nextID++
				node = newSimStream(t, c, nextID, []string{xds.Wildcard}, node.held)
			}
			if _, err := c.set(res); err != nil {
				t.Fatal(err)
			}
			served := func(ns string) map[string]string {
				out := map[string]string{}
				for name, e := range c.types[meshv1.WorkloadTypeURL] {
					if ns == "" || e.namespace == ns {
						out[name] = e.version
					}
				}
				return out
			}
			if len(node.ch) == 0 { // parked: nothing to send
				node.check(fmt.Sprintf("seed %d step %d: node proxy", seed, step), served(""))
			}
			waypoint.settle()
			waypoint.check(fmt.Sprintf("seed %d step %d: waypoint", seed, step), served("a"))
		}
	}
}
