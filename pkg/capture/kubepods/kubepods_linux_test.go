package kubepods_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/causeway-mesh/causeway/pkg/capture/agent"
	"github.com/causeway-mesh/causeway/pkg/capture/internal/netnstest"
	"github.com/causeway-mesh/causeway/pkg/capture/kubepods"
	"github.com/causeway-mesh/causeway/pkg/internal/kubetest"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

func namespace(t *testing.T, c kubernetes.Interface, name string, labels map[string]string) {
	t.Helper()
	if _, err := c.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// pod creates a running pod bound to node, with ip as its address when
// valid.
func pod(t *testing.T, c kubernetes.Interface, ns, name, node string, ip netip.Addr, labels map[string]string, edit ...func(*corev1.PodSpec)) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "sa-" + name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	spec := corev1.PodSpec{NodeName: node, ServiceAccountName: "sa-" + name, Containers: []corev1.Container{{Name: "app", Image: "app"}}}
	for _, e := range edit {
		e(&spec)
	}
	p, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = corev1.PodRunning
	if ip.IsValid() {
		p.Status.PodIP = ip.String()
		p.Status.PodIPs = []corev1.PodIP{{IP: ip.String()}}
	}
	if p, err = c.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return p
}

func start(t *testing.T, c kubernetes.Interface, netnsDir string, log ...*zap.Logger) *kubepods.Cluster {
	t.Helper()
	o := kubepods.Options{Client: c, Node: "node-a", NetnsDir: netnsDir, ProcDir: "/proc"}
	if len(log) > 0 {
		o.Logger = log[0]
	}
	cl, err := kubepods.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := cl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return cl
}

var mesh = map[string]string{agent.LabelDataplaneMode: agent.ModeMesh}

// TestPodLookup: the agent's lookups carry the pod's and its namespace's
// labels and service account, from the informers or, for a pod they have
// not seen, from the API server.
func TestPodLookup(t *testing.T) {
	env := kubetest.Shared(t)
	c := env.Clientset(t)
	namespace(t, c, "lookup", mesh)
	p := pod(t, c, "lookup", "app", "node-a", netip.Addr{}, map[string]string{"app": "cart"})
	cl := start(t, c, t.TempDir())
	got, err := cl.Pod(context.Background(), "lookup", "app")
	if err != nil {
		t.Fatal(err)
	}
	if got.UID != string(p.UID) || got.ServiceAccount != "sa-app" || got.Labels["app"] != "cart" || got.NamespaceLabels[agent.LabelDataplaneMode] != agent.ModeMesh {
		t.Errorf("Pod = %+v", got)
	}
	// Just bound, and on another node so the informer never holds it.
	other := pod(t, c, "lookup", "elsewhere", "node-b", netip.Addr{}, nil)
	if got, err := cl.Pod(context.Background(), "lookup", "elsewhere"); err != nil || got.UID != string(other.UID) {
		t.Errorf("Pod of a pod the informer has not seen = %+v, %v", got, err)
	}
	if _, err := cl.Pod(context.Background(), "lookup", "missing"); err == nil {
		t.Error("a missing pod was found")
	}
}

// capturer records what the watch asks of the agent.
type capturer struct {
	mu       sync.Mutex
	captured map[string]agent.RunningPod
}

func (c *capturer) CapturePod(r agent.RunningPod) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.captured[r.Pod.UID] = r
	return nil
}

func (c *capturer) Release(uid string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.captured, uid)
	return nil
}

func (c *capturer) Captured(uid string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.captured[uid]
	return ok
}

