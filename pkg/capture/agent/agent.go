// Package agent is the node agent of in-pod capture (docs/design.md §10). For each
// pod sandbox the CNI plugin reports, it decides whether the pod is
// enrolled, writes the redirection rules inside the pod's network
// namespace and hands the namespace to the node proxy; on deletion it
// undoes both.
//
// Start order: the agent must know every pod already captured on the node
// before it serves the handoff socket, or a node proxy that connects would
// be told to drop them. Running pods come from RunningPods (the Kubernetes
// wiring: a node-local pod watch and a namespace lookup); Start captures
// them first, then serves.
package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"

	"github.com/containernetworking/plugins/pkg/ns"
	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/capture/cni"
	"github.com/causeway-mesh/causeway/pkg/capture/handoff"
	"github.com/causeway-mesh/causeway/pkg/capture/rules"
)

// Handoff is the agent's side of the handoff socket (handoff.Server).
type Handoff interface {
	AddPod(pod handoff.Pod, netns *os.File) error
	// Restore records a pod captured before the agent started, for the
	// replay to the first node proxy that connects.
	Restore(pod handoff.Pod, netns *os.File) error
	RemovePod(uid string) error
	Has(uid string) bool
}

// RunningPod is a pod found running on the node, with its namespace path.
type RunningPod struct {
	Pod      Pod
	Netns    string
	Gateways []netip.Addr
}

// RunningPods lists the enrolled pods already running on the node.
type RunningPods interface {
	Running(ctx context.Context) ([]RunningPod, error)
}

// Options configure an Agent.
type Options struct {
	Pods    Pods
	Rules   rules.Backend
	Handoff Handoff
	// Config is the base of every pod's rules; the pod's gateways are
	// added to its probe sources.
	Config rules.Config
	// Running, when set, provides the pods to capture before serving.
	Running RunningPods
	Logger  *zap.Logger
}

// Agent captures pods. Its methods are safe for concurrent use.
type Agent struct {
	opts Options
	log  *zap.Logger

	restored chan struct{} // closed once Start has captured the running pods

	mu       sync.Mutex
	captured map[string]capturedPod // by container (sandbox) id
}

type capturedPod struct {
	uid, namespace, name, netns string
	cfg                         rules.Config
}

// New checks the options.
func New(o Options) (*Agent, error) {
	if o.Pods == nil || o.Rules == nil || o.Handoff == nil {
		return nil, errors.New("agent: Pods, Rules and Handoff are required")
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return &Agent{opts: o, log: o.Logger, restored: make(chan struct{}), captured: map[string]capturedPod{}}, nil
}

// Add handles a CNI ADD: it returns once the pod is captured (rules in
// place, the node proxy acknowledged it), or is not enrolled. Failures:
// the pod cannot be looked up, or the node proxy is not connected or
// refuses it: retryable; the namespace is not one, or its rules cannot be
// written: NonRetryableError.
func (a *Agent) Add(ctx context.Context, ev cni.Event) (cni.Reply, error) {
	pod, err := a.opts.Pods.Pod(ctx, ev.Namespace, ev.PodName)
	if err != nil {
		return cni.Reply{}, fmt.Errorf("look up pod %s/%s: %w", ev.Namespace, ev.PodName, err)
	}
	if ok, why := Enrolled(pod); !ok {
		a.log.Debug("pod not enrolled", zap.String("pod", ev.Namespace+"/"+ev.PodName), zap.String("reason", why))
		return cni.Reply{Reason: why}, nil
	}
	if err := a.capture(ev.ContainerID, pod, ev.Netns, ev.Gateways, a.opts.Handoff.AddPod); err != nil {
		return cni.Reply{}, err
	}
	return cni.Reply{Captured: true}, nil
}

// CapturePod captures a pod found running (the pod watch's way in, for
// namespaces enrolled after their pods started).
func (a *Agent) CapturePod(r RunningPod) error {
	return a.capture(runningKey(r), r.Pod, r.Netns, r.Gateways, a.opts.Handoff.AddPod)
}

// runningKey records a pod found running (no sandbox id is known for it);
// Release lets it go.
func runningKey(r RunningPod) string { return "running:" + r.Pod.UID }

func (a *Agent) capture(sandbox string, pod Pod, netnsPath string, gateways []netip.Addr, hand func(handoff.Pod, *os.File) error) error {
	nsh, err := ns.GetNS(netnsPath)
	if err != nil {
		return nonRetryable(fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err))
	}
	defer nsh.Close()
	cfg := a.opts.Config
	cfg.ProbeSources = append(append([]netip.Addr(nil), cfg.ProbeSources...), gateways...)
	if err := a.opts.Rules.Apply(int(nsh.Fd()), cfg); err != nil {
		return nonRetryable(fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err))
	}
	f, err := os.Open(netnsPath)
	if err != nil {
		return nonRetryable(fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err))
	}
	hp := handoff.Pod{UID: pod.UID, Name: pod.Name, Namespace: pod.Namespace, ServiceAccount: pod.ServiceAccount}
	if hp.ServiceAccount == "" {
		hp.ServiceAccount = "default"
	}
	// The rules stay when the handoff fails: the pod's traffic then
	// fails closed, and a retry, or the sandbox's deletion, follows.
	if err := hand(hp, f); err != nil {
		return err
	}
	a.mu.Lock()
	a.captured[sandbox] = capturedPod{uid: pod.UID, namespace: pod.Namespace, name: pod.Name, netns: netnsPath, cfg: cfg}
	a.mu.Unlock()
	a.log.Info("pod captured", zap.String("pod", pod.Namespace+"/"+pod.Name), zap.String("uid", pod.UID))
	return nil
}

