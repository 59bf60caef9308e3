// Command controlplane watches the mesh configuration and serves it over
// delta xDS, next to the mesh CA, on one gRPC port over TLS (docs/design.md §1).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/causeway-mesh/causeway/pkg/logging"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/authn/tokenreview"
	"github.com/causeway-mesh/causeway/pkg/version"
)

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		os.Exit(2)
	}
	log, err := logging.New(logging.Options{Format: cfg.logFormat, Level: cfg.logLevel})
	if err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		os.Exit(2)
	}
	defer func() { _ = log.Sync() }()

	log.Info("controlplane starting", zap.String("version", version.Version()), zap.String("revision", version.Revision()))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	cp, err := newControlPlane(cfg, log)
	if err != nil {
		log.Error("control plane cannot start: " + err.Error())
		os.Exit(1)
	}
	if err := cp.run(ctx); err != nil {
		log.Error("control plane failed: " + err.Error())
		os.Exit(1)
	}
}

// serviceName is the control plane's Service in Kubernetes.
const serviceName = "causeway-controlplane"

// serviceNames are the names a Service is reached by from pods of any
// namespace (the resolver's search path makes every form work).
func serviceNames(name, namespace, clusterDomain string) []string {
	return []string{name, name + "." + namespace, name + "." + namespace + ".svc", name + "." + namespace + ".svc." + clusterDomain}
}

// options are the control plane's flags.
type options struct {
	configDir           string // --source dir=PATH (or --config-dir)
	kubernetes          bool   // --source kubernetes
	kubeconfig          string
	tokenAudiences      []string
	listen              string
	caDir               string
	caSecret            string // with --source kubernetes: the CA kept in this Secret
	rootsConfigMap      string // where the roots are published for node proxies
	trustDomain         string
	clusterDomain       string
	dnsNames            []string // DNS SANs of the serving certificate
	tokensFile          string
	trustedNodeAccounts []trust.Identity
	readinessAddr       string
	metricsAddr         string
	adminAddr           string
	logFormat           string
	logLevel            string
	certTTL             time.Duration
	workloadWait        time.Duration
	debounce            time.Duration
	rescan              time.Duration
	shutdownGrace       time.Duration
	kube                kubeOptions // the Kubernetes controllers' (kube.go)
	connectionPolicies  []policySetFlag
}

