package localmesh

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/causeway-mesh/causeway/pkg/config"
)

// NodeAccount is the service account node proxies authenticate as; it is
// the only account the CA lets impersonate workloads.
const NodeAccount = "causeway-system/nodeproxy"

// Options say where binaries, configuration and state are.
type Options struct {
	BinDir    string // controlplane, nodeproxy, waypoint, echo
	ConfigDir string // the local-mode YAML
	PolicyDir string // Rego policies for the waypoints
	// PolicyRepo, if set, is where a Git repository is created at start
	// from PolicyDir; the waypoints then follow its branch (PolicyBranch)
	// instead of watching PolicyDir.
	PolicyRepo string
	StateDir   string // CA files, tokens, logs
	// LogFormat of the children: json (default) or console.
	LogFormat string
	// ReadyTimeout bounds the wait for each component (default 30 s).
	ReadyTimeout time.Duration
	// ControlPlaneArgs are extra flags for the control plane (for example
	// a short --cert-ttl).
	ControlPlaneArgs []string
	// NodeProxyArgs are extra flags for the node proxy of each node named.
	NodeProxyArgs map[string][]string
	// WaypointArgs are extra flags for every waypoint (for example
	// --tracing-endpoint).
	WaypointArgs []string
}

// Mesh is a running local mesh.
type Mesh struct {
	Plan  *Plan
	Opts  Options
	group group
	// Died receives the description of the first process that exits on its own.
	Died chan string
	// Policies is the policy repository (Options.PolicyRepo), nil without.
	Policies *PolicyRepo
}

