package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/pkg/capture/agent"
	"github.com/causeway-mesh/causeway/pkg/capture/cni"
	"github.com/causeway-mesh/causeway/pkg/capture/handoff"
	"github.com/causeway-mesh/causeway/pkg/capture/internal/handofftest"
	"github.com/causeway-mesh/causeway/pkg/capture/internal/netnstest"
	"github.com/causeway-mesh/causeway/pkg/capture/rules"
)

type staticPods map[string]agent.Pod

func (s staticPods) Pod(_ context.Context, namespace, name string) (agent.Pod, error) {
	p, ok := s[namespace+"/"+name]
	if !ok {
		return agent.Pod{}, fmt.Errorf("pod %s/%s not found", namespace, name)
	}
	return p, nil
}

var (
	buildOnce sync.Once
	pluginBin string
	buildErr  error
)

// plugin builds cmd/causeway-cni once per test binary.
func plugin(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "causeway-cni")
		if err != nil {
			buildErr = err
			return
		}
		pluginBin = filepath.Join(dir, "causeway-cni")
		out, err := exec.Command("go", "build", "-o", pluginBin, "github.com/causeway-mesh/causeway/cmd/causeway-cni").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("%v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("build the plugin: %v", buildErr)
	}
	return pluginBin
}

type fixture struct {
	net      *netnstest.Net
	pod      *netnstest.Pod
	dir      string
	cniSock  string
	proxy    *handofftest.Proxy
	handoff  *handoff.Server
	agent    *agent.Agent
	stopProx func()
}

// start runs an agent and, when connectProxy, a node proxy's side of the
// handoff that takes delay to accept each pod.
func start(t *testing.T, connectProxy bool, delay time.Duration) *fixture {
	netnstest.Require(t)
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go tool to build the plugin")
	}
	f := &fixture{net: netnstest.NewNet(t), dir: t.TempDir(), proxy: &handofftest.Proxy{Delay: delay}}
	f.pod = f.net.AddPod(t, "app")
	f.cniSock = filepath.Join(f.dir, "cni.sock")
	handoffSock := filepath.Join(f.dir, "handoff.sock")
	f.handoff = &handoff.Server{AckTimeout: 2 * time.Second}
	pods := staticPods{
		"t/app":      {UID: "uid-app", Name: "app", Namespace: "t", ServiceAccount: "app", NamespaceLabels: map[string]string{agent.LabelDataplaneMode: agent.ModeMesh}},
		"plain/app":  {UID: "uid-plain", Name: "app", Namespace: "plain"},
		"t/waypoint": {UID: "uid-wp", Name: "waypoint", Namespace: "t", Labels: map[string]string{agent.LabelGatewayName: "wp"}, NamespaceLabels: map[string]string{agent.LabelDataplaneMode: agent.ModeMesh}},
	}
	a, err := agent.New(agent.Options{Pods: pods, Rules: rules.NFTables{}, Handoff: f.handoff})
	if err != nil {
		t.Fatal(err)
	}
	f.agent = a
	hln, err := handoff.Listen(handoffSock)
	if err != nil {
		t.Fatal(err)
	}
	cln, err := net.Listen("unix", f.cniSock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- a.Start(ctx, func(ctx context.Context) error { return f.handoff.Serve(ctx, hln) }, cln)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	})
	if connectProxy {
		snap := make(chan struct{}, 1)
		pctx, pcancel := context.WithCancel(context.Background())
		c := &handoff.Client{Path: handoffSock, State: handoff.NewState(f.proxy), OnSnapshot: func() { snap <- struct{}{} }}
		pdone := make(chan struct{})
		go func() { c.Run(pctx); close(pdone) }()
		f.stopProx = func() { pcancel(); <-pdone }
		t.Cleanup(f.stopProx)
		select {
		case <-snap:
		case <-time.After(5 * time.Second):
			t.Fatal("the proxy side did not connect")
		}
	}
	return f
}