func parseFlags(args []string) (options, error) {
	var o options
	var trusted, dnsNames, source, audiences string
	fs := flag.NewFlagSet("controlplane", flag.ContinueOnError)
	fs.StringVar(&source, "source", "", "configuration source: dir=PATH (a directory of Kubernetes YAML, watched for changes) or kubernetes (the cluster's API server, by informers; callers authenticate with service-account tokens checked by TokenReview)")
	fs.StringVar(&o.configDir, "config-dir", "", "same as --source dir=PATH: a directory of Kubernetes YAML (Namespace, Pod, Service, EndpointSlice, Gateway, HTTPRoute, GRPCRoute, ReferenceGrant)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "with --source kubernetes: kubeconfig file (default: the in-cluster configuration)")
	fs.StringVar(&audiences, "token-audiences", tokenreview.DefaultAudience, "with --source kubernetes: comma-separated audiences a caller's service-account token must be issued for")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:15012", "address of the gRPC port serving xDS and the CA over TLS")
	fs.StringVar(&o.caDir, "ca-dir", "", "CA directory in Istio's plug-in layout (ca-cert.pem, ca-key.pem, root-cert.pem, cert-chain.pem); generated when empty (required unless --ca-secret)")
	fs.StringVar(&o.caSecret, "ca-secret", "", "with --source kubernetes: Secret in the control plane's namespace ($POD_NAMESPACE) holding the CA in the --ca-dir layout; created with a new self-signed CA when missing, never replaced")
	fs.StringVar(&o.rootsConfigMap, "roots-configmap", "causeway-root-cert", "with --ca-secret: ConfigMap in the control plane's namespace where the CA's roots (root-cert.pem) are published for node proxies")
	fs.StringVar(&o.trustDomain, "trust-domain", trust.DefaultTrustDomain, "trust domain of the mesh")
	fs.StringVar(&o.clusterDomain, "cluster-domain", "cluster.local", "DNS domain of service hostnames")
	fs.StringVar(&dnsNames, "dns-names", "", "comma-separated DNS names clients verify the serving certificate by (default: the names of Service "+
		trust.SystemNamespace+"/"+serviceName+": "+serviceName+", "+serviceName+"."+trust.SystemNamespace+", ...svc, ...svc.<cluster-domain>); the IP SANs are the --listen addresses")
	fs.StringVar(&o.tokensFile, "tokens-file", "", "bearer tokens file: <token> <namespace>/<serviceaccount> [<node>] per line (without it, only mesh client certificates authenticate)")
	fs.StringVar(&trusted, "trusted-node-accounts", "causeway-system/nodeproxy", "comma-separated accounts (<namespace>/<serviceaccount> or SPIFFE IDs) that may ask for the identities of workloads on their node")
	fs.StringVar(&o.readinessAddr, "readiness", "127.0.0.1:15014", "address serving /healthz/ready (ready after the first good configuration); empty: off")
	fs.StringVar(&o.metricsAddr, "metrics", "127.0.0.1:15014", "address serving Prometheus /metrics; empty: off (may equal --readiness)")
	fs.StringVar(&o.adminAddr, "admin", "127.0.0.1:15000", "admin address (/logging, /debug/config, /debug/syncz; meshctl reaches it by port-forward); keep it on localhost; empty: off")
	fs.StringVar(&o.logFormat, "log-format", "json", "log format: json or console")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.DurationVar(&o.certTTL, "cert-ttl", trust.DefaultCertTTL, "longest lifetime of issued certificates")
	fs.DurationVar(&o.workloadWait, "ca-workload-wait", 2*time.Second, "how long a node proxy's certificate request for a pod the configuration does not hold yet waits for it before it is refused (Kubernetes source: a pod's first request can come before its configuration)")
	fs.DurationVar(&o.debounce, "config-debounce", 100*time.Millisecond, "quiet time after a configuration change before it is read")
	fs.DurationVar(&o.rescan, "config-rescan", 10*time.Second, "period of full configuration re-reads (catches missed file events)")
	fs.DurationVar(&o.shutdownGrace, "shutdown-grace", 5*time.Second, "how long shutdown waits for calls in flight")
	fs.Func("connection-policy", "a connection policy set, repeatable: NAME=dir:PATH, NAME=git:URL[#REF[:DIR]] or NAME=bundle:SERVICE_URL#RESOURCE; compiled and tested here (the last good revision stays) and sent with the ConnectionPolicies that name it", func(v string) error {
		f, err := parsePolicySet(v)
		if err != nil {
			return err
		}
		o.connectionPolicies = append(o.connectionPolicies, f)
		return nil
	})
	o.kube.register(fs)
	version.RegisterFlag(fs, "controlplane")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch dir, isDir := strings.CutPrefix(source, "dir="); {
	case source == "":
	case o.configDir != "":
		return o, fmt.Errorf("--source and --config-dir both name a source; give one")
	case isDir && dir != "":
		o.configDir = dir
	case source == "kubernetes":
		o.kubernetes = true
	default:
		return o, fmt.Errorf("--source %q: want dir=PATH or kubernetes", source)
	}
	if o.configDir == "" && !o.kubernetes {
		return o, fmt.Errorf("a configuration source is required: --source dir=PATH (or --config-dir PATH) or --source kubernetes")
	}
	if o.kubeconfig != "" && !o.kubernetes {
		return o, fmt.Errorf("--kubeconfig is for --source kubernetes")
	}
	if o.kubernetes && o.tokensFile != "" {
		return o, fmt.Errorf("--tokens-file is for a directory source: in Kubernetes, callers present service-account tokens checked by TokenReview")
	}
	for _, a := range strings.Split(audiences, ",") {
		if a = strings.TrimSpace(a); a != "" {
			o.tokenAudiences = append(o.tokenAudiences, a)
		}
	}
	if o.kubernetes && len(o.tokenAudiences) == 0 {
		return o, fmt.Errorf("--token-audiences is empty")
	}
	if err := o.kube.check(fs, o.kubernetes); err != nil {
		return o, err
	}
	switch {
	case o.caSecret != "" && !o.kubernetes:
		return o, fmt.Errorf("--ca-secret is for --source kubernetes")
	case o.caSecret != "" && o.caDir != "":
		return o, fmt.Errorf("--ca-dir and --ca-secret both name the CA; give one")
	case o.caSecret == "" && o.caDir == "":
		return o, fmt.Errorf("--ca-dir (or, with --source kubernetes, --ca-secret) is required")
	}
	o.dnsNames = serviceNames(serviceName, trust.SystemNamespace, o.clusterDomain)
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "dns-names" {
			o.dnsNames = nil
			for _, n := range strings.Split(dnsNames, ",") {
				if n = strings.TrimSpace(n); n != "" {
					o.dnsNames = append(o.dnsNames, n)
				}
			}
		}
	})
	for _, a := range strings.Split(trusted, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		var id trust.Identity
		var err error
		if strings.HasPrefix(a, "spiffe://") {
			id, err = trust.ParseIdentity(a)
		} else if ns, sa, ok := strings.Cut(a, "/"); ok {
			id, err = trust.NewIdentity(o.trustDomain, ns, sa)
		} else {
			err = fmt.Errorf("want <namespace>/<serviceaccount> or a SPIFFE ID")
		}
		if err != nil {
			return o, fmt.Errorf("--trusted-node-accounts %q: %w", a, err)
		}
		o.trustedNodeAccounts = append(o.trustedNodeAccounts, id)
	}
	return o, nil
}
