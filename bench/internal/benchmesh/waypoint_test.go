package benchmesh

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/config"
)

// The waypoint YAML decodes as the mesh reads it: a Gateway of the waypoint
// class for the namespace's traffic kind, and one pod per placement on its
// node with its address.
func TestWaypointYAML(t *testing.T) {
	doc := WaypointYAML("shop", "service", WaypointPod{Node: "node-a", IP: "127.0.83.2"}, WaypointPod{Node: "node-b", IP: "127.0.83.3"})
	objs, err := config.Decode("waypoint", []byte(doc))
	if err != nil {
		t.Fatalf("Decode: %v\n%s", err, doc)
	}
	if len(objs) != 3 {
		t.Fatalf("%d objects, want a Gateway and two pods:\n%s", len(objs), doc)
	}
	gw, ok := objs[0].Obj.(*gwv1.Gateway)
	if !ok || gw.Namespace != "shop" || gw.Name != "waypoint" || gw.Spec.GatewayClassName != config.WaypointClass ||
		gw.Labels[config.LabelWaypointFor] != "service" || len(gw.Spec.Listeners) != 1 ||
		gw.Spec.Listeners[0].Port != 15008 || gw.Spec.Listeners[0].Protocol != config.WaypointProtocol {
		t.Fatalf("first object = %#v, want shop's waypoint Gateway for services", objs[0].Obj)
	}
	for i, want := range []WaypointPod{{"node-a", "127.0.83.2"}, {"node-b", "127.0.83.3"}} {
		pod, ok := objs[1+i].Obj.(*corev1.Pod)
		if !ok || pod.Namespace != "shop" || pod.Labels[config.LabelGatewayName] != "waypoint" ||
			pod.Spec.NodeName != want.Node || pod.Status.PodIP != want.IP || pod.Spec.ServiceAccountName != "waypoint" {
			t.Errorf("object %d = %#v, want waypoint pod %d on %s at %s", 1+i, objs[1+i].Obj, i, want.Node, want.IP)
		}
	}
}