const prevResult = `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"%s"}],"ips":[{"address":"%s/24","gateway":"%s","interface":0}]}`

// run invokes the plugin as a container runtime does.
func (f *fixture) run(t *testing.T, command, namespace, name string, extra string) (string, error) {
	t.Helper()
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"test","type":"causeway-cni","agent_socket":%q,"timeout":"3s"%s,"prevResult":`+prevResult+`}`,
		f.cniSock, extra, f.pod.Path(), f.pod.IP4, f.net.Gateway4)
	cmd := exec.Command(plugin(t))
	cmd.Stdin = strings.NewReader(conf)
	cmd.Env = []string{"CNI_COMMAND=" + command, "CNI_CONTAINERID=sandbox-" + name, "CNI_NETNS=" + f.pod.Path(), "CNI_IFNAME=eth0",
		"CNI_PATH=" + filepath.Dir(plugin(t)), "CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=" + namespace + ";K8S_POD_NAME=" + name}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("%v: %s %s", err, stdout.String(), stderr.String())
	}
	return stdout.String(), err
}

func (f *fixture) rulesInPlace(t *testing.T) bool {
	out, err := f.pod.Cmd("nft", "list", "table", "inet", rules.TableName).CombinedOutput()
	return err == nil && strings.Contains(string(out), "redirect to :15001")
}

// TestPluginCapturesEnrolledPod: ADD blocks until the node proxy has the
// pod, writes the rules with the gateway as probe source, passes
// prevResult through; CHECK verifies; DEL undoes it all.
func TestPluginCapturesEnrolledPod(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs the nft tool to look at the rules")
	}
	f := start(t, true, 300*time.Millisecond)
	migrate := func() string {
		out, _ := f.pod.Cmd("cat", cni.MigrateReqSysctl).Output()
		return strings.TrimSpace(string(out))
	}
	migrateBefore := migrate()
	begin := time.Now()
	out, err := f.run(t, "ADD", "t", "app", "")
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	// Queued connections move to the next node proxy: set in the pod's
	// namespace by the plugin (the shipped node proxy cannot write /proc/sys).
	switch migrateBefore {
	case "":
		t.Logf("%s: not in this kernel (Linux 5.14+)", cni.MigrateReqSysctl)
	case "0":
		if got := migrate(); got != "1" {
			t.Errorf("%s in the pod after ADD: %q, want 1", cni.MigrateReqSysctl, got)
		}
	default:
		t.Errorf("%s in a new namespace: %q, want the kernel default 0", cni.MigrateReqSysctl, migrateBefore)
	}
	if d := time.Since(begin); d < f.proxy.Delay {
		t.Errorf("ADD returned after %s, before the proxy took the pod (%s)", d, f.proxy.Delay)
	}
	if !f.proxy.Has("uid-app") {
		t.Fatal("ADD returned but the node proxy does not have the pod")
	}
	var res map[string]any
	if err := json.Unmarshal([]byte(out), &res); err != nil || !strings.Contains(out, f.pod.IP4.String()) {
		t.Errorf("ADD printed %q (%v), want prevResult", out, err)
	}
	listing := f.pod.Run(t, "nft", "list", "table", "inet", rules.TableName)
	if !strings.Contains(listing, "ip saddr "+f.net.Gateway4.String()+" return") {
		t.Errorf("the gateway is not a probe source:\n%s", listing)
	}
	if _, err := f.run(t, "CHECK", "t", "app", ""); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	f.pod.Run(t, "nft", "flush", "chain", "inet", rules.TableName, "output")
	if _, err := f.run(t, "CHECK", "t", "app", ""); err == nil {
		t.Error("CHECK passed with the output rules flushed")
	}
	if _, err := f.run(t, "DEL", "t", "app", ""); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if f.proxy.Has("uid-app") || f.rulesInPlace(t) {
		t.Error("DEL left the pod with the proxy or its rules in place")
	}
	if _, err := f.run(t, "DEL", "t", "app", ""); err != nil {
		t.Errorf("second DEL: %v", err)
	}
}

// TestPluginLeavesOthersAlone: pods not enrolled, waypoints and excluded
// namespaces pass through without rules.
func TestPluginLeavesOthersAlone(t *testing.T) {
	f := start(t, true, 0)
	for _, tc := range []struct{ ns, name, extra string }{
		{"plain", "app", ""},
		{"t", "waypoint", ""},
		{"t", "app", `,"exclude_namespaces":["t"]`},
	} {
		if _, err := f.run(t, "ADD", tc.ns, tc.name, tc.extra); err != nil {
			t.Errorf("ADD %s/%s: %v", tc.ns, tc.name, err)
		}
		if f.rulesInPlace(t) {
			t.Errorf("%s/%s got capture rules", tc.ns, tc.name)
		}
	}
	for _, uid := range []string{"uid-app", "uid-plain", "uid-wp"} {
		if f.proxy.Has(uid) {
			t.Errorf("the proxy got %s", uid)
		}
	}
}

// TestPluginFailsClosed: without a node proxy, or without the agent, ADD
// fails: the pod does not start unprotected.
func TestPluginFailsClosed(t *testing.T) {
	f := start(t, false, 0)
	_, err := f.run(t, "ADD", "t", "app", "")
	if err == nil || !strings.Contains(err.Error(), "no node proxy") {
		t.Errorf("ADD with no proxy = %v, want a failure naming it", err)
	}
	if err := f.agent.Check(context.Background(), eventFor(f)); err == nil {
		t.Error("the agent considers the pod captured")
	}
	os.Remove(f.cniSock)
	begin := time.Now()
	if _, err := f.run(t, "ADD", "t", "app", ""); err == nil {
		t.Error("ADD without an agent succeeded")
	}
	if d := time.Since(begin); d > 5*time.Second {
		t.Errorf("ADD without an agent took %s, beyond its timeout", d)
	}
	if _, err := f.run(t, "DEL", "t", "app", ""); err != nil {
		t.Errorf("DEL without an agent: %v (must not block deletion)", err)
	}
}

// TestAgentRestoresRunningPods: pods found running at start are replayed
// to the first node proxy.
func TestAgentRestoresRunningPods(t *testing.T) {
	netnstest.Require(t)
	n := netnstest.NewNet(t)
	p := n.AddPod(t, "run")
	dir := t.TempDir()
	hs := &handoff.Server{}
	a, err := agent.New(agent.Options{Pods: staticPods{}, Rules: rules.NFTables{}, Handoff: hs,
		Running: runningPods{{Pod: agent.Pod{UID: "uid-run", Name: "run", Namespace: "t"}, Netns: p.Path()}}})
	if err != nil {
		t.Fatal(err)
	}
	hln, err := handoff.Listen(filepath.Join(dir, "h.sock"))
	if err != nil {
		t.Fatal(err)
	}
	cln, err := net.Listen("unix", filepath.Join(dir, "c.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Start(ctx, func(ctx context.Context) error { return hs.Serve(ctx, hln) }, cln)
	ps := &handofftest.Proxy{}
	snap := make(chan struct{}, 1)
	c := &handoff.Client{Path: filepath.Join(dir, "h.sock"), State: handoff.NewState(ps), OnSnapshot: func() { snap <- struct{}{} }}
	go c.Run(ctx)
	select {
	case <-snap:
	case <-time.After(5 * time.Second):
		t.Fatal("no snapshot")
	}
	if !ps.Has("uid-run") {
		t.Error("the running pod was not replayed")
	}
	if err := (rules.NFTables{}).Check(p.Fd(), rules.Config{}); err != nil {
		t.Errorf("the running pod's rules: %v", err)
	}
}

type runningPods []agent.RunningPod

func (r runningPods) Running(context.Context) ([]agent.RunningPod, error) { return r, nil }

func eventFor(f *fixture) cni.Event {
	return cni.Event{ContainerID: "sandbox-app", Netns: f.pod.Path(), PodName: "app", Namespace: "t"}
}