// Start launches every process of plan, waiting for each layer to be ready
// (control plane, then node proxies and waypoints, then apps). On any
// failure everything started is stopped and the error names the process and
// its last log lines.
func Start(ctx context.Context, plan *Plan, o Options) (*Mesh, error) {
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = 30 * time.Second
	}
	if o.LogFormat == "" {
		o.LogFormat = "json"
	}
	for _, d := range []string{o.StateDir, filepath.Join(o.StateDir, "logs"), filepath.Join(o.StateDir, "ca")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("state directory: %w", err)
		}
	}
	if err := checkPortsFree(plan); err != nil {
		return nil, err
	}
	if len(plan.Waypoints) > 0 {
		// A waypoint waits for its policy directory to appear (a Git
		// checkout may come later); here nothing would make it appear.
		if st, err := os.Stat(o.PolicyDir); err != nil {
			return nil, fmt.Errorf("waypoints' policy directory: %w", err)
		} else if !st.IsDir() {
			return nil, fmt.Errorf("waypoints' policy directory %s: not a directory", o.PolicyDir)
		}
	}
	tokens, err := writeTokens(plan, o.StateDir)
	if err != nil {
		return nil, err
	}
	m := &Mesh{Plan: plan, Opts: o, Died: make(chan string, 1)}
	policyArgs := []string{"--policy-dir", o.PolicyDir}
	if o.PolicyRepo != "" && len(plan.Waypoints) > 0 {
		if m.Policies, err = CreatePolicyRepo(o.PolicyRepo, o.PolicyDir); err != nil {
			return nil, err
		}
		policyArgs = []string{"--policy-git-url", m.Policies.URL(), "--policy-git-ref", PolicyBranch, "--policy-git-poll", "1s"}
	}
	ok := false
	defer func() {
		if !ok {
			m.Stop()
		}
	}()
	logDir := filepath.Join(o.StateDir, "logs")
	caDir := filepath.Join(o.StateDir, "ca")
	root := filepath.Join(caDir, "root-cert.pem")
	common := []string{"--log-format", o.LogFormat}

	launch := func(jobs []job) error {
		var procs []*process
		for _, j := range jobs {
			p, err := startProcess(j.name, j.bin, j.args, j.env, logDir)
			if err != nil {
				return err
			}
			p.job = j
			m.group.add(p)
			procs = append(procs, p)
		}
		rctx, cancel := context.WithTimeout(ctx, o.ReadyTimeout)
		defer cancel()
		for i, j := range jobs {
			if j.ready == "" {
				continue
			}
			if err := waitReady(rctx, procs[i], j.ready, j.broken); err != nil {
				return err
			}
		}
		return nil
	}

	cp := plan.ControlPlane
	if err := launch([]job{{name: "controlplane", bin: filepath.Join(o.BinDir, "controlplane"), ready: "http://" + cp.Status + "/healthz/ready",
		args: append([]string{"--listen", cp.GRPC, "--readiness", cp.Status, "--metrics", cp.Status, "--admin", cp.Status, "--config-dir", o.ConfigDir, "--ca-dir", caDir,
			"--tokens-file", tokens, "--trusted-node-accounts", NodeAccount}, append(common, o.ControlPlaneArgs...)...)}}); err != nil {
		return nil, err
	}
	var proxies []job
	for _, n := range plan.Nodes {
		proxies = append(proxies, job{name: "nodeproxy-" + n.Node, bin: filepath.Join(o.BinDir, "nodeproxy"), ready: "http://" + n.Status + "/healthz/ready",
			args: append([]string{"--node", n.Node, "--xds-address", cp.GRPC, "--token-file", tokenFile(o.StateDir, n.Token),
				"--root-cert", root, "--admin", n.Admin, "--readiness", n.Status, "--metrics", n.Status, "--socks5", n.SOCKS5},
				append(common, o.NodeProxyArgs[n.Node]...)...)})
	}
	for _, w := range plan.Waypoints {
		args := []string{"--namespace", w.Namespace, "--name", w.Name, "--xds-address", cp.GRPC,
			"--token-file", tokenFile(o.StateDir, w.Token), "--root-cert", root,
			"--service-account", w.ServiceAccount, "--admin", w.Admin, "--readiness", w.Status, "--metrics", w.Status}
		if w.Ingress {
			// The destinations' waypoints authorize; the gateway has no policy of its own here.
			proxies = append(proxies, job{name: "ingress-" + w.Namespace + "-" + w.Pod, bin: filepath.Join(o.BinDir, "waypoint"), ready: "http://" + w.Status + "/healthz/ready",
				args: slices.Concat(args, []string{"--ingress", "--ingress-address", w.IP}, common)})
			continue
		}
		proxies = append(proxies, job{name: "waypoint-" + w.Namespace + "-" + w.Pod, bin: filepath.Join(o.BinDir, "waypoint"), ready: "http://" + w.Status + "/healthz/ready",
			broken: policyRejected(w.Admin),
			args:   slices.Concat(args, []string{"--listen", w.HBONE}, policyArgs, common, o.WaypointArgs)})
	}
	if err := launch(proxies); err != nil {
		return nil, err
	}
	var apps []job
	for _, a := range plan.Apps {
		j, err := appJob(plan, a, o.BinDir)
		if err != nil {
			return nil, err
		}
		apps = append(apps, j)
	}
	if err := launch(apps); err != nil {
		return nil, err
	}
	if err := waitListening(ctx, plan.Apps, o.ReadyTimeout); err != nil {
		return nil, err
	}
	go m.watch()
	ok = true
	return m, nil
}

// job is one process to start.
type job struct {
	name, bin string
	args, env []string
	ready     string // readiness URL, "" when none
	// broken, if set, says why the process will not become ready by
	// itself (nil while it may), so the wait ends at once.
	broken func() error
}

