package config

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

const workloadsConfig = `
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {causeway.dev/dataplane-mode: mesh}}
---
apiVersion: v1
kind: Pod
metadata:
  name: api-1
  namespace: shop
  uid: 0b4f0c9e-1111-4d0e-9c3b-000000000001
  labels: {app: api}
  annotations: {causeway.dev/app-address: 127.0.110.1}
spec:
  nodeName: node-a
  serviceAccountName: api
  containers:
  - name: api
    image: api
    ports: [{name: http, containerPort: 8080}, {name: dns, containerPort: 53, protocol: UDP}]
status: {podIPs: [{ip: 127.0.10.1}, {ip: "fd00:0:0::1"}]}
---
apiVersion: v1
kind: Pod
metadata: {name: api-2, namespace: shop, labels: {app: api}}
spec:
  nodeName: node-b
  containers:
  - name: api
    image: api
    ports: [{name: http, containerPort: 9090}]
status: {podIP: 127.0.10.2}
---
apiVersion: v1
kind: Pod
metadata: {name: api-3-notready, namespace: shop, labels: {app: api}}
spec: {nodeName: node-b, containers: [{name: api, image: api, ports: [{name: http, containerPort: 8080}]}]}
status: {podIP: 127.0.10.3, conditions: [{type: Ready, status: "False"}]}
---
apiVersion: v1
kind: Pod
metadata: {name: api-4-done, namespace: shop, labels: {app: api}}
spec: {nodeName: node-b, containers: [{name: api, image: api}]}
status: {phase: Succeeded, podIP: 127.0.10.4}
---
apiVersion: v1
kind: Pod
metadata: {name: api-5-noname, namespace: shop, labels: {app: api}}
spec: {nodeName: node-b, containers: [{name: api, image: api}]}
status: {podIP: 127.0.10.5}
---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: shop}
spec:
  clusterIPs: [127.0.20.1, "fd00::20:1"]
  selector: {app: api}
  ports:
  - {name: http, port: 80, targetPort: http, appProtocol: http}
  - {name: metrics, port: 9100}
  - {name: dns, port: 53, protocol: UDP}
---
apiVersion: v1
kind: Service
metadata: {name: sliced, namespace: shop}
spec:
  clusterIP: 127.0.20.2
  ports: [{name: grpc, port: 9000, targetPort: grpc, appProtocol: grpc}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sliced-abc, namespace: shop, labels: {kubernetes.io/service-name: sliced}}
addressType: IPv4
ports: [{name: grpc, port: 9443}]
endpoints:
- addresses: [127.0.10.2]
  targetRef: {kind: Pod, name: api-2}
- addresses: [127.0.10.3]
  conditions: {ready: false}
  targetRef: {kind: Pod, name: api-3-notready}
- addresses: [10.9.9.9]
`

