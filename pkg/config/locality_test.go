package config

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

const localityConfig = `
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels: {topology.kubernetes.io/region: r1, topology.kubernetes.io/zone: z1, kubernetes.io/hostname: node-a}
---
apiVersion: v1
kind: Node
metadata: {name: node-b, labels: {kubernetes.io/hostname: node-b}}
---
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {causeway.dev/dataplane-mode: mesh}}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: shop, labels: {app: api}}
spec: {nodeName: node-a, containers: [{name: api, image: api}]}
status: {podIP: 127.0.10.1}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: shop, labels: {app: api}}
spec: {nodeName: node-b, containers: [{name: api, image: api}]}
status: {podIP: 127.0.10.2}
---
apiVersion: v1
kind: Pod
metadata: {name: c, namespace: shop, labels: {app: api}}
spec: {nodeName: node-gone, containers: [{name: api, image: api}]}
status: {podIP: 127.0.10.3}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: shop}
spec:
  gatewayClassName: causeway-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
---
apiVersion: v1
kind: Service
metadata: {name: waypoint, namespace: shop, labels: {causeway.dev/use-waypoint: none}}
spec:
  clusterIP: 127.0.20.9
  trafficDistribution: PreferSameNode
  ports: [{name: mesh, port: 15008}]
`

func localityService(name, distribution string) string {
	td := ""
	if distribution != "" {
		td = "\n  trafficDistribution: " + distribution
	}
	return `
apiVersion: v1
kind: Service
metadata: {name: ` + name + `, namespace: shop}
spec:
  selector: {app: api}` + td + `
  ports: [{name: http, port: 80}]
`
}

// A workload's locality is its node's topology labels; a Service's
// trafficDistribution is carried, and a waypoint's is its own Service's.
func TestLocalityTranslation(t *testing.T) {
	s := mustTranslate(t, localityConfig,
		localityService("near", "PreferSameNode"), localityService("close", "PreferClose"), localityService("zone", "PreferSameZone"),
		localityService("unknown", "PreferSomewhereElse"), localityService("plain", ""))
	assertProto(t, "locality of a labelled node's pod", &meshv1.Locality{Region: "r1", Zone: "z1"}, s.Workloads["shop/a"].GetLocality())
	for _, uid := range []string{"shop/b", "shop/c"} {
		if l := s.Workloads[uid].GetLocality(); l != nil {
			t.Errorf("%s (a node without topology labels, or unknown): locality %v, want none", uid, l)
		}
	}
	for name, want := range map[string]meshv1.TrafficDistribution{
		"near":    meshv1.TrafficDistribution_PREFER_SAME_NODE,
		"close":   meshv1.TrafficDistribution_PREFER_CLOSE,
		"zone":    meshv1.TrafficDistribution_PREFER_CLOSE,
		"unknown": meshv1.TrafficDistribution_ANY,
		"plain":   meshv1.TrafficDistribution_ANY,
	} {
		if got := s.Services["shop/"+name].GetTrafficDistribution(); got != want {
			t.Errorf("service %s: trafficDistribution %v, want %v", name, got, want)
		}
	}
	if got := s.Waypoints["shop/waypoint"].GetTrafficDistribution(); got != meshv1.TrafficDistribution_PREFER_SAME_NODE {
		t.Errorf("waypoint: trafficDistribution %v, want its Service's PreferSameNode", got)
	}

	// A node's labels change: the incremental translation translates its
	// pods again (a Node is global, as a Namespace is).
	var objs []Object
	for _, d := range []string{localityConfig, localityService("near", "PreferSameNode")} {
		o, err := Decode("locality.yaml", []byte(d))
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o...)
	}
	in := NewIncremental(Options{})
	sameTranslation(t, "nodes", in, objs)
	for i, o := range objs {
		if n, ok := o.Obj.(*corev1.Node); ok && n.Name == "node-b" {
			c := n.DeepCopyObject().(*corev1.Node)
			c.Labels[corev1.LabelTopologyZone] = "z2"
			objs[i].Obj = runtime.Object(c)
		}
	}
	got := sameTranslation(t, "a node's zone labelled", in, objs)
	assertProto(t, "locality after the node's label", &meshv1.Locality{Zone: "z2"}, got.Workloads["shop/b"].GetLocality())
}
