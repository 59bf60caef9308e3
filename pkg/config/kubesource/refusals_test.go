package kubesource_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/internal/kubetest"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

func workloadNamed(s *config.Snapshot, ns, name string) *meshv1.Workload {
	for _, w := range s.Workloads {
		if w.Namespace == ns && w.Name == name {
			return w
		}
	}
	return nil
}

func refusedObjects(s *config.Snapshot) map[string]string {
	out := map[string]string{}
	for _, p := range s.Rejected {
		out[p.Object] += p.Reason
	}
	return out
}

// A bad object next to good ones in the cluster (pkg/config's refusal
// fixture): the bad ones fail closed, the good ones keep updating, and
// fixing a bad one brings it in. Before, any of them froze the whole
// mesh's configuration at the last good snapshot.
func TestBadObjectRefusedAlone(t *testing.T) {
	env := kubetest.Start(t) // its own apiserver: the fixture's namespaces and addresses are its alone
	objs, err := config.DecodeFile("../testdata/refusals.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var fixture []runtime.Object
	for _, o := range objs {
		fixture = append(fixture, o.Obj)
	}
	env.Create(t, fixture...)
	r := startSource(t, env, 50*time.Millisecond)

	s := r.next(t, "the fixture", func(s *config.Snapshot) bool {
		return s.HTTPRoutes["app/ok"] != nil && workloadNamed(s, "broken", "plain-0") != nil
	})
	refused := refusedObjects(s)
	for obj, why := range map[string]string{
		"Namespace broken":  "waypoint broken/missing does not exist",
		"Service app/lost":  "waypoint app/gone does not exist",
		"Pod app/impostor":  "of waypoint app/wp, which only the waypoint's own pods may hold",
		"HTTPRoute app/bad": "regular expression",
	} {
		if !strings.Contains(refused[obj], why) {
			t.Errorf("%s not refused for %q: %v", obj, why, s.Rejected)
		}
	}
	if len(refused) != 4 {
		t.Errorf("refused %v; want the four bad objects alone", s.Rejected)
	}
	if g := s.Services["app/good"]; g.GetWaypoint().GetName() != "wp" || g.GetInvalidReason() != "" {
		t.Errorf("the good Service: %v", g)
	}
	if l := s.Services["app/lost"]; l.GetWaypoint() != nil || !strings.Contains(l.GetInvalidReason(), "app/gone") {
		t.Errorf("the Service naming no waypoint does not refuse its traffic: %v", l)
	}
	if p := s.Services["broken/plain"]; !strings.Contains(p.GetInvalidReason(), "namespace broken") {
		t.Errorf("a Service inheriting the broken label does not refuse its traffic: %v", p)
	}
	if w := workloadNamed(s, "broken", "plain-0"); !strings.Contains(w.GetInvalidReason(), "namespace broken") {
		t.Errorf("a pod inheriting the broken label does not refuse its traffic: %v", w)
	}
	if workloadNamed(s, "app", "impostor") != nil || s.HTTPRoutes["app/bad"] != nil {
		t.Error("the impostor pod or the bad route is served")
	}

	// The good objects keep updating while the bad ones stay.
	ctx := context.Background()
	kube, gw := env.Clientset(t), env.Gateway(t)
	if _, err := kube.CoreV1().Pods("app").Patch(ctx, "good-0", types.MergePatchType, []byte(`{"metadata":{"labels":{"rev":"2"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	s = r.next(t, "the good pod's change", func(s *config.Snapshot) bool { return workloadNamed(s, "app", "good-0").GetLabels()["rev"] == "2" })
	if len(refusedObjects(s)) != 4 {
		t.Errorf("refusals changed with an unrelated pod: %v", s.Rejected)
	}

	// Fixing each bad object brings it in.
	env.Create(t, &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Name: "gone", Namespace: "app"}, Spec: gwv1.GatewaySpec{
		GatewayClassName: config.WaypointClass, Listeners: []gwv1.Listener{{Name: "mesh", Port: 15008, Protocol: config.WaypointProtocol}}}})
	if _, err := kube.CoreV1().Namespaces().Patch(ctx, "broken", types.MergePatchType, []byte(`{"metadata":{"labels":{"causeway.dev/use-waypoint":null}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// A pod's service account is immutable: the fix is a pod of its own account.
	if err := kube.CoreV1().Pods("app").Delete(ctx, "impostor", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
		t.Fatal(err)
	}
	env.Create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "honest", Namespace: "app", Labels: map[string]string{"app": "good"}},
		Spec:   corev1.PodSpec{NodeName: "node-a", ServiceAccountName: "honest", Containers: []corev1.Container{{Name: "c", Image: "i"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.30.14"}})
	route, err := gw.GatewayV1().HTTPRoutes("app").Get(ctx, "bad", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	route.Spec.Rules[0].Matches[0].Path.Value = ptr("/v[0-9]+")
	if _, err := gw.GatewayV1().HTTPRoutes("app").Update(ctx, route, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s = r.next(t, "every fix", func(s *config.Snapshot) bool { return len(s.Rejected) == 0 && s.HTTPRoutes["app/bad"] != nil })
	if l := s.Services["app/lost"]; l.GetWaypoint().GetName() != "gone" || l.GetInvalidReason() != "" {
		t.Errorf("the fixed Service: %v", l)
	}
	if p := s.Services["broken/plain"]; p.GetInvalidReason() != "" || workloadNamed(s, "broken", "plain-0").GetInvalidReason() != "" {
		t.Errorf("the fixed namespace's Service and pod still refuse traffic: %v", p)
	}
	if workloadNamed(s, "app", "honest") == nil {
		t.Error("the pod with its own account is not served")
	}
}
