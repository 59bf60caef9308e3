package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/config/kubesource"
	"github.com/causeway-mesh/causeway/pkg/kubecontrollers"
	"github.com/causeway-mesh/causeway/pkg/logging"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/authn"
	"github.com/causeway-mesh/causeway/pkg/trust/authn/tokenreview"
	"github.com/causeway-mesh/causeway/pkg/trust/caserver"
	"github.com/causeway-mesh/causeway/pkg/trust/kubeca"
	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
	"github.com/causeway-mesh/causeway/pkg/xds/xdsserver"
)

// controlPlane wires the configuration source, the model, the xDS server
// and the CA together. The CA's node authorization reads the same model
// the xDS server is fed from, so both always agree on which workload runs
// where.
type controlPlane struct {
	opts      options
	log       *logging.Logger
	authority *trust.Authority
	bundle    *trust.Bundle
	identity  trust.Identity
	auth      authn.Authenticator
	model     *config.Model
	registry  *prometheus.Registry
	source    source
	// workloads answers the CA's node authorization: the model's snapshot
	// in local mode, the pod informer's index in Kubernetes.
	workloads trust.WorkloadIndex
	// kube: the webhook, deployer and status writer (Kubernetes only).
	kube *kubecontrollers.Controllers
	// policySets are the connection policy sets ConnectionPolicies name.
	policySets *policySets
	// pushMu orders pushes: a new configuration and a new policy revision
	// each push the model's snapshot with the sets' content.
	pushMu    sync.Mutex
	xdsServer *xdsserver.Server

	rejected   prometheus.Counter
	refused    *prometheus.GaugeVec
	loads      prometheus.Counter
	lastGood   prometheus.Gauge
	serveCert  atomic.Pointer[tls.Certificate]
	ready      atomic.Bool
	grpcAddr   atomic.Value // string, once listening
	httpAddrs  sync.Map     // flag address -> bound address
	listenedCh chan struct{}
	// refusedKinds: kinds the refused gauge has reported (the source's
	// goroutine alone touches it).
	refusedKinds map[string]bool
}

func newControlPlane(o options, log *logging.Logger) (*controlPlane, error) {
	authority, err := loadCA(o)
	if err != nil {
		return nil, err
	}
	bundle, err := trust.NewBundle(o.trustDomain, authority.Roots())
	if err != nil {
		return nil, err
	}
	id, err := trust.ControlPlaneIdentity(o.trustDomain)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cp := &controlPlane{
		opts: o, log: log, authority: authority, bundle: bundle, identity: id,
		model: &config.Model{}, registry: reg, listenedCh: make(chan struct{}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "causeway_config_rejected_total", Help: "Configuration changes rejected as a whole (the last good configuration stayed in force).",
		}),
		refused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "causeway_config_refused_objects", Help: "Objects of the configuration in force that the mesh refuses (each fails closed; /debug/config lists why), by kind.",
		}, []string{"kind"}),
		loads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "causeway_config_loads_total", Help: "Good configurations loaded.",
		}),
		lastGood: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "causeway_config_last_good_timestamp_seconds", Help: "When the configuration in force was loaded.",
		}),
	}
	reg.MustRegister(cp.rejected, cp.refused, cp.loads, cp.lastGood)
	if cp.policySets, err = newPolicySets(o.connectionPolicies, log.Logger, cp.policyChanged); err != nil {
		return nil, err
	}
	if err := cp.setupSource(); err != nil {
		return nil, err
	}
	if err := cp.renewServingCert(); err != nil {
		return nil, err
	}
	return cp, nil
}

// source is where the configuration comes from (config.DirSource or
// kubesource.Source).
type source interface {
	Run(ctx context.Context, emit func(*config.Snapshot)) error
}

