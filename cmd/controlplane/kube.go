package main

// Flags of the control plane's Kubernetes controllers (pkg/kubecontrollers),
// active only with --source kubernetes.

import (
	"crypto/rand"
	"flag"
	"fmt"
	"math"
	"math/big"
	"os"
	"strings"
	"time"

	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/deployer"
	"github.com/causeway-mesh/causeway/pkg/kubecontrollers"
	"github.com/causeway-mesh/causeway/pkg/leader"
)

// kubeOptions are the flags of the Kubernetes controllers.
type kubeOptions struct {
	namespace                                 string // the control plane's own (Lease, Service)
	leaseName, deployment                     string
	identity                                  string
	leaseDuration, renewDeadline, retryPeriod time.Duration
	waypointImage                             string
	waypointPullPolicy                        string
	waypointReplicas                          int
	waypointTemplate                          string
	ingressTemplate                           string
	gatewayAddresses                          config.AddressPool
	waypointXDSAddress                        string
	waypointTokenAudience                     string
	webhookListen                             string
	webhookDNSNames                           []string
	webhookConfiguration                      string
	given                                     []string // kube flags set on the command line
}

var kubeFlagNames = []string{"leader-lease", "leader-lease-duration", "leader-renew-deadline", "leader-retry-period",
	"waypoint-image", "waypoint-image-pull-policy", "waypoint-replicas", "waypoint-template", "ingress-template", "gateway-address-cidrs", "waypoint-xds-address", "waypoint-token-audience",
	"webhook-listen", "webhook-dns-names", "webhook-configuration"}

func (k *kubeOptions) register(fs *flag.FlagSet) {
	k.namespace = envOr("POD_NAMESPACE", "causeway-system")
	fs.StringVar(&k.leaseName, "leader-lease", "causeway-controlplane", "with --source kubernetes: name of the Lease (in the control plane's namespace, $POD_NAMESPACE) whose holder runs the waypoint deployer and the status writer")
	fs.StringVar(&k.deployment, "deployment", "causeway-controlplane", "with --source kubernetes: the control plane's own Deployment (in $POD_NAMESPACE): seen being deleted (uninstall), the replica leads no more and leaves the Lease to expire, as its permissions go next; empty: not watched")
	fs.DurationVar(&k.leaseDuration, "leader-lease-duration", leader.DefaultLeaseDuration, "with --source kubernetes: how long the other replicas wait after the leader's last renewal before taking over")
	fs.DurationVar(&k.renewDeadline, "leader-renew-deadline", leader.DefaultRenewDeadline, "with --source kubernetes: how long the leader retries a renewal before it stops leading (shorter than the lease duration)")
	fs.DurationVar(&k.retryPeriod, "leader-retry-period", leader.DefaultRetryPeriod, "with --source kubernetes: time between attempts to take or renew the Lease")
	fs.StringVar(&k.waypointImage, "waypoint-image", "causeway/waypoint:latest", "with --source kubernetes: image of the waypoints the deployer runs")
	fs.StringVar(&k.waypointPullPolicy, "waypoint-image-pull-policy", "IfNotPresent", "with --source kubernetes: pull policy of the waypoints' image (Always, IfNotPresent or Never)")
	fs.IntVar(&k.waypointReplicas, "waypoint-replicas", 2, "with --source kubernetes: replicas of each waypoint Deployment")
	fs.StringVar(&k.waypointTemplate, "waypoint-template", "", "with --source kubernetes: file of the waypoint template (Go text/template of YAML documents; re-read on change); empty: the built-in one")
	fs.StringVar(&k.ingressTemplate, "ingress-template", "", "with --source kubernetes: file of the template of ingress Gateways (class causeway; same form as --waypoint-template); empty: the built-in one")
	fs.Func("gateway-address-cidrs", "with --source kubernetes: comma-separated CIDRs the static addresses of ingress Gateways (spec.addresses IPAddress values, held as their Services' externalIPs) may come from; empty: none, and a Gateway naming an address is not accepted", func(s string) (err error) {
		k.gatewayAddresses, err = config.ParseAddressPool(s)
		return err
	})
	fs.StringVar(&k.waypointXDSAddress, "waypoint-xds-address", "causeway-controlplane."+k.namespace+".svc:15012", "with --source kubernetes: the control plane's address as waypoints dial it")
	fs.StringVar(&k.waypointTokenAudience, "waypoint-token-audience", "causeway-ca", "with --source kubernetes: audience of the projected token waypoints present")
	fs.StringVar(&k.webhookListen, "webhook-listen", ":15017", "with --source kubernetes: address of the validating admission webhook (HTTPS, certificate from the mesh CA); empty: off")
	fs.Func("webhook-dns-names", "with --source kubernetes: comma-separated DNS names in the webhook's certificate (default causeway-controlplane.$POD_NAMESPACE.svc)", func(s string) error {
		k.webhookDNSNames = nil
		for _, n := range strings.Split(s, ",") {
			if n = strings.TrimSpace(n); n != "" {
				k.webhookDNSNames = append(k.webhookDNSNames, n)
			}
		}
		return nil
	})
	fs.StringVar(&k.webhookConfiguration, "webhook-configuration", "causeway-validation", "with --source kubernetes: ValidatingWebhookConfiguration whose CA bundle the leader keeps equal to the mesh roots; empty: left alone")
}

