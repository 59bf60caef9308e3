package config

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

// waypoints used by the binding table: one per waypoint-for value, one
// without the label (default: service), and one in another namespace.
const bindingWaypoints = `
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: wp-svc, namespace: app, labels: {causeway.dev/waypoint-for: service}}
spec:
  gatewayClassName: causeway-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: wp-wl, namespace: app, labels: {causeway.dev/waypoint-for: workload}}
spec:
  gatewayClassName: causeway-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: wp-all, namespace: app, labels: {causeway.dev/waypoint-for: all}}
spec:
  gatewayClassName: causeway-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: wp-default, namespace: app}
spec:
  gatewayClassName: causeway-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: shared, namespace: infra, labels: {causeway.dev/waypoint-for: all}}
spec:
  gatewayClassName: causeway-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE, allowedRoutes: {namespaces: {from: All}}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: private, namespace: infra, labels: {causeway.dev/waypoint-for: all}}
spec:
  gatewayClassName: causeway-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: selective, namespace: infra, labels: {causeway.dev/waypoint-for: all}}
spec:
  gatewayClassName: causeway-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE, allowedRoutes: {namespaces: {from: Selector, selector: {matchLabels: {team: infra}}}}}]
`

func labelsYAML(kv map[string]string) string {
	if len(kv) == 0 {
		return "{}"
	}
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(kv))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%q: %q", k, kv[k]))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func bindingConfig(nsLabels, svcLabels, podLabels map[string]string) string {
	pl := map[string]string{"app": "x"}
	for k, v := range podLabels {
		pl[k] = v
	}
	return fmt.Sprintf(`
apiVersion: v1
kind: Namespace
metadata: {name: app, labels: %s}
---
apiVersion: v1
kind: Service
metadata: {name: s, namespace: app, labels: %s}
spec:
  clusterIP: 127.0.20.1
  selector: {app: x}
  ports: [{name: http, port: 80, targetPort: 8080, appProtocol: http}]
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: app, labels: %s}
spec: {nodeName: node-a, serviceAccountName: sa, containers: [{name: c, image: i}]}
status: {podIP: 127.0.10.1}
`, labelsYAML(nsLabels), labelsYAML(svcLabels), labelsYAML(pl)) + "---\n" + bindingWaypoints
}

func refString(r *meshv1.Ref) string {
	if r == nil {
		return ""
	}
	return r.Namespace + "/" + r.Name
}