// appJob runs a pod's local app: the echo backend on its listen addresses,
// or the command line through /bin/sh with the pod's environment
// (PodPlan.Env) and where to listen (CAUSEWAY_APP_LISTEN, space-separated
// host:port).
func appJob(plan *Plan, a AppPlan, binDir string) (job, error) {
	pod, err := plan.Pod(a.Namespace + "/" + a.Name)
	if err != nil {
		return job{}, err
	}
	j := job{name: "app-" + a.Namespace + "-" + a.Name, env: pod.Env()}
	if a.Command == EchoApp {
		j.bin, j.args = filepath.Join(binDir, "echo"), []string{"--pod", a.Name, "--namespace", a.Namespace}
		for _, l := range a.Listen {
			j.args = append(j.args, "--listen", l)
		}
		return j, nil
	}
	j.bin, j.args = "/bin/sh", []string{"-c", a.Command}
	j.env = append(j.env, "CAUSEWAY_APP_LISTEN="+strings.Join(a.Listen, " "), "CAUSEWAY_BIN="+binDir)
	return j, nil
}

// watch reports the first process that exits on its own while the mesh runs.
func (m *Mesh) watch() {
	m.group.mu.Lock()
	procs := append([]*process(nil), m.group.procs...)
	m.group.mu.Unlock()
	exits := make(chan *process, len(procs))
	for _, p := range procs {
		go func() {
			<-p.done
			exits <- p
		}()
	}
	for range procs {
		p := <-exits
		if p.stopping.Load() {
			continue
		}
		select {
		case m.Died <- p.describeExit():
		default:
		}
		return
	}
}

// StopProcess stops one process by name (e.g. "controlplane"), as an
// outage would; the rest of the mesh keeps running.
func (m *Mesh) StopProcess(name string) error {
	m.group.mu.Lock()
	defer m.group.mu.Unlock()
	for _, p := range m.group.procs {
		if p.name == name {
			p.stop(5 * time.Second)
			return nil
		}
	}
	return fmt.Errorf("no process %q in the mesh", name)
}

// Signal sends sig to one process (and what it started), as a fault would:
// SIGKILL for a crash, SIGTERM for a graceful restart. The mesh does not
// report its exit on Died; Exited says when it has ended.
func (m *Mesh) Signal(name string, sig syscall.Signal) error {
	p, err := m.process(name)
	if err != nil {
		return err
	}
	p.stopping.Store(true)
	if p.exited() {
		return fmt.Errorf("%s has already exited", name)
	}
	return syscall.Kill(-p.cmd.Process.Pid, sig)
}

// Exited is closed when the named process has ended.
func (m *Mesh) Exited(name string) (<-chan struct{}, error) {
	p, err := m.process(name)
	if err != nil {
		return nil, err
	}
	return p.done, nil
}

// Restart starts an exited process again with the same arguments and
// waits until it is ready. Its later exits are not reported on Died.
func (m *Mesh) Restart(ctx context.Context, name string) error {
	old, err := m.process(name)
	if err != nil {
		return err
	}
	if !old.exited() {
		return fmt.Errorf("%s is still running", name)
	}
	j := old.job
	p, err := startProcess(j.name, j.bin, j.args, j.env, filepath.Join(m.Opts.StateDir, "logs"))
	if err != nil {
		return err
	}
	p.job = j
	m.group.mu.Lock()
	for i, q := range m.group.procs {
		if q == old {
			m.group.procs[i] = p
		}
	}
	m.group.mu.Unlock()
	if j.ready == "" {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, m.Opts.ReadyTimeout)
	defer cancel()
	return waitReady(rctx, p, j.ready, j.broken)
}

func (m *Mesh) process(name string) (*process, error) {
	m.group.mu.Lock()
	defer m.group.mu.Unlock()
	for _, p := range m.group.procs {
		if p.name == name {
			return p, nil
		}
	}
	return nil, fmt.Errorf("no process %q in the mesh", name)
}

// Stop terminates every process, most recently started first.
func (m *Mesh) Stop() { m.group.stopAll(5 * time.Second) }

// StartDir starts the mesh of the configuration directory o.ConfigDir,
// its listeners from basePort (NewPlan), as Start does.
func StartDir(ctx context.Context, basePort int, o Options) (*Mesh, error) {
	snap, err := config.NewDirSource(o.ConfigDir, config.DirOptions{}).Load()
	if err != nil {
		return nil, err
	}
	plan, err := NewPlan(snap, basePort)
	if err != nil {
		return nil, err
	}
	return Start(ctx, plan, o)
}

