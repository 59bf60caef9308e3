package config

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

func decodeFile(t *testing.T, path string) []Object {
	t.Helper()
	objs, err := DecodeFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// sameTranslation fails the test unless the incremental translation of
// objs is Translate's: the same resources, refusals and node index.
func sameTranslation(t *testing.T, what string, in *Incremental, objs []Object) *Snapshot {
	t.Helper()
	want, werr := Translate(objs, Options{})
	got, gerr := in.Translate(objs)
	if (werr == nil) != (gerr == nil) {
		t.Fatalf("%s: Translate: %v, Incremental: %v", what, werr, gerr)
	}
	if werr != nil {
		return nil
	}
	wr, gr := want.Resources(), got.Resources()
	for typeURL, wm := range wr {
		gm := gr[typeURL]
		if len(wm) != len(gm) {
			t.Errorf("%s: %d %s, want %d", what, len(gm), typeURL, len(wm))
		}
		for n, w := range wm {
			if g := gm[n]; !proto.Equal(w, g) {
				t.Errorf("%s: %s %s:\nwant %s\n got %s", what, typeURL, n, protojson.Format(w), protojson.Format(g))
			}
		}
	}
	problems := func(ps []Problem) string {
		out := make([]string, len(ps))
		for i, p := range ps {
			out[i] = p.String()
		}
		sort.Strings(out)
		return strings.Join(out, "\n")
	}
	if w, g := problems(want.Rejected), problems(got.Rejected); w != g {
		t.Errorf("%s: refusals\nwant %s\n got %s", what, w, g)
	}
	if fmt.Sprint(want.nodeIdentities) != fmt.Sprint(got.nodeIdentities) || fmt.Sprint(want.waypointIdentities) != fmt.Sprint(got.waypointIdentities) ||
		fmt.Sprint(want.LocalApps) != fmt.Sprint(got.LocalApps) {
		t.Errorf("%s: indexes differ:\nwant %v %v %v\n got %v %v %v", what, want.nodeIdentities, want.waypointIdentities, want.LocalApps,
			got.nodeIdentities, got.waypointIdentities, got.LocalApps)
	}
	return got
}

// replace returns objs with the object named kind ns/name replaced by what
// change makes of a copy of it (the way an informer replaces an object).
func replace(t *testing.T, objs []Object, kind, ns, name string, change func(runtime.Object)) []Object {
	t.Helper()
	out := append([]Object(nil), objs...)
	for i, o := range out {
		if k, n, nm := objectKey(o.Obj); k == kind && n == ns && nm == name {
			c := o.Obj.DeepCopyObject()
			change(c)
			out[i].Obj = c
			return out
		}
	}
	t.Fatalf("no %s %s/%s", kind, ns, name)
	return nil
}

func objectKey(o runtime.Object) (kind, ns, name string) {
	switch v := o.(type) {
	case *corev1.Namespace:
		return "Namespace", "", v.Name
	case *corev1.Pod:
		return "Pod", v.Namespace, v.Name
	case *corev1.Service:
		return "Service", v.Namespace, v.Name
	case *gwv1.Gateway:
		return "Gateway", v.Namespace, v.Name
	case *gwv1.HTTPRoute:
		return "HTTPRoute", v.Namespace, v.Name
	case *ConnectionPolicy:
		return "ConnectionPolicy", v.Namespace, v.Name
	}
	return "", "", ""
}

// The incremental translation equals the whole one after every kind of
// change, and translates again only what a change touches.
func TestIncrementalEqualsTranslate(t *testing.T) {
	var objs []Object
	for _, f := range []string{filepath.Join("..", "..", "examples", "local", "mesh.yaml"), filepath.Join("..", "..", "examples", "local", "connection-policies.yaml"), filepath.Join("testdata", "refusals.yaml")} {
		objs = append(objs, decodeFile(t, f)...)
	}
	in := NewIncremental(Options{})
	first := sameTranslation(t, "first", in, objs)
	if len(first.ConnectionPolicies) == 0 {
		t.Fatal("the sample has no ConnectionPolicy")
	}

	// A pod's change: only its namespace is translated again.
	objs = replace(t, objs, "Pod", "app", "good-0", func(o runtime.Object) { o.(*corev1.Pod).Labels["rev"] = "2" })
	s := sameTranslation(t, "a pod's labels", in, objs)
	for k, w := range first.Workloads {
		if w.Namespace != "app" && s.Workloads[k] != w {
			t.Errorf("workload %s of an unchanged namespace was translated again", k)
		}
	}
	for k, v := range first.Services {
		if v.Namespace != "app" && s.Services[k] != v {
			t.Errorf("service %s of an unchanged namespace was translated again", k)
		}
	}
	for _, c := range []struct {
		what           string
		kind, ns, name string
		change         func(runtime.Object)
	}{
		{"a namespace's label fixed", "Namespace", "", "broken", func(o runtime.Object) { delete(o.(*corev1.Namespace).Labels, LabelUseWaypoint) }},
		{"a namespace's label broken again", "Namespace", "", "broken", func(o runtime.Object) { o.(*corev1.Namespace).Labels[LabelUseWaypoint] = "nope" }},
		{"a gateway that admits everyone", "Gateway", "app", "wp", func(o runtime.Object) {
			from := gwv1.NamespacesFromAll
			o.(*gwv1.Gateway).Spec.Listeners[0].AllowedRoutes = &gwv1.AllowedRoutes{Namespaces: &gwv1.RouteNamespaces{From: &from}}
		}},
		{"a pod bound to a waypoint of another namespace", "Pod", "broken", "plain-0", func(o runtime.Object) {
			o.(*corev1.Pod).Labels[LabelUseWaypoint], o.(*corev1.Pod).Labels[LabelUseWaypointNamespace] = "wp", "app"
		}},
		{"a service's port", "Service", "app", "good", func(o runtime.Object) { o.(*corev1.Service).Spec.Ports[0].Port = 81 }},
		{"a route fixed", "HTTPRoute", "app", "bad", func(o runtime.Object) {
			v := "/v[0-9]+"
			o.(*gwv1.HTTPRoute).Spec.Rules[0].Matches[0].Path.Value = &v
		}},
		// An address claimed in two namespaces: only the whole set decides.
		{"a pod IP of another namespace", "Pod", "broken", "plain-0", func(o runtime.Object) { o.(*corev1.Pod).Status.PodIP = "127.0.30.11" }},
		{"and back", "Pod", "broken", "plain-0", func(o runtime.Object) { o.(*corev1.Pod).Status.PodIP = "127.0.30.13" }},
		{"a pod with a waypoint's account", "Pod", "app", "lost-0", func(o runtime.Object) { o.(*corev1.Pod).Spec.ServiceAccountName = "wp" }},
		{"a connection policy's selector", "ConnectionPolicy", "shop", "ingress", func(o runtime.Object) {
			o.(*ConnectionPolicy).Spec.Selector = &WorkloadSelector{MatchLabels: map[string]string{"app": "reviews"}}
		}},
		{"a connection policy refused", "ConnectionPolicy", "shop", "ingress", func(o runtime.Object) {
			o.(*ConnectionPolicy).Spec.TargetRefs = []PolicyTargetRef{{Group: "gateway.networking.k8s.io", Kind: "Gateway", Name: "waypoint"}}
		}},
	} {
		objs = replace(t, objs, c.kind, c.ns, c.name, c.change)
		sameTranslation(t, c.what, in, objs)
	}
	// An EndpointSlice naming a pod of another namespace: only the whole
	// set decides.
	slice, err := Decode("slice.yaml", []byte(`
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: plain-x, namespace: broken, labels: {kubernetes.io/service-name: plain}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [127.0.30.11], targetRef: {kind: Pod, namespace: app, name: good-0}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	objs = append(objs, slice...)
	if s := sameTranslation(t, "a slice naming a pod of another namespace", in, objs); len(s.Services["broken/plain"].GetEndpoints()) != 1 {
		t.Errorf("the slice's endpoint is not served: %v", s.Services["broken/plain"])
	}
	// Objects gone, and objects that are not a configuration.
	sameTranslation(t, "half the objects", in, objs[:len(objs)/2])
	sameTranslation(t, "defined twice", in, append(append([]Object(nil), objs...), objs[3]))
	sameTranslation(t, "all again", in, objs)
}