// setupSource builds the configuration source and the authenticators that
// go with it: in Kubernetes, service-account tokens checked by TokenReview
// against the pods the source watches; in local mode, a tokens file. Mesh
// client certificates authenticate in both.
func (cp *controlPlane) setupSource() error {
	o := cp.opts
	translate := config.Options{TrustDomain: o.trustDomain, ClusterDomain: o.clusterDomain}
	onRejected := func(error) { cp.rejected.Inc() }
	chain := authn.Chain{}
	if o.kubernetes {
		restCfg, err := kubeRESTConfig(o.kubeconfig)
		if err != nil {
			return err
		}
		ks, err := kubesource.NewForConfig(restCfg, kubesource.Options{
			Translate: translate, Logger: cp.log.Named("config"), Debounce: o.debounce, OnRejected: onRejected,
		})
		if err != nil {
			return err
		}
		kube, err := kubernetes.NewForConfig(restCfg)
		if err != nil {
			return err
		}
		tr, err := tokenreview.New(tokenreview.Options{
			Reviews: kube.AuthenticationV1().TokenReviews(), Audiences: o.tokenAudiences, TrustDomain: o.trustDomain, Pods: ks,
		})
		if err != nil {
			return err
		}
		chain = append(chain, tr)
		cp.source, cp.workloads = ks, ks
		if cp.kube, err = o.kube.controllers(restCfg, cp); err != nil {
			return err
		}
	} else {
		if o.tokensFile != "" {
			tf, err := authn.NewTokenFile(o.tokensFile, o.trustDomain, cp.log.Named("tokens"))
			if err != nil {
				return err
			}
			chain = append(chain, tf)
		}
		cp.source = config.NewDirSource(o.configDir, config.DirOptions{
			Translate: translate, Logger: cp.log.Named("config"), Debounce: o.debounce, Rescan: o.rescan, OnRejected: onRejected,
		})
		cp.workloads = cp.model
	}
	peerCert, err := authn.NewPeerCertificate(o.trustDomain)
	if err != nil {
		return err
	}
	cp.auth = append(chain, peerCert)
	return nil
}

// loadCA returns the mesh CA: from --ca-dir, or from the --ca-secret Secret
// (created on first start), whose roots every replica then publishes for
// the node proxies, which mount them.
func loadCA(o options) (*trust.Authority, error) {
	if o.caSecret == "" {
		return trust.LoadOrCreateCA(o.caDir, o.trustDomain, o.certTTL)
	}
	restCfg, err := kubeRESTConfig(o.kubeconfig)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := kubeca.LoadOrCreate(ctx, client, o.kube.namespace, o.caSecret, o.trustDomain, o.certTTL)
	if err != nil {
		return nil, err
	}
	if o.rootsConfigMap != "" {
		if err := kubeca.PublishRoots(ctx, client, o.kube.namespace, o.rootsConfigMap, a.RootsPEM()); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// kubeRESTConfig loads a kubeconfig file, or the in-cluster configuration.
func kubeRESTConfig(path string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if path != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", path)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client configuration: %w", err)
	}
	// Informer lists at start and a TokenReview per new caller token: the
	// client's default 5 requests/s would queue a node's worth of callers.
	cfg.QPS, cfg.Burst = 100, 200
	cfg.UserAgent = "causeway-controlplane"
	return cfg, nil
}

// renewServingCert issues the control plane's own certificate from its CA.
func (cp *controlPlane) renewServingCert() error {
	names, err := servingNames(cp.opts)
	if err != nil {
		return fmt.Errorf("serving certificate: %w", err)
	}
	cert, err := cp.authority.IssueServer(cp.identity, names)
	if err != nil {
		return fmt.Errorf("serving certificate: %w", err)
	}
	cp.serveCert.Store(cert)
	cp.log.Info("serving certificate issued", zap.Stringer("identity", cp.identity), zap.Strings("dns_names", cert.Leaf.DNSNames),
		zap.Any("ip_addresses", cert.Leaf.IPAddresses),
		zap.Time("not_after", cert.Leaf.NotAfter), zap.String("serial", cert.Leaf.SerialNumber.Text(16)))
	return nil
}

