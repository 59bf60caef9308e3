// Command causeway-agent is the node agent of in-pod capture (docs/design.md §10),
// a container of the node proxy's DaemonSet pod. It
//
//   - answers the chained CNI plugin on a unix socket: for each enrolled
//     pod, writes the redirection rules in its network namespace and hands
//     the namespace to the node proxy (--inpod-handoff) on a second socket;
//   - watches the pods of its node and the namespaces (Kubernetes API), so
//     pods running before they were enrolled are captured, and released
//     when their enrollment ends, without a restart;
//   - installs the plugin's chained configuration and keeps it current
//     (package cniinstall; the plugin binary itself is copied by the
//     DaemonSet's init container, `causeway-cni install`).
//
// Uninstall rule: on SIGTERM the plugin's configuration and binary are
// removed, and every pod released, only when the agent's DaemonSet, or its
// namespace, is gone or being deleted. A restart, an upgrade or a deleted pod leaves them
// in place: enrolled pods created meanwhile wait for the next agent (the
// plugin fails their sandbox and kubelet retries) instead of starting
// uncaptured. When the API server cannot say (it is unreachable, or the
// agent's RBAC went first in a `kubectl delete -k`), the last state the
// agent's watches of its DaemonSet and namespace saw decides.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/causeway-mesh/causeway/pkg/bootstrap"
	"github.com/causeway-mesh/causeway/pkg/capture/agent"
	"github.com/causeway-mesh/causeway/pkg/capture/cni"
	"github.com/causeway-mesh/causeway/pkg/capture/cniinstall"
	"github.com/causeway-mesh/causeway/pkg/capture/handoff"
	"github.com/causeway-mesh/causeway/pkg/capture/kubepods"
	"github.com/causeway-mesh/causeway/pkg/capture/ownerwatch"
	"github.com/causeway-mesh/causeway/pkg/capture/rules"
	"github.com/causeway-mesh/causeway/pkg/logging"
	"github.com/causeway-mesh/causeway/pkg/version"
)

type config struct {
	node, kubeconfig           string
	cniSocket, handoffSocket   string
	netnsDir, procDir          string
	confDir, binDir, confName  string
	daemonSet, namespace       string
	pluginTimeout              time.Duration
	logFormat, logLevel        string
	ackTimeout, shutdownBudget time.Duration
}

