package kubesource_test

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/config/kubesource"
	"github.com/causeway-mesh/causeway/pkg/internal/kubetest"
	"github.com/causeway-mesh/causeway/pkg/trust/trusttest"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

// patience bounds every wait; generous because the machine may be loaded.
const patience = 30 * time.Second

// running is a started Source and the snapshots it emits.
type running struct {
	src   *kubesource.Source
	snaps chan *config.Snapshot
}

// startSource runs a source; each snapshot goes to also (if given), then
// to the channel.
func startSource(t *testing.T, env *kubetest.Env, debounce time.Duration, also ...func(*config.Snapshot)) *running {
	t.Helper()
	src, err := kubesource.NewForConfig(env.ControlPlane(t), kubesource.Options{Debounce: debounce})
	if err != nil {
		t.Fatal(err)
	}
	return run(t, src, also...)
}

// run runs src until the test ends, as startSource does.
func run(t *testing.T, src *kubesource.Source, also ...func(*config.Snapshot)) *running {
	t.Helper()
	r := &running{src: src, snaps: make(chan *config.Snapshot, 1000)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- src.Run(ctx, func(s *config.Snapshot) {
			for _, f := range also {
				f(s)
			}
			r.snaps <- s
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("source Run: %v", err)
		}
	})
	return r
}

// next returns the next snapshot for which ok holds, skipping others.
func (r *running) next(t *testing.T, what string, ok func(*config.Snapshot) bool) *config.Snapshot {
	t.Helper()
	deadline := time.After(patience)
	for {
		select {
		case s := <-r.snaps:
			if ok(s) {
				return s
			}
		case <-deadline:
			t.Fatalf("no snapshot with %s within %s", what, patience)
		}
	}
}

// sampleObjects decodes the local-mode sample and its ConnectionPolicies.
func sampleObjects(t *testing.T) []config.Object {
	t.Helper()
	var objs []config.Object
	for _, f := range []string{"mesh.yaml", "connection-policies.yaml"} {
		o, err := config.DecodeFile(filepath.Join("..", "..", "..", "examples", "local", f))
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o...)
	}
	return objs
}

// backendTLSObjects are a BackendTLSPolicy on the sample's ratings Service
// and the ConfigMap with its CA certificate (with a key the translation
// does not read, which the informer drops).
func backendTLSObjects(t *testing.T) []config.Object {
	t.Helper()
	ca := trusttest.NewCA(t, "ratings.example")
	cm := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: "ratings-ca", Namespace: "shop"},
		Data:       map[string]string{config.CACertificateKey: string(ca.Authority.RootsPEM()), "notes": "not read"}}
	grpc := gwv1.SectionName("grpc")
	pol := &gwv1.BackendTLSPolicy{TypeMeta: metav1.TypeMeta{APIVersion: gwv1.GroupVersion.String(), Kind: "BackendTLSPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: "ratings-tls", Namespace: "shop"},
		Spec: gwv1.BackendTLSPolicySpec{
			TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{{LocalPolicyTargetReference: gwv1.LocalPolicyTargetReference{Group: "", Kind: "Service", Name: "ratings"}, SectionName: &grpc}},
			Validation: gwv1.BackendTLSPolicyValidation{Hostname: "ratings.example",
				CACertificateRefs: []gwv1.LocalObjectReference{{Group: "", Kind: "ConfigMap", Name: "ratings-ca"}},
				SubjectAltNames:   []gwv1.SubjectAltName{{Type: gwv1.URISubjectAltNameType, URI: "spiffe://ratings.example/ns/shop/sa/ratings"}}},
		}}
	return []config.Object{{Origin: "test", Obj: cm}, {Origin: "test", Obj: pol}}
}

