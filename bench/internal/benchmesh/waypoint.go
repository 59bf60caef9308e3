package benchmesh

import (
	"fmt"
	"strings"
)

// WaypointPod places one waypoint replica: the node it runs on and its pod
// address.
type WaypointPod struct{ Node, IP string }

// WaypointYAML is a namespace's waypoint as a local mesh document holds it:
// the Gateway `waypoint` of class causeway-waypoint serving waypointFor
// ("service", "workload" or "all"), then its pods waypoint-0, waypoint-1, …
// in the order given. Each object ends with a document separator, so the
// text goes between two others of the mesh's YAML.
func WaypointYAML(ns, waypointFor string, pods ...WaypointPod) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: %s, labels: {causeway.dev/waypoint-for: %s}}
spec:
  gatewayClassName: causeway-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
---
`, ns, waypointFor)
	for i, p := range pods {
		fmt.Fprintf(&b, `apiVersion: v1
kind: Pod
metadata: {name: waypoint-%d, namespace: %s, labels: {gateway.networking.k8s.io/gateway-name: waypoint}}
spec: {nodeName: %s, serviceAccountName: waypoint, containers: [{name: waypoint, image: causeway/waypoint}]}
status: {podIP: %s}
---
`, i, ns, p.Node, p.IP)
	}
	return b.String()
}