func main() {
	var c config
	fs := flag.NewFlagSet("causeway-agent", flag.ExitOnError)
	fs.StringVar(&c.node, "node", os.Getenv("NODE_NAME"), "name of this node")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file (default: the pod's service account)")
	fs.StringVar(&c.cniSocket, "cni-socket", cni.DefaultAgentSocket, "socket the CNI plugin calls (a path on the node: the plugin runs there)")
	fs.StringVar(&c.handoffSocket, "handoff-socket", "/var/run/causeway/handoff.sock", "socket the node proxy connects to (nodeproxy --inpod-handoff)")
	fs.StringVar(&c.netnsDir, "netns-dir", kubepods.DefaultNetnsDir, "where the container runtime names pod network namespaces (mounted from the node at the same path)")
	fs.StringVar(&c.procDir, "proc-dir", kubepods.DefaultProcDir, "the node's /proc as mounted here (read-only): which processes are whose pods'")
	fs.StringVar(&c.confDir, "cni-conf-dir", "", "the node's CNI configuration directory as mounted here (empty: do not install the configuration)")
	fs.StringVar(&c.binDir, "cni-bin-dir", "", "the node's CNI binary directory as mounted here (where the init container put causeway-cni)")
	fs.StringVar(&c.confName, "cni-conf-name", cniinstall.DefaultConfName, "file name of the chained configuration; it must sort before the primary's")
	fs.DurationVar(&c.pluginTimeout, "cni-timeout", 30*time.Second, "how long the plugin waits for capture before failing the sandbox")
	fs.StringVar(&c.daemonSet, "daemonset", "causeway-nodeproxy", "this agent's DaemonSet: uninstall only when it is deleted")
	fs.StringVar(&c.namespace, "namespace", os.Getenv("POD_NAMESPACE"), "the DaemonSet's namespace")
	fs.DurationVar(&c.ackTimeout, "ack-timeout", 5*time.Second, "how long the node proxy may take to acknowledge a pod")
	fs.DurationVar(&c.shutdownBudget, "uninstall-timeout", 10*time.Second, "bound on deciding about, and doing, the uninstall at shutdown")
	fs.StringVar(&c.logFormat, "log-format", "json", "json or console")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn, error")
	version.RegisterFlag(fs, "causeway-agent")
	fs.Parse(os.Args[1:])
	if err := c.validate(); err != nil {
		bootstrap.Fatal("causeway-agent", err)
	}
	if err := run(c); err != nil {
		bootstrap.Fatal("causeway-agent", err)
	}
}

func (c config) validate() error {
	switch {
	case c.node == "":
		return errors.New("--node (or NODE_NAME) is required")
	case c.confDir != "" && c.binDir == "":
		return errors.New("--cni-bin-dir is required with --cni-conf-dir")
	case c.confDir != "" && c.namespace == "":
		return errors.New("--namespace (or POD_NAMESPACE) is required with --cni-conf-dir: the uninstall rule looks up the DaemonSet")
	case c.pluginTimeout <= 0:
		return errors.New("--cni-timeout must be positive")
	}
	return nil
}

func run(c config) error {
	logs, err := logging.New(logging.Options{Format: c.logFormat, Level: c.logLevel})
	if err != nil {
		return err
	}
	log := logs.Logger.With(zap.String("node", c.node))
	defer logs.Sync()
	ctx, stop := bootstrap.SignalContext()
	defer stop()

	rc, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	rc.UserAgent = "causeway-agent"
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	// The informers outlive ctx: the shutdown decision reads the DaemonSet's.
	infCtx, stopInformers := context.WithCancel(context.Background())
	defer stopInformers()
	cluster, err := kubepods.New(kubepods.Options{Client: client, Node: c.node, NetnsDir: c.netnsDir, ProcDir: c.procDir, Logger: log.Named("kubepods")})
	if err != nil {
		return err
	}
	var owner *ownerwatch.Watch
	if c.confDir != "" {
		owner = ownerwatch.New(infCtx, client, c.namespace, c.daemonSet, log)
	}
	if err := cluster.Start(infCtx); err != nil {
		return err
	}

	hs := &handoff.Server{Logger: log.Named("handoff"), AckTimeout: c.ackTimeout}
	a, err := agent.New(agent.Options{Pods: cluster, Running: cluster, Rules: rules.NFTables{}, Handoff: hs, Logger: log})
	if err != nil {
		return err
	}
	for _, s := range []string{c.cniSocket, c.handoffSocket} {
		if err := os.MkdirAll(filepath.Dir(s), 0o700); err != nil {
			return err
		}
	}
	hln, err := handoff.Listen(c.handoffSocket)
	if err != nil {
		return fmt.Errorf("handoff socket: %w", err)
	}
	cln, err := listenCNI(c.cniSocket)
	if err != nil {
		return fmt.Errorf("CNI socket: %w", err)
	}

	// The agent serves until the uninstall decision is made, so no CNI call
	// made meanwhile goes unanswered.
	serveCtx, stopServing := context.WithCancel(context.Background())
	defer stopServing()
	served := make(chan error, 1)
	go func() {
		served <- a.Start(serveCtx, func(ctx context.Context) error { return hs.Serve(ctx, hln) }, cln)
	}()
	go func() {
		select {
		case <-a.Restored():
			cluster.Watch(serveCtx, a)
		case <-serveCtx.Done():
		}
	}()

	var in *cniinstall.Installer
	kept := make(chan error, 1)
	if c.confDir != "" {
		in = &cniinstall.Installer{ConfDir: c.confDir, BinDir: c.binDir, ConfName: c.confName, Entry: map[string]any{
			"type": cniinstall.PluginType, "agent_socket": c.cniSocket, "timeout": c.pluginTimeout.String(),
		}}
		if _, err := os.Stat(filepath.Join(c.binDir, cniinstall.PluginType)); err != nil {
			return fmt.Errorf("the plugin binary is not installed (the init container runs `causeway-cni install`): %w", err)
		}
		go func() { kept <- in.Keep(ctx, log.Named("cniinstall")) }()
	}
	log.Info("node agent started", zap.String("cni_socket", c.cniSocket), zap.String("handoff_socket", c.handoffSocket), zap.String("cni_conf_dir", c.confDir))

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-served:
		served <- runErr
		if runErr == nil {
			runErr = errors.New("agent stopped")
		}
	case runErr = <-kept:
	}
	stop()
	if in != nil {
		dctx, cancel := context.WithTimeout(context.Background(), c.shutdownBudget)
		uninstall, why := owner.Gone(dctx)
		cancel()
		if uninstall && runErr == nil {
			log.Info("uninstalling: "+why, zap.String("daemonset", c.namespace+"/"+c.daemonSet))
			if err := in.Uninstall(); err != nil {
				log.Error("uninstall", zap.Error(err))
			}
			if err := a.ReleaseAll(); err != nil {
				log.Error("release pods", zap.Error(err))
			}
			// No agent follows: the socket's path goes too (listenCNI
			// leaves it, for a successor), and the directory made for it.
			if err := removeCNISocket(c.cniSocket); err != nil {
				log.Error("remove the CNI socket", zap.Error(err))
			}
		} else {
			log.Info("keeping the CNI configuration: "+why, zap.String("daemonset", c.namespace+"/"+c.daemonSet))
		}
	}
	stopServing()
	if err := <-served; err != nil && runErr == nil {
		runErr = err
	}
	log.Info("node agent stopped")
	return runErr
}

// removeCNISocket removes the plugin's socket and then its directory,
// which run made: unless it holds something else, or is a mount
// point (an older DaemonSet mounted a host directory there), which are not
// the agent's to remove.
func removeCNISocket(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	err := os.Remove(filepath.Dir(path))
	if err == nil || errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) || errors.Is(err, syscall.EBUSY) {
		return nil
	}
	return err
}

// listenCNI listens on the plugin's socket, replacing a previous agent's.
// Closing it leaves the path alone: while the DaemonSet surges, the old
// agent stops after the new one has taken the path over, and unlinking it
// then would leave the plugin with no agent to ask.
func listenCNI(path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}
