package xdsserver

import (
	"fmt"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"google.golang.org/protobuf/proto"

	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// BenchmarkUpdateOneChange is one pod change at the scale of the
// Kubernetes benchmark (bench/README.md): 10,000 workloads and 1,000
// services served, 100 node proxies holding everything with a watch
// parked on each type; one workload changes, and every node proxy's
// acknowledgement opens its next watch. "fresh" gives every message anew
// (as a whole translation does), "reused" gives the unchanged ones again
// (as config.Incremental does), in one invocation.
func BenchmarkUpdateOneChange(b *testing.B) {
	b.Run("fresh", func(b *testing.B) { benchmarkUpdateOneChange(b, true) })
	b.Run("reused", func(b *testing.B) { benchmarkUpdateOneChange(b, false) })
}

func benchmarkUpdateOneChange(b *testing.B, fresh bool) {
	res := map[string]map[string]proto.Message{meshv1.WorkloadTypeURL: {}, meshv1.ServiceTypeURL: {}}
	for i := range 10000 {
		w := workload(fmt.Sprintf("ns-%d", i/100), fmt.Sprintf("w-%d", i), fmt.Sprintf("10.1.%d.%d", i/256, i%256))
		res[meshv1.WorkloadTypeURL][w.Uid] = w
	}
	for i := range 1000 {
		s := service(fmt.Sprintf("ns-%d", i/10), fmt.Sprintf("s-%d", i), fmt.Sprintf("10.96.%d.%d", i/256, i%256))
		res[meshv1.ServiceTypeURL][s.Namespace+"/"+s.Name] = s
	}
	c := newDeltaCache()
	if _, err := c.set(res); err != nil {
		b.Fatal(err)
	}
	type client struct {
		stream  int64
		typeURL string
		sub     stream.Subscription
		ch      chan cache.DeltaResponse
	}
	var clients []*client
	for i := range 100 {
		for _, t := range []string{meshv1.WorkloadTypeURL, meshv1.ServiceTypeURL} {
			cl := &client{stream: int64(i + 1), typeURL: t, sub: stream.NewDeltaSubscription([]string{"*"}, nil, nil, false), ch: make(chan cache.DeltaResponse, 1)}
			req := &discovery.DeltaDiscoveryRequest{TypeUrl: t, ResourceNamesSubscribe: []string{"*"}}
			stampReader(req, reader{stream: cl.stream, trusted: true})
			if _, err := c.CreateDeltaWatch(req, cl.sub, cl.ch); err != nil {
				b.Fatal(err)
			}
			r := <-cl.ch // the first sync
			cl.sub.SetReturnedResources(r.GetNextVersionMap())
			clients = append(clients, cl)
		}
	}
	// The delta server: a response sent becomes the stream's version map,
	// and the client's acknowledgement opens the next watch.
	ack := func(cl *client) {
		req := &discovery.DeltaDiscoveryRequest{TypeUrl: cl.typeURL, ResponseNonce: "n"}
		stampReader(req, reader{stream: cl.stream, trusted: true})
		if _, err := c.CreateDeltaWatch(req, cl.sub, cl.ch); err != nil {
			b.Fatal(err)
		}
	}
	for _, cl := range clients {
		ack(cl)
	}
	changed := res[meshv1.WorkloadTypeURL]["ns-0/w-0"].(*meshv1.Workload)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if fresh {
			b.StopTimer()
			for _, byName := range res {
				for n, m := range byName {
					byName[n] = proto.Clone(m)
				}
			}
			b.StartTimer()
		}
		w := proto.Clone(changed).(*meshv1.Workload)
		w.Labels = map[string]string{"rev": fmt.Sprint(i)}
		res[meshv1.WorkloadTypeURL][w.Uid] = w
		if _, err := c.set(res); err != nil {
			b.Fatal(err)
		}
		for _, cl := range clients {
			select {
			case r := <-cl.ch:
				cl.sub.SetReturnedResources(r.GetNextVersionMap())
				ack(cl)
			default:
			}
		}
	}
}
