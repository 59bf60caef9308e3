package config

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// BenchmarkTranslateScale translates the Kubernetes scale benchmark's
// cluster (bench/README.md): 100 namespaces, 1,000 services, 10,000 pods,
// after one pod's change: "whole" as Translate does (and the Kubernetes
// source did before Incremental), "incremental" as the Kubernetes source
// does now. Both run in one invocation, so their ratio holds on a loaded
// machine.
func BenchmarkTranslateScale(b *testing.B) {
	objs := scaleObjects()
	changed := len(objs) / 2
	for _, o := range objs[changed:] {
		if _, ok := o.Obj.(*corev1.Pod); ok {
			break
		}
		changed++
	}
	change := func(i int) {
		p := objs[changed].Obj.(*corev1.Pod).DeepCopy()
		p.Labels = map[string]string{"app": p.Labels["app"], "rev": fmt.Sprint(i)}
		objs[changed].Obj = p
	}
	b.Run("whole", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			change(i)
			if _, err := Translate(objs, Options{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("incremental", func(b *testing.B) {
		in := NewIncremental(Options{})
		if _, err := in.Translate(objs); err != nil {
			b.Fatal(err)
		}
		for i := 0; b.Loop(); i++ {
			change(i)
			if _, err := in.Translate(objs); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func scaleObjects() []Object {
	var objs []Object
	for n := range 100 {
		ns := fmt.Sprintf("scale-%d", n)
		objs = append(objs, Object{Origin: "bench", Obj: &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
			Labels: map[string]string{LabelDataplaneMode: DataplaneModeMesh}}}})
		for s := range 10 {
			name := fmt.Sprintf("svc-%d", s)
			objs = append(objs, Object{Origin: "bench", Obj: &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
				Spec: corev1.ServiceSpec{ClusterIP: fmt.Sprintf("10.96.%d.%d", n, s+1), Selector: map[string]string{"app": name},
					Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}}})
			for p := range 10 {
				idx := (n*10+s)*10 + p
				objs = append(objs, Object{Origin: "bench", Obj: &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", name, p), Namespace: ns, UID: types.UID(fmt.Sprint("uid-", idx)),
						Labels: map[string]string{"app": name}},
					Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%d", idx%100), ServiceAccountName: fmt.Sprintf("sa-%d", s),
						Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
					Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: fmt.Sprintf("10.%d.%d.%d", 1+idx/65536, (idx/256)%256, idx%256)},
				}})
			}
		}
	}
	return objs
}
