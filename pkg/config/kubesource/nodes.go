package kubesource

import (
	"sort"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
)

// nodeLocalities holds each Node as the translation reads it (its name and
// topology labels, for its pods' locality): one object per node, replaced
// only when those labels change. Nodes change often (their status), and a
// new Node object makes the incremental translation translate every
// namespace again (config.Incremental); the informer's own objects would.
type nodeLocalities struct {
	mu sync.Mutex
	m  map[string]*corev1.Node
}

var topologyLabels = []string{corev1.LabelTopologyRegion, corev1.LabelTopologyZone}

// set records n and reports whether the translation's view changed.
func (l *nodeLocalities) set(n *corev1.Node) bool {
	labels := map[string]string{}
	for _, k := range topologyLabels {
		if v, ok := n.Labels[k]; ok {
			labels[k] = v
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if old, ok := l.m[n.Name]; ok && sameLabels(old.Labels, labels) {
		return false
	}
	if l.m == nil {
		l.m = map[string]*corev1.Node{}
	}
	l.m[n.Name] = &corev1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: labels}}
	return true
}

func (l *nodeLocalities) remove(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.m[name]
	delete(l.m, name)
	return ok
}

// list returns the nodes by name.
func (l *nodeLocalities) list() []runtime.Object {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]runtime.Object, 0, len(l.m))
	for _, n := range l.m {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].(*corev1.Node).Name < out[j].(*corev1.Node).Name })
	return out
}

func sameLabels(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// handler keeps l up to date from a Node informer and calls changed when
// the translation's view changed.
func (l *nodeLocalities) handler(changed func()) cache.ResourceEventHandler {
	set := func(obj any) {
		if n, ok := obj.(*corev1.Node); ok && l.set(n) {
			changed()
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { set(obj) },
		UpdateFunc: func(_, obj any) { set(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if n, ok := obj.(*corev1.Node); ok && l.remove(n.Name) {
				changed()
			}
		},
	}
}
