package xds

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
// parked on each type; one workload changes. "fresh" gives every message
// anew (as a whole translation does), "reused" gives the unchanged ones
// again (as config.Incremental does), in one invocation.
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
		sub stream.Subscription
		ch  chan cache.DeltaResponse
	}
	var clients []*client
	for range 100 {
		for _, t := range []string{meshv1.WorkloadTypeURL, meshv1.ServiceTypeURL} {
			cl := &client{sub: stream.NewDeltaSubscription([]string{"*"}, nil, nil, false), ch: make(chan cache.DeltaResponse, 1)}
			req := &discovery.DeltaDiscoveryRequest{TypeUrl: t, ResourceNamesSubscribe: []string{"*"}}
			stampReader(req, reader{trusted: true})
			if _, err := c.CreateDeltaWatch(req, &cl.sub, cl.ch); err != nil {
				b.Fatal(err)
			}
			r := <-cl.ch // the first sync
			cl.sub.SetReturnedResources(r.GetReturnedResources())
			clients = append(clients, cl)
		}
	}
	park := func() {
		for _, cl := range clients {
			req := &discovery.DeltaDiscoveryRequest{TypeUrl: meshv1.WorkloadTypeURL, ResponseNonce: "n"}
			stampReader(req, reader{trusted: true})
			if _, err := c.CreateDeltaWatch(req, &cl.sub, cl.ch); err != nil {
				b.Fatal(err)
			}
		}
	}
	park()
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
		b.StopTimer()
		for _, cl := range clients {
			select {
			case r := <-cl.ch:
				cl.sub.SetReturnedResources(r.GetReturnedResources())
			default:
			}
		}
		park()
		b.StartTimer()
	}
}