func TestWaypointBindingTable(t *testing.T) {
	const (
		use   = LabelUseWaypoint
		useNS = LabelUseWaypointNamespace
	)
	cases := []struct {
		name                string
		ns, svc, pod        map[string]string
		wantSvc, wantWorkld string
	}{
		{name: "nothing bound"},
		{name: "namespace, waypoint for service", ns: map[string]string{use: "wp-svc"}, wantSvc: "app/wp-svc"},
		{name: "namespace, waypoint for workload", ns: map[string]string{use: "wp-wl"}, wantWorkld: "app/wp-wl"},
		{name: "namespace, waypoint for all", ns: map[string]string{use: "wp-all"}, wantSvc: "app/wp-all", wantWorkld: "app/wp-all"},
		{name: "waypoint-for defaults to service", ns: map[string]string{use: "wp-default"}, wantSvc: "app/wp-default"},
		{name: "service opts out of namespace binding", ns: map[string]string{use: "wp-all"}, svc: map[string]string{use: "none"}, wantWorkld: "app/wp-all"},
		{name: "pod opts out of namespace binding", ns: map[string]string{use: "wp-all"}, pod: map[string]string{use: "none"}, wantSvc: "app/wp-all"},
		{name: "service label alone", svc: map[string]string{use: "wp-svc"}, wantSvc: "app/wp-svc"},
		{name: "pod label alone", pod: map[string]string{use: "wp-wl"}, wantWorkld: "app/wp-wl"},
		{name: "service label beats namespace", ns: map[string]string{use: "wp-all"}, svc: map[string]string{use: "wp-svc"}, wantSvc: "app/wp-svc", wantWorkld: "app/wp-all"},
		{name: "pod label beats namespace", ns: map[string]string{use: "wp-svc"}, pod: map[string]string{use: "wp-wl"}, wantSvc: "app/wp-svc", wantWorkld: "app/wp-wl"},
		{name: "most specific decides even when it does not apply (no fallback)", ns: map[string]string{use: "wp-svc"}, svc: map[string]string{use: "wp-wl"}},
		{name: "pod label naming a service waypoint binds nothing", pod: map[string]string{use: "wp-svc"}},
		{name: "service label naming a workload waypoint binds nothing", svc: map[string]string{use: "wp-wl"}},
		{name: "cross-namespace waypoint", ns: map[string]string{use: "shared", useNS: "infra"}, wantSvc: "infra/shared", wantWorkld: "infra/shared"},
		{name: "cross-namespace waypoint selecting the namespace", ns: map[string]string{use: "selective", useNS: "infra", "team": "infra"}, wantSvc: "infra/selective", wantWorkld: "infra/selective"},
		{name: "pod label with its own namespace", ns: map[string]string{use: "wp-svc"}, pod: map[string]string{use: "shared", useNS: "infra"}, wantSvc: "app/wp-svc", wantWorkld: "infra/shared"},
		{name: "namespace none, service binds", ns: map[string]string{use: "none"}, svc: map[string]string{use: "wp-all"}, wantSvc: "app/wp-all"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := mustTranslate(t, bindingConfig(c.ns, c.svc, c.pod))
			if got := refString(s.Services["app/s"].GetWaypoint()); got != c.wantSvc {
				t.Errorf("service waypoint = %q, want %q", got, c.wantSvc)
			}
			if got := refString(s.Workloads["app/p"].GetWaypoint()); got != c.wantWorkld {
				t.Errorf("workload waypoint = %q, want %q", got, c.wantWorkld)
			}
		})
	}
}

func TestWaypointBindingDangling(t *testing.T) {
	for _, c := range []struct {
		name         string
		ns, svc, pod map[string]string
		object       string
	}{
		{name: "namespace", ns: map[string]string{LabelUseWaypoint: "missing"}, object: "Namespace app"},
		{name: "service", svc: map[string]string{LabelUseWaypoint: "missing"}, object: "Service app/s"},
		{name: "pod", pod: map[string]string{LabelUseWaypoint: "missing"}, object: "Pod app/p"},
		{name: "wrong namespace", pod: map[string]string{LabelUseWaypoint: "wp-all", LabelUseWaypointNamespace: "infra"}, object: "Pod app/p"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := translateYAML(t, bindingConfig(c.ns, c.svc, c.pod))
			wantProblem(t, err, "file0.yaml", "does not exist: no Gateway of class causeway-waypoint")
			if !strings.Contains(err.Error(), c.object) {
				t.Errorf("error does not name %s: %v", c.object, err)
			}
		})
	}
}

// A waypoint in another namespace serves only namespaces its listener admits.
func TestWaypointBindingNotAdmitted(t *testing.T) {
	for _, c := range []struct {
		name         string
		ns, svc, pod map[string]string
		object       string
	}{
		{name: "namespace, default Same", ns: map[string]string{LabelUseWaypoint: "private", LabelUseWaypointNamespace: "infra"}, object: "Namespace app"},
		{name: "service, selector not matching", svc: map[string]string{LabelUseWaypoint: "selective", LabelUseWaypointNamespace: "infra"}, object: "Service app/s"},
		{name: "pod, default Same", pod: map[string]string{LabelUseWaypoint: "private", LabelUseWaypointNamespace: "infra"}, object: "Pod app/p"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := translateYAML(t, bindingConfig(c.ns, c.svc, c.pod))
			wantProblem(t, err, "file0.yaml", "waypoint infra/")
			wantProblem(t, err, "file0.yaml", "does not admit namespace app")
			if !strings.Contains(err.Error(), c.object) {
				t.Errorf("error does not name %s: %v", c.object, err)
			}
		})
	}
}