// The sample (with its ConnectionPolicies, a BackendTLSPolicy and its CA
// ConfigMap) applied to the API server and read by the informers gives the
// snapshot the directory source gives for the same objects. The only differences are the
// apiserver's own doing, carried over to the directory side: the uids and
// creation times it assigns and the kubernetes Service it creates.
func TestSourceEqualsDirectory(t *testing.T) {
	env := kubetest.Start(t) // its own apiserver: nothing but the sample in it
	objs := append(sampleObjects(t), backendTLSObjects(t)...)
	var sample []runtime.Object
	for _, o := range objs {
		sample = append(sample, o.Obj)
	}
	created := env.Create(t, sample...)

	// The directory's objects, with what the apiserver assigned.
	dir := t.TempDir()
	var docs []string
	for i, o := range objs {
		stamped := o.Obj.DeepCopyObject()
		switch v := stamped.(type) {
		case *corev1.Pod:
			v.UID = created[i].(*corev1.Pod).UID
		case *gwv1.HTTPRoute:
			v.CreationTimestamp = created[i].(*gwv1.HTTPRoute).CreationTimestamp
		case *gwv1.GRPCRoute:
			v.CreationTimestamp = created[i].(*gwv1.GRPCRoute).CreationTimestamp
		case *gwv1.BackendTLSPolicy:
			v.CreationTimestamp = created[i].(*gwv1.BackendTLSPolicy).CreationTimestamp
		}
		docs = append(docs, toYAML(t, stamped))
	}
	k8sSvc, err := env.Clientset(t).CoreV1().Services("default").Get(context.Background(), "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, toYAML(t, &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: k8sSvc.Name, Namespace: k8sSvc.Namespace},
		Spec:       corev1.ServiceSpec{ClusterIP: k8sSvc.Spec.ClusterIP, Ports: k8sSvc.Spec.Ports},
	}))
	if err := os.WriteFile(filepath.Join(dir, "mesh.yaml"), []byte(strings.Join(docs, "---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	want, err := config.NewDirSource(dir, config.DirOptions{}).Load()
	if err != nil {
		t.Fatal(err)
	}

	r := startSource(t, env, 50*time.Millisecond)
	got := r.next(t, "the sample", func(s *config.Snapshot) bool { return len(s.Workloads) > 0 })
	if len(want.Workloads) != 7 || len(want.Services) != 5 || len(want.Waypoints) != 1 || len(want.HTTPRoutes) != 1 || len(want.GRPCRoutes) != 1 ||
		len(want.ConnectionPolicies) != 2 {
		t.Fatalf("directory snapshot is not the whole sample: %d workloads, %d services, %d waypoints, %d+%d routes, %d connection policies",
			len(want.Workloads), len(want.Services), len(want.Waypoints), len(want.HTTPRoutes), len(want.GRPCRoutes), len(want.ConnectionPolicies))
	}
	if b := want.Services["shop/ratings"].GetPorts()[0].GetBackendTls(); b.GetHostname() != "ratings.example" || len(b.GetCaCertificates()) == 0 {
		t.Fatalf("directory snapshot without the BackendTLSPolicy: %v", b)
	}
	compareSnapshots(t, want, got)
}

func toYAML(t *testing.T, o runtime.Object) string {
	t.Helper()
	b, err := yaml.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// compareSnapshots reports every resource that differs.
func compareSnapshots(t *testing.T, want, got *config.Snapshot) {
	t.Helper()
	wr, gr := want.Resources(), got.Resources()
	for typeURL, wm := range wr {
		gm := gr[typeURL]
		var names []string
		for n := range wm {
			names = append(names, n)
		}
		for n := range gm {
			if _, ok := wm[n]; !ok {
				names = append(names, n)
			}
		}
		sort.Strings(names)
		for _, n := range names {
			w, g := wm[n], gm[n]
			switch {
			case w == nil:
				t.Errorf("%s %s only from the API server: %s", typeURL, n, protojson.Format(g))
			case g == nil:
				t.Errorf("%s %s only from the directory: %s", typeURL, n, protojson.Format(w))
			case !proto.Equal(w, g):
				t.Errorf("%s %s differs:\ndirectory  %s\napiserver  %s", typeURL, n, protojson.Format(w), protojson.Format(g))
			}
		}
	}
}

func ptr[T any](v T) *T { return &v }

// Two EndpointSlices of one Service are joined; the terminating endpoint
// is left out while others are ready and serves when none is; a change of
// a slice reaches the snapshot.
func TestEndpointSlicesJoined(t *testing.T) {
	env := kubetest.Shared(t)
	const ns = "slices"
	ep := func(addr string, ready, serving, terminating bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{
			Ready: ptr(ready), Serving: ptr(serving), Terminating: ptr(terminating)}}
	}
	slice := func(name string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"kubernetes.io/service-name": "db"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("sql"), Port: ptr(int32(15432)), Protocol: ptr(corev1.ProtocolTCP)}},
			Endpoints:   eps,
		}
	}
	env.Create(t,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: ns},
			Spec: corev1.ServiceSpec{ClusterIP: "127.0.21.1", Ports: []corev1.ServicePort{{Name: "sql", Port: 5432}}}},
		slice("db-a", ep("10.244.1.1", true, true, false)),
		slice("db-b", ep("10.244.1.2", true, true, false), ep("10.244.1.3", false, true, true)),
	)
	addrs := func(s *config.Snapshot) string {
		svc := s.Services[ns+"/db"]
		if svc == nil {
			return ""
		}
		var out []string
		for _, e := range svc.Endpoints {
			if e.Ports[5432] != 15432 {
				t.Errorf("endpoint %s ports %v, want 5432->15432", e.Address, e.Ports)
			}
			out = append(out, e.Address)
		}
		return strings.Join(out, ",")
	}
	r := startSource(t, env, 50*time.Millisecond)
	r.next(t, "both slices' ready endpoints", func(s *config.Snapshot) bool { return addrs(s) == "10.244.1.1,10.244.1.2" })

	// The ready endpoints go; the terminating one that still serves remains.
	slices := env.Clientset(t).DiscoveryV1().EndpointSlices(ns)
	ctx := context.Background()
	if err := slices.Delete(ctx, "db-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	b, err := slices.Get(ctx, "db-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b.Endpoints[0] = ep("10.244.1.2", false, false, true)
	if _, err := slices.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.next(t, "only the serving terminating endpoint", func(s *config.Snapshot) bool { return addrs(s) == "10.244.1.3" })
}

