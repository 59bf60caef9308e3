package kubepods_test

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/causeway-mesh/causeway/pkg/capture/agent"
	"github.com/causeway-mesh/causeway/pkg/capture/cniinstall"
	"github.com/causeway-mesh/causeway/pkg/capture/handoff"
	"github.com/causeway-mesh/causeway/pkg/capture/internal/handofftest"
	"github.com/causeway-mesh/causeway/pkg/capture/internal/netnstest"
	"github.com/causeway-mesh/causeway/pkg/capture/rules"
	"github.com/causeway-mesh/causeway/pkg/internal/kubetest"
)

// TestAgentOnANode (below) runs cmd/causeway-agent.

// fatal fails the test on err; its first parameter takes the object a
// client call returns alongside.
func fatal(t *testing.T) func(any, error) {
	return func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
}

func runningPod(t *testing.T, c kubernetes.Interface, ns, name, ip string) string {
	t.Helper()
	ctx := context.Background()
	p, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{NodeName: "agent-node", Containers: []corev1.Container{{Name: "app", Image: "app"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	fatal(t)(c.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}))
	return string(p.UID)
}

type node struct {
	bin, kubeconfig                string
	netnsDir, confDir, binDir, run string
}

// start runs the agent binary as the DaemonSet would.
func (n *node) start(t *testing.T) (stop func() string) {
	t.Helper()
	cmd := exec.Command(n.bin, "--node=agent-node", "--kubeconfig="+n.kubeconfig, "--namespace=causeway-system",
		"--cni-socket="+filepath.Join(n.run, "cni.sock"), "--handoff-socket="+filepath.Join(n.run, "handoff.sock"),
		"--netns-dir="+n.netnsDir, "--proc-dir=/proc", "--cni-conf-dir="+n.confDir, "--cni-bin-dir="+n.binDir, "--log-format=console")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop = func() string {
		if stopped {
			return out.String()
		}
		stopped = true
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("agent exited: %v\n%s", err, out.String())
		}
		return out.String()
	}
	t.Cleanup(func() {
		if log := stop(); t.Failed() {
			t.Logf("agent log:\n%s", log)
		}
	})
	return stop
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestAgentOnANode runs the agent binary against a real apiserver with pods
// as network namespaces: it installs the chained configuration, replays
// the enrolled running pods to the node proxy, captures the pods of a
// namespace enrolled later, keeps everything across a restart (the
// DaemonSet remains), and removes the configuration, the binary and every
// pod's rules once the DaemonSet is deleted.
func TestAgentOnANode(t *testing.T) {
	netnstest.Require(t)
	env := kubetest.Shared(t)
	c := env.Clientset(t)
	ctx := context.Background()
	net := netnstest.NewNet(t)
	early, late := net.AddPod(t, "early"), net.AddPod(t, "late")

	root := t.TempDir()
	n := &node{bin: filepath.Join(root, "causeway-agent"), kubeconfig: env.Kubeconfig, netnsDir: filepath.Join(root, "netns"),
		confDir: filepath.Join(root, "net.d"), binDir: filepath.Join(root, "bin"), run: filepath.Join(root, "run")}
	if out, err := exec.Command("go", "build", "-o", n.bin, "github.com/causeway-mesh/causeway/cmd/causeway-agent").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for _, d := range []string{n.netnsDir, n.confDir, n.binDir} {
		os.Mkdir(d, 0o755)
	}
	for i, p := range []*netnstest.Pod{early, late} {
		os.Symlink(p.Path(), filepath.Join(n.netnsDir, fmt.Sprintf("cni-%d", i)))
	}
	primary := `{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"bridge"}]}`
	os.WriteFile(filepath.Join(n.confDir, "10-bridge.conflist"), []byte(primary), 0o644)
	os.WriteFile(filepath.Join(n.binDir, cniinstall.PluginType), []byte("plugin"), 0o755)

	for _, ns := range []struct {
		name   string
		labels map[string]string
	}{{"causeway-system", nil}, {"agent-enrolled", map[string]string{agent.LabelDataplaneMode: agent.ModeMesh}}, {"agent-later", nil}} {
		fatal(t)(c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns.name, Labels: ns.labels}}, metav1.CreateOptions{}))
		fatal(t)(c.CoreV1().ServiceAccounts(ns.name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}))
	}
	sel := map[string]string{"app": "nodeproxy"}
	fatal(t)(c.AppsV1().DaemonSets("causeway-system").Create(ctx, &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "causeway-nodeproxy"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: sel}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: sel}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "agent"}}}}},
	}, metav1.CreateOptions{}))
	earlyUID := runningPod(t, c, "agent-enrolled", "early", early.IP4.String())
	lateUID := runningPod(t, c, "agent-later", "late", late.IP4.String())
	early.RunAsPod(t, earlyUID)
	late.RunAsPod(t, lateUID)

	proxy := &handofftest.Proxy{}
	var snapshots sync.WaitGroup
	var snapMu sync.Mutex
	snaps := 0
	pctx, cancel := context.WithCancel(ctx)
	hc := &handoff.Client{Path: filepath.Join(n.run, "handoff.sock"), State: handoff.NewState(proxy), MaxBackoff: 200 * time.Millisecond,
		OnSnapshot: func() { snapMu.Lock(); snaps++; snapMu.Unlock() }}
	snapshots.Add(1)
	go func() { defer snapshots.Done(); hc.Run(pctx) }()
	defer func() { cancel(); snapshots.Wait() }()
	snapshotsSeen := func() int { snapMu.Lock(); defer snapMu.Unlock(); return snaps }

	ours := filepath.Join(n.confDir, cniinstall.DefaultConfName)
	// The rules exempt the pods' gateway, where the node's probes come from.
	probes := rules.Config{ProbeSources: []netip.Addr{net.Gateway4}}
	if net.IPv6 {
		probes.ProbeSources = append(probes.ProbeSources, net.Gateway6)
	}
	rulesIn := func(p *netnstest.Pod) bool { return (rules.NFTables{}).Check(p.Fd(), probes) == nil }
	captured := func(p *netnstest.Pod, uid string) bool { return proxy.Has(uid) && rulesIn(p) }

	stop := n.start(t)
	waitFor(t, "the running enrolled pod replayed to the node proxy", func() bool { return snapshotsSeen() >= 1 && captured(early, earlyUID) })
	waitFor(t, "the chained configuration", func() bool { return exists(ours) })
	if conf, _ := os.ReadFile(ours); !strings.Contains(string(conf), filepath.Join(n.run, "cni.sock")) || !strings.Contains(string(conf), `"bridge"`) {
		t.Errorf("configuration:\n%s", conf)
	}
	if captured(late, lateUID) {
		t.Fatal("a pod of a namespace not enrolled is captured")
	}
	ns, err := c.CoreV1().Namespaces().Get(ctx, "agent-later", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels = map[string]string{agent.LabelDataplaneMode: agent.ModeMesh}
	fatal(t)(c.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}))
	waitFor(t, "the pod of a namespace enrolled later captured", func() bool { return captured(late, lateUID) })

	// A restart: the DaemonSet remains, so does everything on the node.
	if log := stop(); !strings.Contains(log, "keeping the CNI configuration") {
		t.Errorf("the agent did not say it keeps the configuration:\n%s", log)
	}
	if !exists(ours) || !exists(filepath.Join(n.binDir, cniinstall.PluginType)) || !rulesIn(early) || !rulesIn(late) {
		t.Fatal("a restart removed the configuration, the binary or a pod's rules")
	}
	before := snapshotsSeen()
	stop = n.start(t)
	waitFor(t, "the new agent's snapshot", func() bool { return snapshotsSeen() > before })
	if !captured(early, earlyUID) || !captured(late, lateUID) {
		t.Error("after the restart the node proxy lost a pod")
	}

	// The uninstall: the DaemonSet is deleted, then its pod stops.
	if err := c.AppsV1().DaemonSets("causeway-system").Delete(ctx, "causeway-nodeproxy", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if log := stop(); !strings.Contains(log, "uninstalling") {
		t.Errorf("the agent did not uninstall:\n%s", log)
	}
	if exists(ours) || exists(filepath.Join(n.binDir, cniinstall.PluginType)) {
		t.Error("uninstall left the configuration or the binary")
	}
	if !exists(filepath.Join(n.confDir, "10-bridge.conflist")) {
		t.Error("uninstall removed the primary configuration")
	}
	if rulesIn(early) || rulesIn(late) || proxy.Has(earlyUID) || proxy.Has(lateUID) {
		t.Error("uninstall left pods captured")
	}

	// `kubectl delete -k` deletes the namespace first, and the namespace
	// controller may stop the pod while the DaemonSet still stands (this
	// API server runs no controllers: the namespace stays terminating and
	// the DaemonSet untouched).
	fatal(t)(c.AppsV1().DaemonSets("causeway-system").Create(ctx, &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "causeway-nodeproxy"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: sel}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: sel}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "agent"}}}}},
	}, metav1.CreateOptions{}))
	os.WriteFile(filepath.Join(n.binDir, cniinstall.PluginType), []byte("plugin"), 0o755)
	stop = n.start(t)
	waitFor(t, "the chained configuration again", func() bool { return exists(ours) })
	if err := c.CoreV1().Namespaces().Delete(ctx, "causeway-system", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if log := stop(); !strings.Contains(log, "uninstalling: the DaemonSet's namespace") {
		t.Errorf("the agent did not uninstall with its namespace deleted:\n%s", log)
	}
	if exists(ours) || exists(filepath.Join(n.binDir, cniinstall.PluginType)) {
		t.Error("uninstall with the namespace deleted left the configuration or the binary")
	}
}