// check validates the flags; they may be given only with the Kubernetes source.
func (k *kubeOptions) check(fs *flag.FlagSet, kubeSource bool) error {
	fs.Visit(func(f *flag.Flag) {
		for _, n := range kubeFlagNames {
			if f.Name == n {
				k.given = append(k.given, "--"+n)
			}
		}
	})
	if !kubeSource {
		if len(k.given) > 0 {
			return fmt.Errorf("%s: only with --source kubernetes", strings.Join(k.given, ", "))
		}
		return nil
	}
	if len(k.webhookDNSNames) == 0 {
		k.webhookDNSNames = []string{"causeway-controlplane." + k.namespace + ".svc"}
	}
	if k.identity == "" {
		host, _ := os.Hostname()
		k.identity = envOr("POD_NAME", host) + "_" + randomSuffix()
	}
	switch k.waypointPullPolicy {
	case "Always", "IfNotPresent", "Never":
	default:
		return fmt.Errorf("--waypoint-image-pull-policy %q: want Always, IfNotPresent or Never", k.waypointPullPolicy)
	}
	if k.waypointReplicas < 1 || k.waypointReplicas > math.MaxInt32 {
		return fmt.Errorf("--waypoint-replicas %d: want at least 1", k.waypointReplicas)
	}
	for name, file := range map[string]string{"--waypoint-template": k.waypointTemplate, "--ingress-template": k.ingressTemplate} {
		if file == "" {
			continue
		}
		if _, err := deployer.LoadTemplate(file); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	_, err := leader.New(k.leaderOptions(&kubernetes.Clientset{}, zap.NewNop())) // checks the timings
	return err
}

func (k *kubeOptions) leaderOptions(cs kubernetes.Interface, log *zap.Logger) leader.Options {
	return leader.Options{Client: cs, Namespace: k.namespace, Name: k.leaseName, Identity: k.identity,
		LeaseDuration: k.leaseDuration, RenewDeadline: k.renewDeadline, RetryPeriod: k.retryPeriod, Logger: log}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func randomSuffix() string {
	n, err := rand.Int(rand.Reader, big.NewInt(1<<40))
	if err != nil {
		return "0"
	}
	return n.Text(36)
}

// controllers builds the Kubernetes controllers for this control plane.
func (k *kubeOptions) controllers(cfg *rest.Config, cp *controlPlane) (*kubecontrollers.Controllers, error) {
	return kubecontrollers.New(kubecontrollers.Options{
		Config: cfg, Authority: cp.authority, Identity: cp.identity,
		Translation: config.Options{TrustDomain: cp.opts.trustDomain, ClusterDomain: cp.opts.clusterDomain},
		Election:    k.leaderOptions(nil, nil), Deployment: k.deployment,
		Waypoint: deployer.Values{Image: k.waypointImage, ImagePullPolicy: k.waypointPullPolicy, Replicas: int32(k.waypointReplicas), XDSAddress: k.waypointXDSAddress,
			TokenAudience: k.waypointTokenAudience},
		WaypointTemplate: k.waypointTemplate, IngressTemplate: k.ingressTemplate, GatewayAddresses: k.gatewayAddresses, WebhookListen: k.webhookListen, WebhookDNSNames: k.webhookDNSNames,
		WebhookConfiguration: k.webhookConfiguration, PolicySet: cp.policySets.state, Logger: cp.log.Logger, Registerer: cp.registry,
	})
}