func TestWorkloadTranslation(t *testing.T) {
	s := mustTranslate(t, workloadsConfig)
	assertProto(t, "api-1", &meshv1.Workload{
		Uid: "0b4f0c9e-1111-4d0e-9c3b-000000000001", Name: "api-1", Namespace: "shop",
		ServiceAccount: "api", Identity: "spiffe://cluster.local/ns/shop/sa/api",
		Node: "node-a", Addresses: []string{"127.0.10.1", "fd00::1"}, Hbone: true,
		Labels: map[string]string{"app": "api"}, AppAddress: "127.0.110.1",
		ServingPorts: []uint32{8080, 9100}, // the http container port, and the metrics target port; UDP ignored
		WorkloadName: "api-1", WorkloadType: "pod", CanonicalService: "api", CanonicalRevision: "latest", App: "api",
	}, s.Workloads["0b4f0c9e-1111-4d0e-9c3b-000000000001"])
	assertProto(t, "api-2 (uid defaults to ns/name, SA to default)", &meshv1.Workload{
		Uid: "shop/api-2", Name: "api-2", Namespace: "shop",
		ServiceAccount: "default", Identity: "spiffe://cluster.local/ns/shop/sa/default",
		Node: "node-b", Addresses: []string{"127.0.10.2"}, Hbone: true,
		Labels: map[string]string{"app": "api"}, ServingPorts: []uint32{9090, 9100, 9443},
		WorkloadName: "api-2", WorkloadType: "pod", CanonicalService: "api", CanonicalRevision: "latest", App: "api",
	}, s.Workloads["shop/api-2"])
	if _, ok := s.Workloads["shop/api-4-done"]; ok {
		t.Error("a Succeeded pod must not be a workload")
	}
	if !s.HasWorkload("node-a", trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/api")) ||
		s.HasWorkload("node-b", trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/api")) ||
		!s.HasWorkload("node-b", trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/default")) {
		t.Errorf("node index wrong: a=%v b=%v", s.NodeIdentities("node-a"), s.NodeIdentities("node-b"))
	}
	var m Model
	if m.HasWorkload("node-a", trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/api")) {
		t.Error("an empty model must authorize nothing")
	}
	m.Set(s)
	if !m.HasWorkload("node-a", trusttest.Identity(t, "spiffe://cluster.local/ns/shop/sa/api")) {
		t.Error("model does not answer from its snapshot")
	}
}

func TestServiceTranslation(t *testing.T) {
	s := mustTranslate(t, workloadsConfig)
	assertProto(t, "selector-derived endpoints, named target port resolved per pod", &meshv1.Service{
		Name: "api", Namespace: "shop", Hostname: "api.shop.svc.cluster.local",
		Vips: []string{"127.0.20.1", "fd00::20:1"},
		Ports: []*meshv1.ServicePort{
			{Name: "http", Port: 80, TargetPort: 0, AppProtocol: "http"},
			{Name: "metrics", Port: 9100, TargetPort: 9100},
		},
		Endpoints: []*meshv1.Endpoint{
			{WorkloadUid: "0b4f0c9e-1111-4d0e-9c3b-000000000001", Address: "127.0.10.1", Ports: map[uint32]uint32{80: 8080, 9100: 9100}},
			{WorkloadUid: "shop/api-2", Address: "127.0.10.2", Ports: map[uint32]uint32{80: 9090, 9100: 9100}},
			// api-5 declares no "http" port: only the numeric target applies.
			{WorkloadUid: "shop/api-5-noname", Address: "127.0.10.5", Ports: map[uint32]uint32{9100: 9100}},
			{WorkloadUid: "0b4f0c9e-1111-4d0e-9c3b-000000000001", Address: "fd00::1", Ports: map[uint32]uint32{80: 8080, 9100: 9100}},
		},
	}, s.Services["shop/api"])
	assertProto(t, "endpoints from an EndpointSlice", &meshv1.Service{
		Name: "sliced", Namespace: "shop", Hostname: "sliced.shop.svc.cluster.local",
		Vips:  []string{"127.0.20.2"},
		Ports: []*meshv1.ServicePort{{Name: "grpc", Port: 9000, AppProtocol: "grpc"}},
		Endpoints: []*meshv1.Endpoint{
			{Address: "10.9.9.9", Ports: map[uint32]uint32{9000: 9443}},
			{WorkloadUid: "shop/api-2", Address: "127.0.10.2", Ports: map[uint32]uint32{9000: 9443}},
		},
	}, s.Services["shop/sliced"])
}

func TestExampleConfigTranslates(t *testing.T) {
	data, err := os.ReadFile("../../examples/local/mesh.yaml")
	if err != nil {
		t.Skipf("example not present: %v", err)
	}
	objs, err := Decode("mesh.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Translate(objs, Options{}); err != nil {
		t.Fatal(err)
	}
}

func TestRejections(t *testing.T) {
	base := `
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: ns}
spec: {containers: [{name: c, image: i}]}
status: {podIP: 127.0.10.1}
---
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns}
spec: {clusterIP: 127.0.20.1, ports: [{port: 80}]}
`
	cases := []struct {
		name, doc, reason string
	}{
		{"YAML syntax", "apiVersion: v1\nkind: Pod\nmetadata: {name: [unclosed\n", "YAML syntax"},
		{"unknown kind", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n", "unknown kind Deployment"},
		{"unknown field", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {nodeNmae: x}\n", "unknown field"},
		{"not an object", "- a\n- b\n", "not an object"},
		{"duplicate pod IP", "apiVersion: v1\nkind: Pod\nmetadata: {name: b, namespace: ns}\nspec: {containers: [{name: c, image: i}]}\nstatus: {podIP: 127.0.10.1}\n", "duplicate address: pod IP 127.0.10.1 is also used by Pod ns/a"},
		{"duplicate VIP", "apiVersion: v1\nkind: Service\nmetadata: {name: t, namespace: ns}\nspec: {clusterIP: 127.0.20.1}\n", "duplicate address: VIP 127.0.20.1 is also used by Service ns/s"},
		{"VIP equal to a pod IP", "apiVersion: v1\nkind: Service\nmetadata: {name: t, namespace: ns}\nspec: {clusterIP: 127.0.10.1}\n", "duplicate address: VIP 127.0.10.1"},
		{"duplicate object", "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: ns}\nspec: {clusterIP: 127.0.20.9}\n", "defined twice (also in file0.yaml)"},
		{"bad pod IP", "apiVersion: v1\nkind: Pod\nmetadata: {name: b, namespace: ns}\nspec: {containers: [{name: c, image: i}]}\nstatus: {podIP: 300.1.1.1}\n", "not a usable IP address"},
		{"empty local app", "apiVersion: v1\nkind: Pod\nmetadata: {name: b, namespace: ns, annotations: {causeway.dev/local-app: ' '}}\nspec: {containers: [{name: c, image: i}]}\n", "annotation causeway.dev/local-app: empty"},
		{"bad app address", "apiVersion: v1\nkind: Pod\nmetadata: {name: b, namespace: ns, annotations: {causeway.dev/app-address: nowhere}}\nspec: {containers: [{name: c, image: i}]}\n", "causeway.dev/app-address"},
		{"slice for a missing service", "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: x, namespace: ns, labels: {kubernetes.io/service-name: gone}}\naddressType: IPv4\nendpoints: []\n", "dangling reference: Service ns/gone does not exist"},
		{"slice endpoint for a missing pod", "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: x, namespace: ns, labels: {kubernetes.io/service-name: s}}\naddressType: IPv4\nendpoints: [{addresses: [127.0.10.9], targetRef: {kind: Pod, name: gone}}]\n", "dangling reference: endpoint targets Pod ns/gone"},
		{"local app on a waypoint pod", "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: wp, namespace: ns}\nspec: {gatewayClassName: causeway-waypoint, listeners: [{name: mesh, port: 15008, protocol: HBONE}]}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: w, namespace: ns, labels: {gateway.networking.k8s.io/gateway-name: wp}, annotations: {causeway.dev/local-app: echo}}\nspec: {containers: [{name: c, image: i}]}\nstatus: {podIP: 127.0.10.7}\n", "a waypoint's pod runs the waypoint"},
		{"waypoint pod without its gateway", "apiVersion: v1\nkind: Pod\nmetadata: {name: w, namespace: ns, labels: {gateway.networking.k8s.io/gateway-name: wp}}\nspec: {containers: [{name: c, image: i}]}\n", "dangling reference: label gateway.networking.k8s.io/gateway-name=wp"},
		{"waypoint without HBONE listener", "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: wp, namespace: ns}\nspec: {gatewayClassName: causeway-waypoint, listeners: [{name: http, port: 80, protocol: HTTP}]}\n", "needs a listener with protocol HBONE"},
		{"bad waypoint-for", "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: wp, namespace: ns, labels: {causeway.dev/waypoint-for: everything}}\nspec: {gatewayClassName: causeway-waypoint, listeners: [{name: mesh, port: 15008, protocol: HBONE}]}\n", "want service, workload or all"},
		{"bad service account", "apiVersion: v1\nkind: Pod\nmetadata: {name: b, namespace: ns}\nspec: {serviceAccountName: \"a/b\", containers: [{name: c, image: i}]}\n", "identity"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := translateYAML(t, base, c.doc)
			wantProblem(t, err, "file1.yaml", c.reason)
		})
	}
	t.Run("every problem is reported, not only the first", func(t *testing.T) {
		_, err := translateYAML(t, base, "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n---\nkind: Pod\nmetadata: {name: [\n")
		wantProblem(t, err, "file1.yaml", "unknown kind Deployment")
		wantProblem(t, err, "file1.yaml", "YAML syntax")
		if !strings.Contains(err.Error(), "document 2") {
			t.Errorf("error does not name the document: %v", err)
		}
	})
}

func FuzzDecodeTranslate(f *testing.F) {
	f.Add([]byte(workloadsConfig))
	f.Add([]byte(routeServices + "---\n" + httpRouteYAML("- matches: [{path: {value: /a}}]")))
	f.Add([]byte("apiVersion: v1\nkind: Pod\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := Decode("fuzz.yaml", data)
		if err != nil {
			return
		}
		s, err := Translate(objs, Options{})
		if err != nil {
			return
		}
		for _, res := range s.Resources() {
			for n, m := range res {
				if err := meshv1.Validate(m); err != nil {
					t.Fatalf("translation produced an invalid resource %s: %v", n, err)
				}
			}
		}
	})
}

// A Service's EndpointSlices are joined; a terminating endpoint serves only
// when no endpoint of any slice is ready.
func TestEndpointSlicesJoined(t *testing.T) {
	svc := `
apiVersion: v1
kind: Service
metadata: {name: db, namespace: data}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: sql, port: 5432}]
`
	slice := func(name, endpoints string) string {
		return `
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ` + name + `, namespace: data, labels: {kubernetes.io/service-name: db}}
addressType: IPv4
ports: [{name: sql, port: 15432}]
endpoints:` + endpoints
	}
	addrs := func(s *Snapshot) []string {
		var out []string
		for _, e := range s.Services["data/db"].Endpoints {
			out = append(out, e.Address)
			if e.Ports[5432] != 15432 {
				t.Errorf("endpoint %s ports %v, want 5432->15432", e.Address, e.Ports)
			}
		}
		return out
	}
	s := mustTranslate(t, svc,
		slice("db-a", `
- addresses: [10.244.0.1]
- addresses: [10.244.0.9]
  conditions: {ready: false}`),
		slice("db-b", `
- addresses: [10.244.0.2]
  conditions: {ready: true, serving: true}
- addresses: [10.244.0.3]
  conditions: {ready: false, serving: true, terminating: true}`))
	if got, want := addrs(s), []string{"10.244.0.1", "10.244.0.2"}; !slices.Equal(got, want) {
		t.Errorf("ready endpoints of two slices: got %v, want %v", got, want)
	}
	s = mustTranslate(t, svc,
		slice("db-a", `
- addresses: [10.244.0.1]
  conditions: {ready: false, serving: false, terminating: true}`),
		slice("db-b", `
- addresses: [10.244.0.3]
  conditions: {ready: false, serving: true, terminating: true}`))
	if got, want := addrs(s), []string{"10.244.0.3"}; !slices.Equal(got, want) {
		t.Errorf("no ready endpoint: got %v, want the serving terminating one %v", got, want)
	}
}

// A headless Service's endpoints carry their pods' own names when the pods
// have a stable hostname under it (StatefulSet pods), from the selector and
// from EndpointSlices alike; a Service with a VIP has none.
func TestHeadlessServiceAddressesPods(t *testing.T) {
	pod := func(name, ip string) string {
		return `
apiVersion: v1
kind: Pod
metadata: {name: ` + name + `, namespace: data, labels: {app: ring}}
spec: {nodeName: node-a, hostname: ` + name + `, subdomain: ring, containers: [{name: c, image: i}]}
status: {podIP: ` + ip + `}
`
	}
	svc := func(name, clusterIP string) string {
		return `
apiVersion: v1
kind: Service
metadata: {name: ` + name + `, namespace: data}
spec: {clusterIP: ` + clusterIP + `, selector: {app: ring}, ports: [{port: 7000}]}
`
	}
	s := mustTranslate(t, pod("ring-0", "127.0.10.1"), pod("ring-1", "127.0.10.2"), svc("ring", "None"), svc("other", "127.0.20.9"), `
apiVersion: v1
kind: Service
metadata: {name: sliced, namespace: data}
spec: {clusterIP: None, ports: [{name: p, port: 7000}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sliced-1, namespace: data, labels: {kubernetes.io/service-name: sliced}}
addressType: IPv4
ports: [{name: p, port: 7000}]
endpoints:
- addresses: [127.0.10.1]
  hostname: ring-0
  targetRef: {kind: Pod, name: ring-0}
`)
	hosts := func(svc string) []string {
		var out []string
		for _, e := range s.Services["data/"+svc].Endpoints {
			out = append(out, e.Address+"="+e.Hostname)
		}
		return out
	}
	if got, want := hosts("ring"), []string{"127.0.10.1=ring-0.ring.data.svc.cluster.local", "127.0.10.2=ring-1.ring.data.svc.cluster.local"}; !slices.Equal(got, want) {
		t.Errorf("headless service: %v, want %v", got, want)
	}
	if got, want := hosts("sliced"), []string{"127.0.10.1=ring-0.sliced.data.svc.cluster.local"}; !slices.Equal(got, want) {
		t.Errorf("headless service by slices: %v, want %v", got, want)
	}
	if got, want := hosts("other"), []string{"127.0.10.1=", "127.0.10.2="}; !slices.Equal(got, want) {
		t.Errorf("service with a VIP: %v, want %v", got, want)
	}
	_, err := translateYAML(t, `
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: data}
spec: {hostname: Not_A_Label, containers: [{name: c, image: i}]}
`)
	wantProblem(t, err, "", `spec.hostname "Not_A_Label"`)
}