// servingNames are the certificate's DNS and IP SANs: the configured DNS
// names and the addresses clients reach --listen by (every address of the
// host when it listens on all of them).
func servingNames(o options) (trust.ServerNames, error) {
	names := trust.ServerNames{DNS: o.dnsNames}
	host, _, err := net.SplitHostPort(o.listen)
	if err != nil {
		return names, fmt.Errorf("--listen %q: %w", o.listen, err)
	}
	ip := net.ParseIP(host)
	switch {
	case host != "" && ip == nil:
		names.DNS = append(names.DNS, host)
	case ip != nil && !ip.IsUnspecified():
		names.IPs = []net.IP{ip}
	default:
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			return names, fmt.Errorf("addresses of the host: %w", err)
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLinkLocalUnicast() {
				names.IPs = append(names.IPs, n.IP)
			}
		}
	}
	return names, nil
}

// rotateServingCert renews the serving certificate at about half its
// lifetime, retrying every minute on failure, until ctx ends.
func (cp *controlPlane) rotateServingCert(ctx context.Context) {
	for {
		leaf := cp.serveCert.Load().Leaf
		life := leaf.NotAfter.Sub(leaf.NotBefore)
		wait := time.Until(leaf.NotBefore.Add(life/2)) + rand.N(life/10+1)
		if wait < time.Second {
			wait = time.Second
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		for cp.renewServingCert() != nil {
			cp.log.Error("serving certificate renewal failed; retrying in a minute")
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Minute):
			}
		}
	}
}

// run serves until ctx ends, then shuts down gracefully.
func (cp *controlPlane) run(ctx context.Context) error {
	log := cp.log.Logger
	srvCtx, cancelStreams := context.WithCancel(context.Background())
	defer cancelStreams()

	xdsServer, err := xdsserver.NewServer(srvCtx, xdsserver.ServerOptions{Authenticator: cp.auth, TrustedNodeAccounts: cp.opts.trustedNodeAccounts, Logger: log, Registerer: cp.registry})
	if err != nil {
		return err
	}
	ca, err := caserver.New(caserver.Options{
		Authority:           cp.authority,
		TrustDomain:         cp.opts.trustDomain,
		Authenticator:       cp.auth,
		TrustedNodeAccounts: cp.opts.trustedNodeAccounts,
		Workloads:           cp.workloads,
		WorkloadWait:        cp.opts.workloadWait,
		DefaultTTL:          cp.opts.certTTL,
		Logger:              log,
		Registerer:          cp.registry,
	})
	if err != nil {
		return err
	}
	tlsConf := trust.ServerConfig(cp.bundle, func(net.Addr) (*tls.Certificate, error) { return cp.serveCert.Load(), nil }, trust.VerifyIfGiven)
	g := grpc.NewServer(append(xdsserver.GRPCServerOptions(), grpc.Creds(credentials.NewTLS(tlsConf)))...)
	xdsServer.Register(g)
	ca.Register(g)

	ln, err := net.Listen("tcp", cp.opts.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cp.opts.listen, err)
	}
	cp.grpcAddr.Store(ln.Addr().String())

	httpServers, err := cp.startHTTP(xdsServer)
	if err != nil {
		ln.Close()
		return err
	}
	close(cp.listenedCh)

	var wg sync.WaitGroup
	defer wg.Wait()
	bgCtx, stopBG := context.WithCancel(ctx)
	defer stopBG()
	cp.pushMu.Lock()
	cp.xdsServer = xdsServer
	cp.pushMu.Unlock()
	cp.policySets.loadAll(bgCtx, 30*time.Second)
	wg.Go(func() { cp.policySets.run(bgCtx) })
	wg.Add(2)
	go func() {
		defer wg.Done()
		cp.rotateServingCert(bgCtx)
	}()
	srcErr := make(chan error, 1)
	go func() {
		defer wg.Done()
		srcErr <- cp.source.Run(bgCtx, func(s *config.Snapshot) {
			// The CA's index first: a node proxy that learns of a workload
			// over xDS may ask for its certificate at once.
			cp.model.Set(s)
			if err := cp.push(s, s.ChangedAt); err != nil {
				log.Error("xDS update failed", zap.Error(err))
				return
			}
			cp.loads.Inc()
			cp.lastGood.SetToCurrentTime()
			cp.countRefused(s.Rejected)
			if !cp.ready.Swap(true) {
				log.Info("first configuration served; ready")
			}
		})
	}()

	kubeErr := make(chan error, 1)
	if cp.kube != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			kubeErr <- cp.kube.Run(bgCtx)
		}()
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- g.Serve(ln) }()
	srcName := "dir=" + cp.opts.configDir
	if cp.opts.kubernetes {
		srcName = "kubernetes"
	}
	log.Info("control plane serving xDS and CA",
		zap.String("listen", ln.Addr().String()), zap.Stringer("identity", cp.identity),
		zap.String("source", srcName), zap.String("trust_domain", cp.opts.trustDomain))

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err := <-serveErr:
		runErr = fmt.Errorf("gRPC server: %w", err)
	case err := <-srcErr:
		if err == nil {
			err = errors.New("stopped")
		}
		runErr = fmt.Errorf("configuration source: %w", err)
	case err := <-kubeErr:
		if err == nil {
			err = errors.New("stopped")
		}
		runErr = fmt.Errorf("kubernetes controllers: %w", err)
	}
	stopBG()
	cp.ready.Store(false)
	// xDS streams never end by themselves: end them, then let unary calls
	// (certificate requests) in flight finish within the grace period.
	cancelStreams()
	stopped := make(chan struct{})
	go func() {
		g.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(cp.opts.shutdownGrace):
		log.Warn("grace period over; closing remaining connections")
		g.Stop()
		<-stopped
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), cp.opts.shutdownGrace)
	defer cancel()
	for _, h := range httpServers {
		_ = h.Shutdown(shutCtx)
	}
	return runErr
}