func TestDataplaneModeTable(t *testing.T) {
	cases := []struct {
		name     string
		ns, pod  map[string]string
		wantMesh bool
	}{
		{name: "not enrolled"},
		{name: "namespace mesh", ns: map[string]string{LabelDataplaneMode: "mesh"}, wantMesh: true},
		{name: "pod mesh", pod: map[string]string{LabelDataplaneMode: "mesh"}, wantMesh: true},
		{name: "pod none in mesh namespace", ns: map[string]string{LabelDataplaneMode: "mesh"}, pod: map[string]string{LabelDataplaneMode: "none"}},
		{name: "unknown value is not mesh", ns: map[string]string{LabelDataplaneMode: "ambient"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := mustTranslate(t, bindingConfig(c.ns, nil, c.pod))
			w := s.Workloads["app/p"]
			if w.GetHbone() != c.wantMesh {
				t.Errorf("hbone = %v, want %v", w.GetHbone(), c.wantMesh)
			}
			id := trusttest.Identity(t, "spiffe://cluster.local/ns/app/sa/sa")
			if got := s.HasWorkload("node-a", id); got != c.wantMesh {
				t.Errorf("HasWorkload(node-a, %s) = %v, want %v (only captured workloads count)", id, got, c.wantMesh)
			}
		})
	}
}

func TestWaypointPodsAreNeverCapturedOrBound(t *testing.T) {
	cfg := bindingConfig(map[string]string{LabelDataplaneMode: "mesh", LabelUseWaypoint: "wp-all"}, nil, nil) + `
---
apiVersion: v1
kind: Pod
metadata:
  name: wp-all-0
  namespace: app
  uid: 5d0c3c52-0d35-4c1b-9a53-9b0f5a1f0b11
  labels: {gateway.networking.k8s.io/gateway-name: wp-all}
spec: {nodeName: node-b, serviceAccountName: wp-all-sa, containers: [{name: w, image: w}]}
status: {podIPs: [{ip: 127.0.10.2}, {ip: "fd00::2"}]}
`
	s := mustTranslate(t, cfg)
	w := s.Workloads["5d0c3c52-0d35-4c1b-9a53-9b0f5a1f0b11"]
	if w == nil {
		t.Fatalf("waypoint pod missing; workloads: %v", s.Workloads)
	}
	if w.Hbone || w.Waypoint != nil {
		t.Errorf("waypoint pod: hbone=%v waypoint=%v, want neither", w.Hbone, w.Waypoint)
	}
	if refString(w.WaypointForGateway) != "app/wp-all" {
		t.Errorf("waypoint_for_gateway = %v", w.WaypointForGateway)
	}
	wp := s.Waypoints["app/wp-all"]
	if wp.Identity != "spiffe://cluster.local/ns/app/sa/wp-all-sa" {
		t.Errorf("waypoint identity = %s, want its pods' service account", wp.Identity)
	}
	if strings.Join(wp.Addresses, ",") != "127.0.10.2,fd00::2" || wp.HbonePort != 15008 || wp.WaypointFor != "all" {
		t.Errorf("waypoint = %v", wp)
	}
	// Without pods the identity follows Istio's convention: the Gateway's name.
	if got := s.Waypoints["app/wp-svc"].Identity; got != "spiffe://cluster.local/ns/app/sa/wp-svc" {
		t.Errorf("pod-less waypoint identity = %s", got)
	}
	if s.HasWorkload("node-b", trusttest.Identity(t, "spiffe://cluster.local/ns/app/sa/wp-all-sa")) {
		t.Error("a waypoint's identity must not be grantable to a node proxy")
	}
}

