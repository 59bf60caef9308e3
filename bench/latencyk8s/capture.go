package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
)

// tally is what the mesh's metrics say about a path's namespace: the
// connections the node proxies opened to it (outbound from the client's
// side, inbound into the server's) or from it, and the requests its
// waypoint answered.
type tally struct {
	outbound, inbound, any, waypointRequests float64
}

// tallies reads the metrics of the node proxies and of each L7 path's
// waypoint (through the API server's pod proxy, which reaches pods on
// every node) and sums them by path.
func (r *run) tallies(ctx context.Context) (map[path]tally, error) {
	out := map[path]tally{}
	for _, np := range r.nodeProxies {
		fams, err := r.metrics(ctx, np)
		if err != nil {
			return nil, err
		}
		for _, m := range fams["tcp_connections_opened_total"].GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			v := m.GetCounter().GetValue()
			for _, p := range r.paths {
				id := "/ns/" + p.namespace() + "/sa/"
				t := out[p]
				dst := strings.Contains(labels["destination_principal"], id)
				if dst && labels["direction"] == "outbound" {
					t.outbound += v
				}
				if dst && labels["direction"] == "inbound" {
					t.inbound += v
				}
				if dst || strings.Contains(labels["source_principal"], id) {
					t.any += v
				}
				out[p] = t
			}
		}
	}
	for p, wps := range r.waypoints {
		for _, wp := range wps {
			fams, err := r.metrics(ctx, wp)
			if err != nil {
				return nil, err
			}
			t := out[p]
			for _, m := range fams["requests_total"].GetMetric() {
				t.waypointRequests += m.GetCounter().GetValue()
			}
			out[p] = t
		}
	}
	return out, nil
}

// metrics reads a pod's Prometheus metrics on 15020.
func (r *run) metrics(ctx context.Context, p corev1.Pod) (map[string]*dto.MetricFamily, error) {
	text, err := r.c.Run(ctx, time.Minute, "", "get", "--raw",
		fmt.Sprintf("/api/v1/namespaces/%s/pods/%s:15020/proxy/metrics", p.Namespace, p.Name))
	if err != nil {
		return nil, err
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("metrics of %s/%s: %w", p.Namespace, p.Name, err)
	}
	return fams, nil
}

// checkCapture says how a path's traffic did not take its way, from the
// tallies before and after the run and the requests the run sent on it
// ("" when it did): no mesh and relay must leave no trace in the node proxies; L4
// and L7 must show connections leaving the client's node proxy and
// entering the server's; the waypoint must have answered at least every
// request sent on L7.
func checkCapture(p path, before, after tally, sent int64) string {
	var why []string
	switch p.mode {
	case noMesh, relay:
		if d := after.any - before.any; d != 0 {
			why = append(why, fmt.Sprintf("the node proxies opened %.0f connections from or to it", d))
		}
	default:
		if after.outbound <= before.outbound {
			why = append(why, "no connection left through a node proxy")
		}
		if after.inbound <= before.inbound {
			why = append(why, "no connection entered through a node proxy")
		}
	}
	if d := after.waypointRequests - before.waypointRequests; p.mode == l7 && d < float64(sent) {
		why = append(why, fmt.Sprintf("its waypoint answered %.0f requests of %d sent", d, sent))
	}
	return strings.Join(why, "; ")
}