// startHTTP serves readiness, metrics and debug endpoints; the two flag
// addresses may be the same.
func (cp *controlPlane) startHTTP(xdsServer *xdsserver.Server) ([]*http.Server, error) {
	muxes := map[string]*http.ServeMux{}
	mux := func(addr string) *http.ServeMux {
		if muxes[addr] == nil {
			muxes[addr] = http.NewServeMux()
		}
		return muxes[addr]
	}
	if a := cp.opts.readinessAddr; a != "" {
		mux(a).HandleFunc("/healthz/ready", func(w http.ResponseWriter, _ *http.Request) {
			if !cp.ready.Load() {
				http.Error(w, "no good configuration yet", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ready")
		})
		// Liveness: a replica that may lead without holding its Lease is restarted.
		mux(a).HandleFunc("/healthz/live", func(w http.ResponseWriter, _ *http.Request) {
			if cp.kube != nil {
				if err := cp.kube.Healthy(); err != nil {
					http.Error(w, err.Error(), http.StatusServiceUnavailable)
					return
				}
			}
			fmt.Fprintln(w, "alive")
		})
	}
	if a := cp.opts.metricsAddr; a != "" {
		m := mux(a)
		m.Handle("/metrics", promhttp.HandlerFor(cp.registry, promhttp.HandlerOpts{}))
	}
	// The admin endpoints change the log level and show the whole
	// configuration and every client: localhost only (the chart leaves the
	// default), reached by port-forward.
	if a := cp.opts.adminAddr; a != "" {
		m := mux(a)
		m.Handle("/logging", cp.log.Handler())
		m.HandleFunc("GET /debug/config", cp.serveConfigDump)
		m.HandleFunc("GET /debug/syncz", func(w http.ResponseWriter, _ *http.Request) {
			clients := xdsServer.Clients()
			sort.Slice(clients, func(i, j int) bool { return clients[i].Since.Before(clients[j].Since) })
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(xds.Syncz{Version: xdsServer.Version(), Clients: clients})
		})
	}
	var servers []*http.Server
	for addr, m := range muxes {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			for _, s := range servers {
				_ = s.Close()
			}
			return nil, fmt.Errorf("listen on %s: %w", addr, err)
		}
		cp.httpAddrs.Store(addr, ln.Addr().String())
		s := &http.Server{Handler: m, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second}
		servers = append(servers, s)
		go func() {
			if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				cp.log.Error("HTTP server failed", zap.String("addr", addr), zap.Error(err))
			}
		}()
	}
	return servers, nil
}

