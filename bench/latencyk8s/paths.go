package main

import (
	"encoding/json"
	"fmt"
	"strings"
)

// mode is how a path's traffic crosses the mesh.
type mode int

const (
	noMesh mode = iota // neither namespace enrolled: the baseline
	l4                 // enrolled, no waypoint: client and server node proxies (HBONE)
	l7                 // enrolled, the server's Service bound to a waypoint with an allow-all policy
	// relay is not enrolled: two plain TCP relays (fortio's own, -P)
	// between client and server, one on each pod's node. Two hops that
	// only copy bytes: what any proxy pair adds at least on this host.
	relay
)

func (m mode) String() string { return [...]string{"nomesh", "l4", "l7", "relay"}[m] }

// modes are the modes of a run, in the paths' order.
var modes = []mode{noMesh, l4, l7, relay}

// path is one way a request goes from the client pod to the server pod:
// its mode and where the two pods run. Each path has a namespace of its
// own holding its client, server, Service and (L7) waypoint.
type path struct {
	mode mode
	// client and server are the nodes the two pods are pinned to.
	client, server string
}

// cross says whether the path crosses nodes.
func (p path) cross() bool { return p.client != p.server }

// name names the path in the figures: nomesh, l4, l7, relay, and
// nomesh_cross, l4_cross, ... when client and server are on different
// nodes.
func (p path) name() string {
	if p.cross() {
		return p.mode.String() + "_cross"
	}
	return p.mode.String()
}

func (p path) namespace() string { return "cw-latency-" + strings.ReplaceAll(p.name(), "_", "-") }

// baseline is the path the figures of p are compared with: no mesh with
// the same placement.
func (p path) baseline() path { return path{mode: noMesh, client: p.client, server: p.server} }

// paths are the paths of a run on these nodes: every mode with both pods
// on the first node, and, when there are two nodes or more, every mode
// with the client on the first and the server on the second.
func paths(nodes []string) []path {
	var ps []path
	for _, m := range modes {
		ps = append(ps, path{mode: m, client: nodes[0], server: nodes[0]})
	}
	if len(nodes) > 1 {
		for _, m := range modes {
			ps = append(ps, path{mode: m, client: nodes[0], server: nodes[1]})
		}
	}
	return ps
}

const (
	serverPort = 8080
	// waypoint is the Gateway of an L7 path's namespace; the deployer
	// names its Deployment the same and labels its pods with
	// waypointSelector.
	waypoint         = "waypoint"
	waypointSelector = "gateway.networking.k8s.io/gateway-name=" + waypoint
	// allowAll is the L7 path's policy: every request is allowed, so the
	// figures are the cost of asking the policy, not of its rules.
	allowAll = "package envoy.authz\n\ndefault allow := true\n"
	// relayFirst and relaySecond are a relay path's relays, pods and
	// Services: the client calls relayFirst (on its node), which carries
	// the connection to relaySecond (on the server's), which carries it to
	// the server.
	relayFirst, relaySecond = "relay-a", "relay-b"
)

// enrolled says whether the path's namespace is in the mesh.
func (m mode) enrolled() bool { return m == l4 || m == l7 }

// manifests are the objects of a path: its namespace (enrolled as the
// mode says), the server (fortio server) and its Service, the client (a
// fortio server too, idle: the load runs in it through kubectl exec),
// for L7 the waypoint and its policy, for relay the two relays and their
// Services.
func (p path) manifests(image string) string {
	ns := p.namespace()
	labels := map[string]string{}
	if p.mode.enrolled() {
		labels["causeway.dev/dataplane-mode"] = "mesh"
	}
	if p.mode == l7 {
		labels["causeway.dev/use-waypoint"] = waypoint
	}
	docs := []any{
		obj("v1", "Namespace", "", ns, map[string]any{"labels": labels}, nil),
		service(ns, "server"),
		fortioPod(ns, "server", p.server, image, serverArgs),
		fortioPod(ns, "client", p.client, image, serverArgs),
	}
	if p.mode == relay {
		// The Services first: a relay resolves its destination's name once,
		// when it starts.
		docs = append(docs, service(ns, relayFirst), service(ns, relaySecond),
			fortioPod(ns, relayFirst, p.client, image, relayArgs(relaySecond)),
			fortioPod(ns, relaySecond, p.server, image, relayArgs("server")))
	}
	if p.mode == l7 {
		docs = append(docs,
			obj("v1", "ConfigMap", ns, waypoint+"-policies", nil, map[string]any{
				"data": map[string]string{"authz.rego": allowAll}}),
			obj("gateway.networking.k8s.io/v1", "Gateway", ns, waypoint, nil, map[string]any{"spec": map[string]any{
				"gatewayClassName": "causeway-waypoint",
				"listeners":        []map[string]any{{"name": "mesh", "port": 15008, "protocol": "HBONE"}},
			}}))
	}
	var b strings.Builder
	for _, d := range docs {
		j, _ := json.Marshal(d) // maps, strings and numbers always marshal
		fmt.Fprintf(&b, "---\n%s\n", j)
	}
	return b.String()
}

// service is the Service of the pods labelled app=name, on serverPort.
func service(ns, name string) map[string]any {
	return obj("v1", "Service", ns, name, nil, map[string]any{"spec": map[string]any{
		"selector": map[string]string{"app": name},
		"ports": []map[string]any{{"name": "http", "port": serverPort, "targetPort": serverPort,
			"appProtocol": "http"}},
	}})
}

// serverArgs run fortio's HTTP server alone on serverPort.
var serverArgs = []string{"server", "-http-port", fmt.Sprint(serverPort), "-grpc-port", "disabled",
	"-redirect-port", "disabled", "-tcp-port", "disabled", "-udp-port", "disabled"}

// relayArgs run fortio's TCP proxy alone: serverPort to the Service to
// (io.Copy each way, a goroutine per direction and connection).
func relayArgs(to string) []string {
	return []string{"proxies", "-P", fmt.Sprintf("%d %s:%d", serverPort, to, serverPort)}
}

// fortioPod is a pod running fortio with args, pinned to a node by
// affinity (as a DaemonSet pins its pods), without resource limits (no
// throttling in the measured windows).
func fortioPod(ns, name, node, image string, args []string) map[string]any {
	return obj("v1", "Pod", ns, name, map[string]any{"labels": map[string]string{"app": name}}, map[string]any{"spec": map[string]any{
		"terminationGracePeriodSeconds": 1,
		"affinity": map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
			"nodeSelectorTerms": []map[string]any{{"matchFields": []map[string]any{
				{"key": "metadata.name", "operator": "In", "values": []string{node}}}}},
		}}},
		"containers": []map[string]any{{
			"name": "fortio", "image": image, "imagePullPolicy": "IfNotPresent",
			"args":  args,
			"ports": []map[string]any{{"name": "http", "containerPort": serverPort}},
		}},
	}})
}

// obj is a Kubernetes object: metadata extended by meta, fields by rest.
func obj(apiVersion, kind, ns, name string, meta, rest map[string]any) map[string]any {
	m := map[string]any{"name": name}
	if ns != "" {
		m["namespace"] = ns
	}
	for k, v := range meta {
		m[k] = v
	}
	o := map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": m}
	for k, v := range rest {
		o[k] = v
	}
	return o
}
