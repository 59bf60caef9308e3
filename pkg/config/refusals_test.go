package config

import (
	"errors"
	"strings"
	"testing"
)

// translateRefusing translates docs that hold refused objects; it fails the
// test if the set as a whole is rejected.
func translateRefusing(t *testing.T, docs string) (*Snapshot, map[string]string) {
	t.Helper()
	objs, err := Decode("file0.yaml", []byte(docs))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Translate(objs, Options{})
	if err != nil {
		t.Fatalf("rejected as a whole: %v", err)
	}
	refused := map[string]string{}
	for _, p := range s.Rejected {
		refused[p.Object] += p.Reason + ";"
	}
	return s, refused
}

const refusalBase = `
apiVersion: v1
kind: Namespace
metadata: {name: ns, labels: {causeway.dev/dataplane-mode: mesh}}
---
apiVersion: v1
kind: Service
metadata: {name: s, namespace: ns}
spec: {clusterIP: 127.0.20.1, selector: {app: s}, ports: [{port: 80}]}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: ns, labels: {app: s}}
spec: {nodeName: node-a, containers: [{name: c, image: i}]}
status: {podIP: 127.0.10.1}
`

// Each kind of refusal leaves the rest of the configuration served.
func TestRefusalsAreLocal(t *testing.T) {
	for _, c := range []struct {
		name, docs, object, reason string
		alsoRefused                []string
		check                      func(t *testing.T, s *Snapshot)
	}{
		{name: "route that the waypoint could not serve is not programmed", object: "HTTPRoute ns/bad", reason: "not a normalized path",
			docs: `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: bad, namespace: ns}
spec: {parentRefs: [{group: "", kind: Service, name: s}], rules: [{matches: [{path: {value: "/a//b"}}]}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: ok, namespace: ns}
spec: {parentRefs: [{group: "", kind: Service, name: s}], rules: [{matches: [{path: {value: "/a"}}]}]}
`,
			check: func(t *testing.T, s *Snapshot) {
				if s.HTTPRoutes["ns/bad"] != nil || s.HTTPRoutes["ns/ok"] == nil {
					t.Errorf("routes %v", s.HTTPRoutes)
				}
			}},
		{name: "a parentRef that does not resolve leaves only that parent out", object: "HTTPRoute ns/half", reason: "parentRefs[1]: dangling reference",
			docs: `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: half, namespace: ns}
spec: {parentRefs: [{group: "", kind: Service, name: s}, {group: "", kind: Service, name: nope}]}
`,
			check: func(t *testing.T, s *Snapshot) {
				if r := s.HTTPRoutes["ns/half"]; r == nil || len(r.Parents) != 1 || r.Parents[0].Name != "s" {
					t.Errorf("route %v", r)
				}
			}},
		{name: "a Service whose cluster IP does not parse refuses its traffic", object: "Service ns/bad", reason: "cluster IP",
			docs: `
apiVersion: v1
kind: Service
metadata: {name: bad, namespace: ns}
spec: {clusterIPs: [127.0.20.2, "nope"], selector: {app: s}, ports: [{port: 80}]}
`,
			check: func(t *testing.T, s *Snapshot) {
				if b := s.Services["ns/bad"]; b == nil || !strings.Contains(b.InvalidReason, "cluster IP") || len(b.Vips) != 1 {
					t.Errorf("refused service %v", b)
				}
				if s.Services["ns/s"].InvalidReason != "" {
					t.Errorf("the good service is refused too: %v", s.Services["ns/s"])
				}
			}},
		{name: "both claimants of an address are refused", object: "Pod ns/b", reason: "duplicate address: pod IP 127.0.10.9 is also used by Pod ns/c", alsoRefused: []string{"Pod ns/c"},
			docs: `
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: ns, labels: {app: s}}
spec: {containers: [{name: c, image: i}]}
status: {podIP: 127.0.10.9}
---
apiVersion: v1
kind: Pod
metadata: {name: c, namespace: ns}
spec: {containers: [{name: c, image: i}]}
status: {podIP: 127.0.10.9}
`,
			check: func(t *testing.T, s *Snapshot) {
				if s.Workloads["ns/b"] != nil || s.Workloads["ns/c"] != nil || s.Workloads["ns/a"] == nil {
					t.Errorf("workloads %v", s.Workloads)
				}
				if eps := s.Services["ns/s"].Endpoints; len(eps) != 1 || eps[0].Address != "127.0.10.1" {
					t.Errorf("a refused pod is an endpoint: %v", eps)
				}
			}},
		{name: "an endpoint for a missing pod is skipped, the slice's others kept", object: "EndpointSlice ns/s-1", reason: "endpoint targets Pod ns/gone",
			docs: `
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{port: 80}]
endpoints:
- {addresses: [127.0.10.1], targetRef: {kind: Pod, name: a}}
- {addresses: [127.0.10.7], targetRef: {kind: Pod, name: gone}}
`,
			check: func(t *testing.T, s *Snapshot) {
				if eps := s.Services["ns/s"].Endpoints; len(eps) != 1 || eps[0].WorkloadUid != "ns/a" {
					t.Errorf("endpoints %v", eps)
				}
			}},
		{name: "a refused pod is no endpoint of a slice naming it", object: "Pod ns/bad", reason: "spec.hostname",
			docs: `
apiVersion: v1
kind: Pod
metadata: {name: bad, namespace: ns}
spec: {hostname: Not_A_Label, containers: [{name: c, image: i}]}
status: {podIP: 127.0.10.8}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: ns, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
ports: [{port: 80}]
endpoints:
- {addresses: [127.0.10.1], targetRef: {kind: Pod, name: a}}
- {addresses: [127.0.10.8], targetRef: {kind: Pod, name: bad}}
`,
			check: func(t *testing.T, s *Snapshot) {
				if eps := s.Services["ns/s"].Endpoints; len(eps) != 1 || eps[0].WorkloadUid != "ns/a" {
					t.Errorf("endpoints %v", eps)
				}
			}},
		{name: "a stray waypoint pod with another account is refused, the waypoint kept", object: "Pod ns/wp-stray", reason: "different service accounts",
			docs: `
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: wp, namespace: ns}
spec: {gatewayClassName: causeway-waypoint, listeners: [{name: mesh, port: 15008, protocol: HBONE}]}
---
apiVersion: v1
kind: Pod
metadata: {name: wp-stray, namespace: ns, labels: {gateway.networking.k8s.io/gateway-name: wp}}
spec: {serviceAccountName: other, containers: [{name: c, image: i}]}
status: {podIP: 127.0.10.3}
---
apiVersion: v1
kind: Pod
metadata: {name: wp-x, namespace: ns, labels: {gateway.networking.k8s.io/gateway-name: wp}}
spec: {serviceAccountName: wp, containers: [{name: c, image: i}]}
status: {podIP: 127.0.10.4}
`,
			check: func(t *testing.T, s *Snapshot) {
				w := s.Waypoints["ns/wp"]
				if w == nil || w.Identity != "spiffe://cluster.local/ns/ns/sa/wp" || len(w.Addresses) != 1 || w.Addresses[0] != "127.0.10.4" {
					t.Errorf("waypoint %v", w)
				}
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, refused := translateRefusing(t, refusalBase+"---\n"+c.docs)
			if !strings.Contains(refused[c.object], c.reason) {
				t.Errorf("%s not refused for %q: %v", c.object, c.reason, s.Rejected)
			}
			if want := 1 + len(c.alsoRefused); len(refused) != want {
				t.Errorf("refused %v; want %s alone (and %v)", s.Rejected, c.object, c.alsoRefused)
			}
			for _, o := range c.alsoRefused {
				if refused[o] == "" {
					t.Errorf("%s not refused: %v", o, s.Rejected)
				}
			}
			if s.Workloads["ns/a"] == nil {
				t.Errorf("the good pod is gone: %v", s.Workloads)
			}
			c.check(t, s)
		})
	}
}

// What is not a configuration at all is rejected whole.
func TestNotAConfigurationIsRejectedWhole(t *testing.T) {
	objs, err := Decode("file0.yaml", []byte(refusalBase+"---\n"+refusalBase))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Translate(objs, Options{})
	var inv *InvalidError
	if s != nil || !errors.As(err, &inv) || !strings.Contains(err.Error(), "defined twice") {
		t.Fatalf("objects defined twice: %v, %v", s, err)
	}
}