// WaitLog waits until a line of process's log contains every one of
// fragments, or ctx ends (an error naming them).
func (m *Mesh) WaitLog(ctx context.Context, process string, fragments ...string) error {
	for {
		data, _ := os.ReadFile(m.LogPath(process))
		for _, line := range strings.Split(string(data), "\n") {
			all := true
			for _, f := range fragments {
				all = all && strings.Contains(line, f)
			}
			if all {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no line in %s's log contains all of %q", process, fragments)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// LogPath is the log file of a named process.
func (m *Mesh) LogPath(name string) string {
	return filepath.Join(m.Opts.StateDir, "logs", name+".log")
}

func tokenFile(stateDir, token string) string {
	return filepath.Join(stateDir, "tokens.d", strings.TrimSuffix(token, "-token")+".token")
}

// writeTokens creates a random bearer token per node proxy and waypoint,
// the control plane's tokens file mapping each to its account and node, and
// one file per token for the proxy that presents it.
func writeTokens(plan *Plan, stateDir string) (string, error) {
	dir := filepath.Join(stateDir, "tokens.d")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("tokens: %w", err)
	}
	var lines []string
	add := func(name, account, node string) error {
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return fmt.Errorf("token: %w", err)
		}
		tok := hex.EncodeToString(b)
		lines = append(lines, fmt.Sprintf("%s %s %s", tok, account, node))
		return os.WriteFile(tokenFile(stateDir, name), []byte(tok+"\n"), 0o600)
	}
	for _, n := range plan.Nodes {
		if err := add(n.Token, NodeAccount, n.Node); err != nil {
			return "", err
		}
	}
	for _, w := range plan.Waypoints {
		if err := add(w.Token, w.Namespace+"/"+w.ServiceAccount, w.Node); err != nil {
			return "", err
		}
	}
	path := filepath.Join(stateDir, "tokens")
	data := "# token namespace/serviceaccount node (written by meshctl up)\n" + strings.Join(lines, "\n") + "\n"
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		return "", fmt.Errorf("tokens file: %w", err)
	}
	return path, nil
}

// checkPortsFree fails early, naming the address, when any planned listener
// is taken.
func checkPortsFree(plan *Plan) error {
	addrs := []string{plan.ControlPlane.GRPC, plan.ControlPlane.Status}
	for _, n := range plan.Nodes {
		addrs = append(addrs, n.Admin, n.Status, n.SOCKS5)
	}
	for _, w := range plan.Waypoints {
		addrs = append(addrs, w.Admin, w.Status)
		if w.HBONE != "" {
			addrs = append(addrs, w.HBONE)
		}
	}
	for _, a := range plan.Apps {
		addrs = append(addrs, a.Listen...)
	}
	// Node proxies take over mesh pods' IPs: HBONE and the serving ports.
	for _, pod := range plan.Pods {
		if pod.SOCKS5 != "" {
			addrs = append(addrs, net.JoinHostPort(pod.IP, "15008"))
			for _, port := range pod.Ports {
				addrs = append(addrs, net.JoinHostPort(pod.IP, strconv.Itoa(int(port))))
			}
		}
	}
	for _, a := range addrs {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			return fmt.Errorf("address %s is already in use (another mesh running? pick another --base-port): %w", a, err)
		}
		ln.Close()
	}
	return nil
}

// waitListening waits until every app address accepts connections.
func waitListening(ctx context.Context, apps []AppPlan, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, a := range apps {
		for _, l := range a.Listen {
			for {
				c, err := net.DialTimeout("tcp", l, time.Second)
				if err == nil {
					c.Close()
					break
				}
				if time.Now().After(deadline) || ctx.Err() != nil {
					return errors.Join(fmt.Errorf("app %s/%s not listening on %s", a.Namespace, a.Name, l), err)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	return nil
}
