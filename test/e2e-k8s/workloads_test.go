package e2ek8s

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// echoImage is the cluster registry's image of cmd/echo, by digest (read
// by TestMain from the list images.sh pushed).
var echoImage string

func echoPodSpec() corev1.PodSpec {
	field := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
	}
	grace := int64(2)
	return corev1.PodSpec{
		TerminationGracePeriodSeconds: &grace,
		Containers: []corev1.Container{{
			Name:            "echo",
			Image:           echoImage,
			ImagePullPolicy: corev1.PullIfNotPresent,
			Args:            []string{"--listen", ":8080"},
			Env: []corev1.EnvVar{
				{Name: "POD_NAME", ValueFrom: field("metadata.name")},
				{Name: "POD_NAMESPACE", ValueFrom: field("metadata.namespace")},
			},
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
			ReadinessProbe: &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(8080)}},
				PeriodSeconds: 1,
			},
		}},
	}
}

// TestWorkloadsTalk proves the cluster is real: a two-replica Deployment, its
// Service and a DaemonSet run Causeway's echo image, and the pods reach each
// other directly, through the ClusterIP and through the Service's DNS name;
// kubectl exec carries the exit code and the logs come back.
func TestWorkloadsTalk(t *testing.T) {
	requireCluster(t)
	ctx := context.Background()
	ns := newNamespace(t, "e2e-workloads")

	labels := map[string]string{"app": "echo"}
	replicas := int32(2)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: echoPodSpec()},
		},
	}
	if _, err := client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: corev1.ServiceSpec{
			Selector: labels,
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
		},
	}
	svc, err := client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dsLabels := map[string]string{"app": "echo-node"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "echo-node"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: dsLabels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: dsLabels}, Spec: echoPodSpec()},
		},
	}
	if _, err := client.AppsV1().DaemonSets(ns).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	echoPods := readyPods(t, ns, "app=echo", 2)
	// One per node.
	nodePods := readyPods(t, ns, "app=echo-node", len(nodes))
	nodePod := nodePods[0]
	replicaNames := []string{echoPods[0].Name, echoPods[1].Name}

	t.Run("pod to pod", func(t *testing.T) {
		// From every node (on several, across nodes and within one).
		for _, from := range nodePods {
			for _, p := range echoPods {
				eventually(t, 30*time.Second, "daemonset pod on "+from.Spec.NodeName+" to "+p.Name+" on "+p.Spec.NodeName, func() error {
					return expectAnswer(from.Name, ns, "http://"+net.JoinHostPort(p.Status.PodIP, "8080")+"/direct", p.Name)
				})
			}
		}
		eventually(t, 30*time.Second, echoPods[0].Name+" to the daemonset pod", func() error {
			return expectAnswer(echoPods[0].Name, ns, "http://"+net.JoinHostPort(nodePod.Status.PodIP, "8080")+"/direct", nodePod.Name)
		})
	})

	t.Run("pod to ClusterIP", func(t *testing.T) {
		url := "http://" + net.JoinHostPort(svc.Spec.ClusterIP, "80") + "/cluster-ip"
		eventually(t, 30*time.Second, "requests to "+url+" reach both replicas", func() error {
			urls := slices.Repeat([]string{url}, 30)
			answers, err := fetchFrom(ns, nodePod.Name, urls...)
			if err != nil {
				return err
			}
			seen := map[string]bool{}
			for _, a := range answers {
				if !slices.Contains(replicaNames, a.Pod) {
					return fmt.Errorf("answer from %q, not a replica of %v", a.Pod, replicaNames)
				}
				seen[a.Pod] = true
			}
			if len(seen) != 2 {
				return fmt.Errorf("30 connections all reached %v", seen)
			}
			return nil
		})
	})

	t.Run("pod to Service name", func(t *testing.T) {
		for _, host := range []string{"echo", "echo." + ns, "echo." + ns + ".svc.cluster.local"} {
			eventually(t, 30*time.Second, "http://"+host+"/ through CoreDNS", func() error {
				answers, err := fetchFrom(ns, nodePod.Name, "http://"+host+"/by-name")
				if err != nil {
					return err
				}
				if a := answers[0]; !slices.Contains(replicaNames, a.Pod) || a.Host != host {
					return fmt.Errorf("answer from %q for host %q, want a replica of %v for %q", a.Pod, a.Host, replicaNames, host)
				}
				return nil
			})
		}
	})

	t.Run("exec carries the exit code", func(t *testing.T) {
		_, err := kubectlExec(ns, nodePod.Name, "echo", "/usr/local/bin/echo", "fetch",
			"http://"+net.JoinHostPort(echoPods[0].Status.PodIP, "8080")+"/status/503")
		var ee *execError
		if !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(ee.stderr, "status 503") {
			t.Fatalf("exec of a failing fetch: %v, want exit code 1 mentioning status 503", err)
		}
	})

	t.Run("logs", func(t *testing.T) {
		for _, p := range append(echoPods, nodePod) {
			want := fmt.Sprintf("echo %s/%s listening on", ns, p.Name)
			rc, err := client.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: "echo"}).Stream(ctx)
			if err != nil {
				t.Fatalf("logs of %s: %v", p.Name, err)
			}
			logs, err := io.ReadAll(io.LimitReader(rc, 1<<20))
			rc.Close()
			if err != nil || !strings.Contains(string(logs), want) {
				t.Fatalf("logs of %s: %q (%v), want a line with %q", p.Name, logs, err, want)
			}
		}
	})
}

// readyPods waits for n Running, Ready pods matching selector and returns them.
func readyPods(t *testing.T, ns, selector string, n int) []corev1.Pod {
	t.Helper()
	var ready []corev1.Pod
	eventually(t, 2*time.Minute, fmt.Sprintf("%d ready pods %q in %s", n, selector, ns), func() error {
		list, err := client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return err
		}
		ready = ready[:0]
		var states []string
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && podReady(p) {
				ready = append(ready, p)
			}
			states = append(states, p.Name+":"+string(p.Status.Phase))
		}
		if len(ready) != n {
			return fmt.Errorf("%d of %d ready: %v", len(ready), n, states)
		}
		return nil
	})
	return ready
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// expectAnswer fetches url from inside pod and checks that pod want answered.
func expectAnswer(pod, ns, url, want string) error {
	answers, err := fetchFrom(ns, pod, url)
	if err != nil {
		return err
	}
	if a := answers[0]; a.Pod != want || a.Namespace != ns {
		return fmt.Errorf("%s answered by %s/%s, want %s/%s", url, a.Namespace, a.Pod, ns, want)
	}
	return nil
}