// Del handles a CNI DEL: the node proxy lets the pod go and the rules
// are removed, if the namespace is still there. Deleting an unknown
// sandbox succeeds.
func (a *Agent) Del(_ context.Context, ev cni.Event) error {
	a.mu.Lock()
	cp, ok := a.captured[ev.ContainerID]
	delete(a.captured, ev.ContainerID)
	a.mu.Unlock()
	if !ok {
		return nil
	}
	herr := a.opts.Handoff.RemovePod(cp.uid)
	var rerr error
	if nsh, err := ns.GetNS(cp.netns); err == nil {
		rerr = a.opts.Rules.Delete(int(nsh.Fd()))
		nsh.Close()
	}
	a.log.Info("pod released", zap.String("pod", cp.namespace+"/"+cp.name), zap.String("uid", cp.uid))
	return errors.Join(herr, rerr)
}

// Captured reports whether the pod with this uid is captured, by a CNI
// ADD or as a running pod.
func (a *Agent) Captured(uid string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, cp := range a.captured {
		if cp.uid == uid {
			return true
		}
	}
	return false
}

// Release lets a captured pod go, however it was captured (the pod watch's
// way out: its namespace or pod was un-enrolled, or the pod is gone).
// Releasing a pod that is not captured succeeds.
func (a *Agent) Release(uid string) error {
	return a.release(func(cp capturedPod) bool { return cp.uid == uid })
}

// ReleaseAll lets every captured pod go: their traffic flows as it did
// before capture (the mesh is being uninstalled from the node).
func (a *Agent) ReleaseAll() error {
	return a.release(func(capturedPod) bool { return true })
}

func (a *Agent) release(which func(capturedPod) bool) error {
	a.mu.Lock()
	var sandboxes []string
	for sb, cp := range a.captured {
		if which(cp) {
			sandboxes = append(sandboxes, sb)
		}
	}
	a.mu.Unlock()
	var errs []error
	for _, sb := range sandboxes {
		errs = append(errs, a.Del(context.Background(), cni.Event{ContainerID: sb}))
	}
	return errors.Join(errs...)
}

// Restored is closed once Start has captured the running pods: a pod
// watch that captures and releases pods begins then, or it would race
// the restore.
func (a *Agent) Restored() <-chan struct{} { return a.restored }

// Check handles a CNI CHECK: an enrolled pod must be captured, with its
// rules intact.
func (a *Agent) Check(ctx context.Context, ev cni.Event) error {
	a.mu.Lock()
	cp, ok := a.captured[ev.ContainerID]
	a.mu.Unlock()
	if !ok {
		pod, err := a.opts.Pods.Pod(ctx, ev.Namespace, ev.PodName)
		if err != nil {
			return fmt.Errorf("look up pod %s/%s: %w", ev.Namespace, ev.PodName, err)
		}
		if enrolled, _ := Enrolled(pod); enrolled {
			return fmt.Errorf("pod %s/%s is enrolled but not captured", ev.Namespace, ev.PodName)
		}
		return nil
	}
	if !a.opts.Handoff.Has(cp.uid) {
		return fmt.Errorf("pod %s/%s is not handed to the node proxy", ev.Namespace, ev.PodName)
	}
	nsh, err := ns.GetNS(cp.netns)
	if err != nil {
		return fmt.Errorf("pod %s/%s: %w", ev.Namespace, ev.PodName, err)
	}
	defer nsh.Close()
	return a.opts.Rules.Check(int(nsh.Fd()), cp.cfg)
}

// Start captures the running pods, then serves node proxies on handoffLn
// (through serve, the handoff server's Serve) and the plugin on cniLn,
// until ctx ends.
func (a *Agent) Start(ctx context.Context, serveHandoff func(context.Context) error, cniLn net.Listener) error {
	if a.opts.Running != nil {
		running, err := a.opts.Running.Running(ctx)
		if err != nil {
			return fmt.Errorf("agent: list running pods: %w", err)
		}
		for _, r := range running {
			if err := a.capture(runningKey(r), r.Pod, r.Netns, r.Gateways, a.opts.Handoff.Restore); err != nil {
				a.log.Error("cannot capture running pod", zap.String("pod", r.Pod.Namespace+"/"+r.Pod.Name), zap.Error(err))
			}
		}
	} else {
		a.log.Warn("no source of running pods: pods captured before this agent started are not replayed to the node proxy")
	}
	close(a.restored)
	errc := make(chan error, 2)
	go func() { errc <- serveHandoff(ctx) }()
	go func() { errc <- a.ServeCNI(ctx, cniLn) }()
	err := <-errc
	if err2 := <-errc; err == nil {
		err = err2
	}
	return err
}