// A burst of changes becomes one snapshot.
func TestBurstIsOnePush(t *testing.T) {
	env := kubetest.Shared(t)
	const ns = "burst"
	env.Create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{config.LabelDataplaneMode: "mesh"}}})
	// A long debounce, so that the whole burst surely falls in one window
	// even on a loaded machine; the default is 100ms.
	r := startSource(t, env, 3*time.Second)
	first := r.next(t, "the first snapshot", func(*config.Snapshot) bool { return true })
	base := len(first.Workloads)
	var pods []runtime.Object
	for i := range 20 {
		pods = append(pods, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p" + string(rune('a'+i)), Namespace: ns},
			Spec:       corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "c", Image: "i"}}},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.2." + strconv.Itoa(i+1)},
		})
	}
	start := time.Now()
	env.Create(t, pods...)
	if took := time.Since(start); took > 2*time.Second {
		t.Skipf("creating the burst took %s, longer than the debounce window: the machine is too loaded for this test", took)
	}
	s := r.next(t, "the burst", func(*config.Snapshot) bool { return true })
	if n := len(s.Workloads) - base; n != 20 {
		t.Fatalf("the first snapshot after the burst has %d of its 20 pods", n)
	}
	select {
	case s := <-r.snaps:
		t.Fatalf("a second snapshot for one burst (%d workloads)", len(s.Workloads))
	case <-time.After(4 * time.Second):
	}
}

// A pod's workload carries its node's zone and region, read by the
// control plane's own (shipped) RBAC; a relabelled node's pods follow.
func TestNodeLocality(t *testing.T) {
	env := kubetest.Shared(t)
	const ns = "locality"
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "locality-node",
		Labels: map[string]string{corev1.LabelTopologyRegion: "r1", corev1.LabelTopologyZone: "z1"}}}
	env.Create(t,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		node,
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns},
			Spec:   corev1.PodSpec{NodeName: node.Name, Containers: []corev1.Container{{Name: "c", Image: "i"}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.9.1"}},
	)
	t.Cleanup(func() {
		_ = env.Clientset(t).CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{})
	})
	zone := func(s *config.Snapshot) string {
		for _, w := range s.Workloads {
			if w.GetNamespace() == ns && w.GetName() == "p" {
				return w.GetLocality().GetRegion() + "/" + w.GetLocality().GetZone()
			}
		}
		return ""
	}
	r := startSource(t, env, 50*time.Millisecond)
	r.next(t, "the pod in its node's zone", func(s *config.Snapshot) bool { return zone(s) == "r1/z1" })
	nodes := env.Clientset(t).CoreV1().Nodes()
	ctx := context.Background()
	cur, err := nodes.Get(ctx, node.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Labels[corev1.LabelTopologyZone] = "z2"
	if _, err := nodes.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.next(t, "the pod in its node's new zone", func(s *config.Snapshot) bool { return zone(s) == "r1/z2" })
}