// countRefused sets the refused-objects gauge; a kind no longer refused
// reads 0 rather than vanishing.
func (cp *controlPlane) countRefused(rejected []config.Problem) {
	by := config.RejectedByKind(rejected)
	if cp.refusedKinds == nil {
		cp.refusedKinds = map[string]bool{}
	}
	for kind := range cp.refusedKinds {
		if _, ok := by[kind]; !ok {
			cp.refused.WithLabelValues(kind).Set(0)
		}
	}
	for kind, n := range by {
		cp.refusedKinds[kind] = true
		cp.refused.WithLabelValues(kind).Set(float64(n))
	}
}

// refusal is one entry of /debug/config's "rejected" list.
type refusal struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Origin    string `json:"origin"`
	Reason    string `json:"reason"`
}

// serveConfigDump writes the configuration in force as JSON: resources by
// type and name, as served over xDS, and under "rejected" the objects the
// mesh refuses, with why.
func (cp *controlPlane) serveConfigDump(w http.ResponseWriter, _ *http.Request) {
	s := cp.model.Current()
	if s == nil {
		http.Error(w, "no good configuration yet", http.StatusServiceUnavailable)
		return
	}
	out := map[string]any{}
	rejected := make([]refusal, 0, len(s.Rejected))
	for _, p := range s.Rejected {
		rejected = append(rejected, refusal{Kind: p.Kind(), Namespace: p.Namespace(), Name: p.Name(), Origin: p.Origin, Reason: p.Reason})
	}
	out["rejected"] = rejected
	for typeURL, res := range cp.resources(s) {
		m := make(map[string]json.RawMessage, len(res))
		for name, msg := range res {
			b, err := protojson.Marshal(meshv1.Redacted(msg)) // an ingress Gateway's keys stay in memory
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			m[name] = b
		}
		out[typeURL] = m
	}
	if st := cp.policySets.status(); len(st) > 0 {
		out["connection_policy_sets"] = st
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
}

// resources is what the xDS server serves for s: its resources, with each
// ConnectionPolicy carrying its set's active files.
func (cp *controlPlane) resources(s *config.Snapshot) map[string]map[string]proto.Message {
	res := s.Resources()
	policies := make(map[string]proto.Message, len(s.ConnectionPolicies))
	for name, p := range s.ConnectionPolicies {
		policies[name] = cp.policySets.attach(p)
	}
	res[meshv1.ConnectionPolicyTypeURL] = policies
	return res
}

// push serves s with the policy sets' current content; changedAt is when
// the change it carries was made (zero: now).
func (cp *controlPlane) push(s *config.Snapshot, changedAt time.Time) error {
	cp.pushMu.Lock()
	defer cp.pushMu.Unlock()
	return cp.xdsServer.UpdateFrom(cp.resources(s), changedAt)
}

// policyChanged pushes the configuration in force again when a policy set
// activates a new revision (before the first configuration there is
// nothing to push: that push will carry it).
func (cp *controlPlane) policyChanged() {
	if cp.kube != nil {
		cp.kube.PolicySetsChanged()
	}
	s := cp.model.Current()
	cp.pushMu.Lock()
	ready := cp.xdsServer != nil
	cp.pushMu.Unlock()
	if s == nil || !ready {
		return
	}
	if err := cp.push(s, time.Time{}); err != nil {
		cp.log.Logger.Error("xDS update for a new connection policy revision failed", zap.Error(err))
	}
}