// Node proxies dial a waypoint's addresses: only its pods that serve. A
// rollout's new pod is listed once ready (before, it may still wait for
// its certificate), an old one no longer once terminating (its listener
// closes and its network namespace goes); terminating pods that still
// report ready are the fallback when no other pod serves.
func TestWaypointAddressesAreServingPods(t *testing.T) {
	wpPod := func(name, ip, ready string, terminating bool) string {
		deletion := ""
		if terminating {
			deletion = ", deletionTimestamp: \"2026-12-06T15:01:46Z\""
		}
		return fmt.Sprintf(`
---
apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: app, labels: {gateway.networking.k8s.io/gateway-name: wp-all}%s}
spec: {nodeName: node-b, serviceAccountName: wp-all, containers: [{name: w, image: w}]}
status: {podIP: %s, conditions: [{type: Ready, status: %q}]}
`, name, deletion, ip, ready)
	}
	base := bindingConfig(map[string]string{LabelDataplaneMode: "mesh", LabelUseWaypoint: "wp-all"}, nil, nil)
	for _, c := range []struct {
		name, pods, want string
	}{
		{"a rollout's new pod not ready yet", wpPod("old-0", "127.0.10.2", "True", false) + wpPod("new-0", "127.0.10.3", "False", false), "127.0.10.2"},
		{"the new pod ready, the old one terminating", wpPod("old-0", "127.0.10.2", "True", true) + wpPod("new-0", "127.0.10.3", "True", false), "127.0.10.3"},
		{"only terminating pods still ready", wpPod("old-0", "127.0.10.2", "True", true) + wpPod("old-1", "127.0.10.4", "False", true) + wpPod("new-0", "127.0.10.3", "False", false), "127.0.10.2"},
		{"no pod ready", wpPod("new-0", "127.0.10.3", "False", false), ""},
	} {
		s := mustTranslate(t, base+c.pods)
		wp := s.Waypoints["app/wp-all"]
		if got := strings.Join(wp.Addresses, ","); got != c.want {
			t.Errorf("%s: waypoint addresses %q, want %q", c.name, got, c.want)
		}
		// Every pod is still the waypoint's own workload, never bound.
		own := 0
		for _, w := range s.Workloads {
			if refString(w.WaypointForGateway) == "app/wp-all" && w.Waypoint == nil && !w.Hbone {
				own++
			}
		}
		if want := strings.Count(c.pods, "kind: Pod"); own != want {
			t.Errorf("%s: %d of the waypoint's own workloads, want %d", c.name, own, want)
		}
	}
}

// No pod but the waypoint's own holds a waypoint's identity: a captured
// pod's node proxy would get the waypoint's certificate and pass every
// waypoint-only check, and any pod may present its service-account token.
func TestPodWithWaypointIdentityRefused(t *testing.T) {
	ips := 0
	pod := func(name, sa, labels string) string {
		ips++ // every pod its own address: a shared one would be refused first
		return fmt.Sprintf(`
---
apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: app, labels: %s}
spec: {nodeName: node-a, serviceAccountName: %s, containers: [{name: c, image: i}]}
status: {podIP: 127.0.10.%d}
`, name, labels, sa, 20+ips)
	}
	base := bindingConfig(map[string]string{LabelDataplaneMode: "mesh"}, nil, nil)
	waypointPod := pod("wp-all-0", "wp-all-sa", "{gateway.networking.k8s.io/gateway-name: wp-all}")

	_, err := translateYAML(t, base+waypointPod+pod("impostor", "wp-all-sa", "{app: other}"))
	wantProblem(t, err, "", "gives this pod the identity spiffe://cluster.local/ns/app/sa/wp-all-sa of waypoint app/wp-all")
	_, err = translateYAML(t, base+waypointPod+pod("outside", "wp-all-sa", "{causeway.dev/dataplane-mode: none}"))
	wantProblem(t, err, "", "of waypoint app/wp-all, which only the waypoint's own pods may hold")
	// A pod-less waypoint's identity is its Gateway's name.
	_, err = translateYAML(t, base+pod("named", "wp-svc", "{app: other}"))
	wantProblem(t, err, "", "identity spiffe://cluster.local/ns/app/sa/wp-svc of waypoint app/wp-svc")

	s := mustTranslate(t, base+waypointPod)
	if !s.IsWaypoint(trusttest.Identity(t, "spiffe://cluster.local/ns/app/sa/wp-all-sa")) || s.IsWaypoint(trusttest.Identity(t, "spiffe://cluster.local/ns/app/sa/sa")) {
		t.Error("IsWaypoint does not tell the waypoint's identity from an application's")
	}
	m := &Model{}
	m.Set(s)
	if !m.IsWaypoint(trusttest.Identity(t, "spiffe://cluster.local/ns/app/sa/wp-all-sa")) {
		t.Error("the model does not report the waypoint's identity")
	}
}