func (c *capturer) get(uid string) (agent.RunningPod, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.captured[uid]
	return r, ok
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := kubetest.WaitFor(context.Background(), 20*time.Second, func() (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// sandboxDir names the test's pod namespaces as a container runtime does,
// under a directory of the test's own (netnstest mounts them in
// /var/run/netns, shared with every other test on the machine).
func sandboxDir(t *testing.T, pods ...*netnstest.Pod) (string, []string) {
	dir := t.TempDir()
	var paths []string
	for i, p := range pods {
		path := filepath.Join(dir, fmt.Sprintf("cni-%d", i))
		if err := os.Symlink(p.Path(), path); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, path)
	}
	return dir, paths
}

// TestRunningAndWatch: pods running in an enrolled namespace are found
// with their network namespace and gateway; a namespace enrolled later
// gets its running pods captured, a pod opting out and the label's
// removal release them, and so does the pod's deletion. Pods of other
// nodes, host-network pods and pods without an address are left alone.
func TestRunningAndWatch(t *testing.T) {
	netnstest.Require(t)
	env := kubetest.Shared(t)
	c := env.Clientset(t)
	n := netnstest.NewNet(t)
	early, late := n.AddPod(t, "early"), n.AddPod(t, "late")
	dir, paths := sandboxDir(t, early, late)

	namespace(t, c, "enrolled", mesh)
	namespace(t, c, "later", nil)
	pEarly := pod(t, c, "enrolled", "early", "node-a", early.IP4, nil)
	pPending := pod(t, c, "enrolled", "pending", "node-a", netip.Addr{}, nil)
	pod(t, c, "enrolled", "remote", "node-b", late.IP4, nil)
	pod(t, c, "enrolled", "hostnet", "node-a", early.IP4, nil, func(s *corev1.PodSpec) { s.HostNetwork = true })
	pLate := pod(t, c, "later", "late", "node-a", late.IP4, nil)
	early.RunAsPod(t, string(pEarly.UID))
	late.RunAsPod(t, string(pLate.UID))

	cl := start(t, c, dir)
	running, err := cl.Running(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range running {
		names = append(names, r.Pod.Namespace+"/"+r.Pod.Name)
	}
	if len(running) != 1 || running[0].Pod.UID != string(pEarly.UID) {
		t.Fatalf("Running = %v, want enrolled/early only", names)
	}
	if r := running[0]; r.Netns != paths[0] || !slices.Contains(r.Gateways, n.Gateway4) || r.Pod.ServiceAccount != "sa-early" {
		t.Errorf("running pod %+v, want netns %s and gateway %s", r, paths[0], n.Gateway4)
	}

	capt := &capturer{captured: map[string]agent.RunningPod{}}
	for _, r := range running {
		capt.CapturePod(r)
	}
	// The plugin captures a pod in its sandbox's ADD, before the kubelet
	// posts its IPs: the watch must not take it for un-enrolled.
	pending := string(pPending.UID)
	capt.CapturePod(agent.RunningPod{Pod: agent.Pod{UID: pending, Namespace: "enrolled", Name: "pending"}, Netns: paths[0]})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go cl.Watch(ctx, capt)
	uid := string(pLate.UID)

	setLabels := func(get func() (metav1.Object, error), update func(metav1.Object) error, key, value string) {
		t.Helper()
		obj, err := get()
		if err != nil {
			t.Fatal(err)
		}
		l := obj.GetLabels()
		if l == nil {
			l = map[string]string{}
		}
		if value == "" {
			delete(l, key)
		} else {
			l[key] = value
		}
		obj.SetLabels(l)
		if err := update(obj); err != nil {
			t.Fatal(err)
		}
	}
	nsLabel := func(value string) {
		setLabels(func() (metav1.Object, error) { return c.CoreV1().Namespaces().Get(ctx, "later", metav1.GetOptions{}) },
			func(o metav1.Object) error {
				_, err := c.CoreV1().Namespaces().Update(ctx, o.(*corev1.Namespace), metav1.UpdateOptions{})
				return err
			}, agent.LabelDataplaneMode, value)
	}
	podLabel := func(value string) {
		setLabels(func() (metav1.Object, error) { return c.CoreV1().Pods("later").Get(ctx, "late", metav1.GetOptions{}) },
			func(o metav1.Object) error {
				_, err := c.CoreV1().Pods("later").Update(ctx, o.(*corev1.Pod), metav1.UpdateOptions{})
				return err
			}, agent.LabelDataplaneMode, value)
	}

	nsLabel(agent.ModeMesh)
	waitFor(t, "the pod of a namespace enrolled later is captured", func() bool { return capt.Captured(uid) })
	if r, _ := capt.get(uid); r.Netns != paths[1] {
		t.Errorf("captured with netns %s, want %s", r.Netns, paths[1])
	}
	podLabel(agent.ModeNone)
	waitFor(t, "the pod opting out is released", func() bool { return !capt.Captured(uid) })
	podLabel("")
	waitFor(t, "the pod is captured again", func() bool { return capt.Captured(uid) })
	nsLabel("")
	waitFor(t, "un-labelling the namespace releases the pod", func() bool { return !capt.Captured(uid) })
	nsLabel(agent.ModeMesh)
	waitFor(t, "the pod is captured again", func() bool { return capt.Captured(uid) })
	if err := c.CoreV1().Pods("later").Delete(ctx, "late", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deleted pod is released", func() bool { return !capt.Captured(uid) })
	if !capt.Captured(string(pEarly.UID)) {
		t.Error("the watch released the pod captured at start")
	}
	if !capt.Captured(pending) {
		t.Error("the watch released the pod the plugin captured before its IPs were posted")
	}
	if len(capt.captured) != 2 {
		t.Errorf("captured %v", capt.captured)
	}
}

// TestStaleAddress: after a node reboots, a pod's status can still name
// the address it had before, which the runtime may have given another
// pod. Found by that address alone, the other pod's namespace would be
// captured under this pod's identity: the agent refuses, says why, and
// captures the pod once its status names its own address.
func TestStaleAddress(t *testing.T) {
	netnstest.Require(t)
	env := kubetest.Shared(t)
	c := env.Clientset(t)
	n := netnstest.NewNet(t)
	own, others := n.AddPod(t, "own"), n.AddPod(t, "other")
	dir, paths := sandboxDir(t, own, others)

	namespace(t, c, "rebooted", mesh)
	namespace(t, c, "unmeshed", nil)
	pMoved := pod(t, c, "rebooted", "moved", "node-a", others.IP4, nil) // the address it had before
	pOther := pod(t, c, "unmeshed", "other", "node-a", others.IP4, nil)
	own.RunAsPod(t, string(pMoved.UID))
	others.RunAsPod(t, string(pOther.UID))

	core, logs := observer.New(zap.InfoLevel)
	cl := start(t, c, dir, zap.New(core))
	running, err := cl.Running(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(running) != 0 {
		t.Fatalf("Running = %+v: a stale address named another pod's namespace", running)
	}
	if logs.FilterMessage("running pod left for later").FilterField(zap.String("pod", "rebooted/moved")).FilterFieldKey("error").Len() != 1 {
		t.Errorf("no log of the pod left out: %v", logs.All())
	}

	capt := &capturer{captured: map[string]agent.RunningPod{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go cl.Watch(ctx, capt)
	waitFor(t, "the watch refuses the stale address, saying why", func() bool {
		for _, e := range logs.FilterField(zap.String("pod", "rebooted/moved")).All() {
			if err, _ := e.ContextMap()["error"].(string); strings.Contains(err, "stale") {
				return true
			}
		}
		return false
	})
	if capt.Captured(string(pMoved.UID)) {
		t.Fatal("the pod was captured by a stale address")
	}

	pMoved.Status.PodIP, pMoved.Status.PodIPs = own.IP4.String(), []corev1.PodIP{{IP: own.IP4.String()}}
	if _, err := c.CoreV1().Pods("rebooted").UpdateStatus(ctx, pMoved, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pod is captured once its status names its own address", func() bool { return capt.Captured(string(pMoved.UID)) })
	if r, _ := capt.get(string(pMoved.UID)); r.Netns != paths[0] {
		t.Errorf("captured with netns %s, want %s", r.Netns, paths[0])
	}
}

// Without the node's /proc the agent does not start: it would have to
// trust a status address alone.
func TestNoProcNoStart(t *testing.T) {
	env := kubetest.Shared(t)
	cl, err := kubepods.New(kubepods.Options{Client: env.Clientset(t), Node: "node-a", ProcDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "not a proc file system") {
		t.Errorf("Start without /proc: %v", err)
	}
}
