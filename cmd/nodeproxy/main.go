// Command nodeproxy is Causeway's per-node proxy (DaemonSet): it captures
// workload traffic, carries it over HBONE with the source workload's
// certificate, terminates HBONE for its node's pods and enforces
// waypoint-only ingress (docs/design.md §5).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/bootstrap"
	"github.com/causeway-mesh/causeway/pkg/capture"
	"github.com/causeway-mesh/causeway/pkg/capture/handoff"
	"github.com/causeway-mesh/causeway/pkg/capture/inpod"
	"github.com/causeway-mesh/causeway/pkg/hbone"
	"github.com/causeway-mesh/causeway/pkg/nodeproxy"
	"github.com/causeway-mesh/causeway/pkg/policy"
	"github.com/causeway-mesh/causeway/pkg/version"
	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

func main() {
	var common bootstrap.Flags
	fs := flag.NewFlagSet("nodeproxy", flag.ExitOnError)
	common.Register(fs)
	node := fs.String("node", os.Getenv("NODE_NAME"), "name of this node")
	socks := fs.String("socks5", "127.0.0.1:15080", "SOCKS5 outbound capture address (local mode; empty: none)")
	handoffSocket := fs.String("inpod-handoff", "", "in-pod mode: the node agent's handoff socket (e.g. /var/run/causeway/handoff.sock); pods are served inside their network namespaces as the agent hands them over")
	hbonePort := fs.Uint("hbone-port", 15008, "HBONE port on pod IPs")
	passthrough := fs.Bool("passthrough", false, "send traffic to destinations unknown to the mesh (and from non-mesh sources) as plain TCP instead of refusing it")
	plaintext := fs.Bool("allow-plaintext", true, "deliver plaintext from outside the mesh to pods without a waypoint")
	drain := fs.Duration("drain", 10*time.Second, "how long tunnels may drain on shutdown")
	idle := fs.Duration("idle-timeout", time.Hour, "close relayed connections idle for this long (0: never)")
	poolIdle := fs.Duration("pool-idle-timeout", 30*time.Second, "close pooled HBONE connections that carried no tunnel for this long, so what a burst opened does not stay (0: never)")
	version.RegisterFlag(fs, "nodeproxy")
	fs.Parse(os.Args[1:])
	if *node == "" {
		bootstrap.Fatal("nodeproxy", fmt.Errorf("--node is required"))
	}
	if *hbonePort == 0 || *hbonePort > 65535 {
		bootstrap.Fatal("nodeproxy", fmt.Errorf("--hbone-port %d out of range", *hbonePort))
	}
	if *idle == 0 {
		*idle = -1 // never
	}
	if *poolIdle == 0 {
		*poolIdle = -1 // never
	}
	if err := run(&common, *node, *socks, *handoffSocket, uint16(*hbonePort), *passthrough, *plaintext, *drain, *idle, *poolIdle); err != nil {
		bootstrap.Fatal("nodeproxy", err)
	}
}

