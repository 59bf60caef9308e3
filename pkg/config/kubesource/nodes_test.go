package kubesource

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A Node's update that leaves its topology labels alone keeps the object
// the translation sees (so it translates nothing again) and asks for no
// translation; a change of those labels, or the node's deletion, does.
func TestNodeLocalitiesChangeOnlyWithTopology(t *testing.T) {
	var l nodeLocalities
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{corev1.LabelTopologyZone: "z1", "other": "a"}}}
	if !l.set(n) {
		t.Fatal("a new node is a change")
	}
	first := l.list()
	n2 := n.DeepCopy()
	n2.Labels["other"] = "b"
	n2.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	if l.set(n2) {
		t.Fatal("an update of other labels and the status is a change")
	}
	if again := l.list(); len(again) != 1 || again[0] != first[0] {
		t.Fatal("the node's object was replaced though its topology did not change")
	}
	if got := first[0].(*corev1.Node); len(got.Labels) != 1 || got.Labels[corev1.LabelTopologyZone] != "z1" || got.Status.Conditions != nil {
		t.Fatalf("the translation's node %+v: want its name and topology labels only", got)
	}
	n3 := n2.DeepCopy()
	n3.Labels[corev1.LabelTopologyRegion] = "r1"
	if !l.set(n3) {
		t.Fatal("a region label added is a change")
	}
	if got := l.list()[0].(*corev1.Node).Labels; got[corev1.LabelTopologyRegion] != "r1" || got[corev1.LabelTopologyZone] != "z1" {
		t.Fatalf("labels %v after the change", got)
	}
	if !l.remove("n1") || l.remove("n1") || len(l.list()) != 0 {
		t.Fatal("a node's deletion is a change, once")
	}
}