func run(common *bootstrap.Flags, node, socks, handoffSocket string, hbonePort uint16, passthrough, plaintext bool, drain, idle, poolIdle time.Duration) error {
	env, err := common.Setup()
	if err != nil {
		return err
	}
	nodeField := zap.String("node", node)
	log := env.Log.Logger.With(nodeField)
	defer env.Log.Sync()
	ctx, stop := bootstrap.SignalContext()
	defer stop()

	certs, closeCA, err := common.Certificates(env, log)
	if err != nil {
		return err
	}
	defer closeCA()
	// Connection policies' decisions, in the waypoint's format; which are
	// written is each policy set's decisionLog setting (default: denials).
	decisions, err := policy.NewDecisionLogger(env.Log.Buffered("decisions", nodeField), policy.DecisionLogOptions{Mode: policy.LogDenials, Registerer: env.Metrics})
	if err != nil {
		return err
	}
	opts := nodeproxy.Options{
		Node: node, Bundle: env.Bundle, Certificates: certs, Logger: log, AccessLog: env.Log.Buffered("access", nodeField), Registry: env.Metrics,
		HBONEPort: hbonePort, AllowPassthrough: passthrough, AllowPlaintext: plaintext, IdleTimeout: idle, PolicyDecisionLog: decisions,
		Pool: hbone.PoolOptions{IdleTimeout: poolIdle},
	}
	var pods *inpod.Manager
	if handoffSocket != "" {
		if err := inpod.Verify(); err != nil {
			return err
		}
		opts.InPod = true
		opts.Dial = func(ctx context.Context, local netip.Addr, remote netip.AddrPort) (net.Conn, error) {
			return pods.Dial(ctx, local, remote)
		}
	}
	proxy, err := nodeproxy.New(opts)
	if err != nil {
		return err
	}
	var parts []func(context.Context) error
	// Closed once the proxy holds the control plane's whole first
	// configuration.
	configured := make(chan struct{})
	var configuredOnce sync.Once
	var podsTaken atomic.Bool // the node agent's first snapshot served
	if handoffSocket != "" {
		pods = inpod.NewManager(proxy, inpod.Options{HBONEPort: hbonePort, Logger: log.Named("inpod")})
		defer pods.Close()
		hc := &handoff.Client{Path: handoffSocket, State: handoff.NewState(pods), Logger: log.Named("handoff"),
			OnSnapshot: func() { podsTaken.Store(true) }}
		// Pods are taken only then: a pod's listeners take connections
		// the moment they open (beside the old node proxy's, during an
		// upgrade), and with part of the configuration a connection to a
		// Service not yet known is refused, a reset the old node proxy
		// would not have made.
		parts = append(parts, func(ctx context.Context) error {
			select {
			case <-configured:
			case <-ctx.Done():
				return nil
			}
			log.Info("configured: taking pods from the node agent")
			return hc.Run(ctx)
		})
	}
	xc, err := xds.NewClient(xds.ClientOptions{
		Address: common.XDSAddress, Bundle: env.Bundle, ServerIdentity: env.ControlPlaneIdentity, Token: env.Token,
		NodeID: xds.NodeProxyID(node), Logger: log,
		Subscriptions: []xds.Subscription{{TypeURL: meshv1.WorkloadTypeURL}, {TypeURL: meshv1.ServiceTypeURL}, {TypeURL: meshv1.WaypointTypeURL},
			{TypeURL: meshv1.ConnectionPolicyTypeURL}},
		OnChange: func(s *xds.State, _ []string) {
			// Policies first: a workload that arrives with its policy is
			// never served without it.
			proxy.UpdateConnectionPolicies(ctx, slices.Collect(maps.Values(s.ConnectionPolicies)))
			proxy.Update(nodeproxy.NewRegistry(node, slices.Collect(maps.Values(s.Workloads)), slices.Collect(maps.Values(s.Services)), slices.Collect(maps.Values(s.Waypoints))))
			if s.Synced() {
				configuredOnce.Do(func() { close(configured) })
			}
		},
	})
	if err != nil {
		return err
	}
	ready := func() error {
		if !xc.Ready() {
			return fmt.Errorf("waiting for the first configuration from %s", common.XDSAddress)
		}
		// Ready lets an upgrade stop the old node proxy: the pods must be
		// served here first.
		if handoffSocket != "" && !podsTaken.Load() {
			return errors.New("waiting for the node agent's pods")
		}
		return proxy.Ready()
	}
	waitOps, err := common.ServeOps(ctx, env, bootstrap.Ops{Dump: proxy.Dump, Ready: func() (string, error) { return "", ready() }})
	if err != nil {
		return err
	}
	if socks != "" {
		sl, err := net.Listen("tcp", socks)
		if err != nil {
			return fmt.Errorf("SOCKS5 listener: %w", err)
		}
		s5 := &capture.SOCKS5{Handler: proxy, Logger: log.Named("socks5")}
		parts = append(parts, func(ctx context.Context) error { return s5.Serve(ctx, sl) })
	}
	runProxy := func(ctx context.Context) error { return proxy.Run(ctx, drain) }
	if pods != nil {
		// Pods' connections drain first, while the proxy still carries
		// them (a new node proxy takes new ones meanwhile); then it stops.
		runProxy = func(ctx context.Context) error {
			pctx, stopProxy := context.WithCancel(context.Background())
			defer stopProxy()
			go func() {
				<-ctx.Done()
				dctx, cancel := context.WithTimeout(context.Background(), drain)
				pods.Shutdown(dctx)
				cancel()
				stopProxy()
			}()
			return proxy.Run(pctx, drain)
		}
	}
	parts = append(parts, certs.Run, xc.Run, runProxy, func(ctx context.Context) error { decisions.Run(ctx); return nil })

	errc := make(chan error, len(parts))
	for _, part := range parts {
		go func() { errc <- part(ctx) }()
	}
	log.Info("node proxy started", zap.String("socks5", socks), zap.String("inpod_handoff", handoffSocket), zap.String("xds", common.XDSAddress))
	var firstErr error
	for range parts {
		if err := <-errc; err != nil && firstErr == nil && ctx.Err() == nil {
			firstErr = err
			stop() // one part failed: take the rest down
		}
	}
	waitOps()
	log.Info("node proxy stopped")
	return firstErr
}
