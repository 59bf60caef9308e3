// Package clustercheck checks a Kubernetes cluster for the mesh (meshctl
// check): before an install what it needs (the API server's version, the
// nodes, the Gateway API CRDs, the caller's permission to install), after
// it every component ready and every certificate valid and renewed in
// time. It checks what the API shows; what only a node can tell (nftables,
// the CNI directories) the node agent finds out there.
package clustercheck

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/trust"
	"github.com/causeway-mesh/causeway/pkg/trust/certmanager"
)

// Check outcomes.
const (
	Pass = "PASS"
	Fail = "FAIL"
)

// What the mesh needs of a cluster.
var (
	// Bound service-account tokens name their node
	// (ServiceAccountTokenPodNodeInfo, on by default from 1.30): the CA
	// checks a node proxy asks only for its node's identities.
	minKubernetes = version.MajorMinor(1, 30)
	// nftables NAT chains in the inet family (the capture rules, written
	// in each pod's namespace) came with Linux 5.2.
	minKernel = version.MajorMinor(5, 2)
	// The images are built for these.
	nodeArchitectures = []string{"amd64", "arm64"}
	// gatewayResources are the Gateway API kinds the mesh reads, all of
	// gateway.networking.k8s.io/v1 from the standard channel v1.4 on.
	gatewayResources = []string{"gatewayclasses", "gateways", "httproutes", "grpcroutes", "referencegrants", "backendtlspolicies"}
)

// Certificates with less than this share of their lifetime left are near
// expiry: node proxies and waypoints renew at half their lifetime, so a
// workload certificate past three quarters of its has failed to renew.
const leafNearExpiry = 0.25

// rootNearExpiry: a root (or intermediate) expiring within this needs a
// rotation now (the mesh does not rotate its CA by itself).
const rootNearExpiry = 30 * 24 * time.Hour

// Result is the outcome of one check.
type Result struct {
	Check   string `json:"check"`
	Status  string `json:"status"`
	Message string `json:"message"`
}

// Names of the install's objects (charts/causeway).
const (
	ControlPlaneName  = "causeway-controlplane" // its Deployment
	NodeProxyName     = "causeway-nodeproxy"    // its DaemonSet
	nodeProxySelector = "app.kubernetes.io/name=" + NodeProxyName
	rootsConfigMap    = "causeway-root-cert"
	webhookName       = "causeway-validation"
)

// ProxyCertificates are the certificates one proxy holds (its
// /config_dump's), or why they could not be read.
type ProxyCertificates struct {
	Proxy        string // "<kind> <namespace>/<name>"
	Certificates []certmanager.CertificateStatus
	Err          error
}

// Options are what a check reads.
type Options struct {
	Kube    kubernetes.Interface
	Gateway gwclient.Interface
	// PreInstall checks only what an install needs, and the caller's
	// permission to install, instead of the installed mesh.
	PreInstall bool
	// Proxies returns the certificates of every ready node proxy and
	// waypoint (meshctl reads them through their admin ports).
	Proxies func(context.Context) ([]ProxyCertificates, error)
	Now     time.Time
}

// Run checks the cluster and returns every check's result, in order.
func Run(ctx context.Context, o Options) []Result {
	k := &checker{o: o}
	k.kubernetesVersion()
	k.nodes(ctx)
	k.gatewayAPI(o.PreInstall)
	if o.PreInstall {
		k.permissions(ctx)
	} else {
		k.installed(ctx)
	}
	return k.results
}

type checker struct {
	o       Options
	results []Result
}

func (k *checker) add(check, status, format string, args ...any) {
	k.results = append(k.results, Result{Check: check, Status: status, Message: fmt.Sprintf(format, args...)})
}

func (k *checker) kubernetesVersion() {
	v, err := k.o.Kube.Discovery().ServerVersion()
	if err != nil {
		k.add("kubernetes", Fail, "cannot read the API server's version: %v", err)
		return
	}
	got, err := version.ParseGeneric(v.GitVersion)
	if err != nil {
		k.add("kubernetes", Fail, "API server version %q: %v", v.GitVersion, err)
		return
	}
	if got.LessThan(minKubernetes) {
		k.add("kubernetes", Fail, "API server %s; the mesh needs %s or later (bound tokens that name their node)", v.GitVersion, minKubernetes)
		return
	}
	k.add("kubernetes", Pass, "API server %s", v.GitVersion)
}

// nodes checks what the API says of each node: Ready, Linux on an
// architecture the images are built for, a kernel new enough for the
// capture rules. Whether nftables is usable there, and the CNI
// directories, only the node agent sees (the node proxy pod of each node
// is ready only once its agent has handed it the node's pods).
func (k *checker) nodes(ctx context.Context) {
	list, err := k.o.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		k.add("nodes", Fail, "cannot list nodes: %v", err)
		return
	}
	if len(list.Items) == 0 {
		k.add("nodes", Fail, "the cluster has no nodes")
		return
	}
	for _, n := range list.Items {
		name := "node " + n.Name
		info := n.Status.NodeInfo
		var problems []string
		if info.OperatingSystem != "linux" {
			problems = append(problems, "operating system "+info.OperatingSystem+", want linux")
		}
		if !slices.Contains(nodeArchitectures, info.Architecture) {
			problems = append(problems, "architecture "+info.Architecture+", want "+strings.Join(nodeArchitectures, " or "))
		}
		if kv, err := version.ParseGeneric(info.KernelVersion); err != nil {
			problems = append(problems, fmt.Sprintf("kernel %q unreadable: %v", info.KernelVersion, err))
		} else if kv.LessThan(minKernel) {
			problems = append(problems, fmt.Sprintf("kernel %s, want %s or later (nftables NAT in the inet family)", info.KernelVersion, minKernel))
		}
		if !nodeReady(&n) {
			problems = append(problems, "not Ready")
		}
		if len(problems) > 0 {
			k.add(name, Fail, "%s", strings.Join(problems, "; "))
			continue
		}
		k.add(name, Pass, "Ready, %s/%s, kernel %s, %s (nftables and the CNI directories are checked by the node agent on the node)", info.OperatingSystem, info.Architecture, info.KernelVersion, info.ContainerRuntimeVersion)
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// gatewayAPI checks the Gateway API kinds the mesh reads are served.
// Before an install they may be missing: the chart brings them.
func (k *checker) gatewayAPI(pre bool) {
	res, err := k.o.Kube.Discovery().ServerResourcesForGroupVersion(gwv1.GroupVersion.String())
	switch {
	case apierrors.IsNotFound(err) && pre:
		k.add("Gateway API CRDs", Pass, "not installed: the chart installs the standard channel's")
		return
	case apierrors.IsNotFound(err):
		k.add("Gateway API CRDs", Fail, "%s is not served: the Gateway API CRDs are not installed (the chart installs them)", gwv1.GroupVersion)
		return
	case err != nil:
		k.add("Gateway API CRDs", Fail, "discovery of %s: %v", gwv1.GroupVersion, err)
		return
	}
	have := map[string]bool{}
	for _, r := range res.APIResources {
		have[r.Name] = true
	}
	var missing []string
	for _, r := range gatewayResources {
		if !have[r] {
			missing = append(missing, r)
		}
	}
	if len(missing) > 0 {
		k.add("Gateway API CRDs", Fail, "%s does not serve %s: install the standard channel's CRDs, v1.4 or later (Helm never upgrades CRDs)", gwv1.GroupVersion, strings.Join(missing, ", "))
		return
	}
	k.add("Gateway API CRDs", Pass, "%s serves %s", gwv1.GroupVersion, strings.Join(gatewayResources, ", "))
}

// installRights are what `helm install` of the chart creates.
var installRights = []authzv1.ResourceAttributes{
	{Verb: "create", Resource: "namespaces"},
	{Verb: "create", Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"},
	{Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "clusterroles"},
	{Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "clusterrolebindings"},
	{Verb: "create", Group: "admissionregistration.k8s.io", Resource: "validatingwebhookconfigurations"},
	{Verb: "create", Namespace: trust.SystemNamespace, Group: "rbac.authorization.k8s.io", Resource: "roles"},
	{Verb: "create", Namespace: trust.SystemNamespace, Group: "rbac.authorization.k8s.io", Resource: "rolebindings"},
	{Verb: "create", Namespace: trust.SystemNamespace, Resource: "serviceaccounts"},
	{Verb: "create", Namespace: trust.SystemNamespace, Resource: "services"},
	{Verb: "create", Namespace: trust.SystemNamespace, Resource: "configmaps"},
	{Verb: "create", Namespace: trust.SystemNamespace, Resource: "secrets"}, // Helm's release
	{Verb: "create", Namespace: trust.SystemNamespace, Group: "apps", Resource: "deployments"},
	{Verb: "create", Namespace: trust.SystemNamespace, Group: "apps", Resource: "daemonsets"},
	{Verb: "create", Namespace: trust.SystemNamespace, Group: "policy", Resource: "poddisruptionbudgets"},
}

// permissions asks the API server whether the caller may create what an
// install creates (SelfSubjectAccessReview, which anyone may ask).
func (k *checker) permissions(ctx context.Context) {
	var denied []string
	for _, ra := range installRights {
		ra := ra
		r, err := k.o.Kube.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authzv1.SelfSubjectAccessReview{
			Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &ra}}, metav1.CreateOptions{})
		if err != nil {
			k.add("permissions", Fail, "cannot ask the API server about permissions: %v", err)
			return
		}
		if !r.Status.Allowed {
			what := ra.Verb + " " + strings.TrimPrefix(ra.Group+"/"+ra.Resource, "/")
			if ra.Namespace != "" {
				what += " in " + ra.Namespace
			}
			denied = append(denied, what)
		}
	}
	if len(denied) > 0 {
		k.add("permissions", Fail, "you may not %s: the install needs them", strings.Join(denied, ", "))
		return
	}
	k.add("permissions", Pass, "you may create everything the chart creates")
	ns, err := k.o.Kube.CoreV1().Namespaces().Get(ctx, trust.SystemNamespace, metav1.GetOptions{})
	if err == nil {
		if e := ns.Labels["pod-security.kubernetes.io/enforce"]; e != "" && e != "privileged" {
			k.add("namespace "+trust.SystemNamespace, Fail, "Pod Security enforces %q there; the node proxy needs privileged (NET_ADMIN, SYS_ADMIN, host directories)", e)
		}
	}
}

// installed checks every component of an install, and the certificates
// the proxies hold.
func (k *checker) installed(ctx context.Context) {
	apps := k.o.Kube.AppsV1()
	if _, err := k.o.Kube.CoreV1().Namespaces().Get(ctx, trust.SystemNamespace, metav1.GetOptions{}); err != nil {
		k.add("control plane", Fail, "namespace %s: %v: the mesh is not installed", trust.SystemNamespace, reason(err))
		return
	}
	if d, err := apps.Deployments(trust.SystemNamespace).Get(ctx, ControlPlaneName, metav1.GetOptions{}); err != nil {
		k.add("control plane", Fail, "Deployment %s/%s: %v", trust.SystemNamespace, ControlPlaneName, reason(err))
	} else if want := ptrOr(d.Spec.Replicas, 1); d.Status.ReadyReplicas < want || d.Status.UpdatedReplicas < want {
		k.add("control plane", Fail, "Deployment %s/%s: %d of %d replicas ready, %d updated", trust.SystemNamespace, ControlPlaneName, d.Status.ReadyReplicas, want, d.Status.UpdatedReplicas)
	} else {
		k.add("control plane", Pass, "%d of %d replicas ready", d.Status.ReadyReplicas, want)
	}
	k.nodeProxies(ctx)
	if _, err := k.o.Kube.Discovery().ServerResourcesForGroupVersion(config.CausewayGroupVersion.String()); err != nil {
		k.add("ConnectionPolicy CRD", Fail, "%s is not served: %v", config.CausewayGroupVersion, reason(err))
	} else {
		k.add("ConnectionPolicy CRD", Pass, "%s is served", config.CausewayGroupVersion)
	}
	if gc, err := k.o.Gateway.GatewayV1().GatewayClasses().Get(ctx, config.WaypointClass, metav1.GetOptions{}); err != nil {
		k.add("GatewayClass", Fail, "%s: %v (the control plane's leader creates it)", config.WaypointClass, reason(err))
	} else if c := meta.FindStatusCondition(gc.Status.Conditions, string(gwv1.GatewayClassConditionStatusAccepted)); c == nil || c.Status != metav1.ConditionTrue {
		k.add("GatewayClass", Fail, "%s is not Accepted%s", config.WaypointClass, conditionDetail(c))
	} else {
		k.add("GatewayClass", Pass, "%s Accepted", config.WaypointClass)
	}
	if wh, err := k.o.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, webhookName, metav1.GetOptions{}); err != nil {
		k.add("webhook", Fail, "ValidatingWebhookConfiguration causeway-validation: %v", reason(err))
	} else {
		var noCA []string
		for _, w := range wh.Webhooks {
			if len(w.ClientConfig.CABundle) == 0 {
				noCA = append(noCA, w.Name)
			}
		}
		if len(noCA) > 0 {
			k.add("webhook", Fail, "no CA bundle yet for %s (the control plane writes it)", strings.Join(noCA, ", "))
		} else {
			k.add("webhook", Pass, "%d webhooks with their CA bundle", len(wh.Webhooks))
		}
	}
	k.rootCertificate(ctx)
	k.waypoints(ctx)
	k.proxyCertificates(ctx)
}

func (k *checker) nodeProxies(ctx context.Context) {
	ds, err := k.o.Kube.AppsV1().DaemonSets(trust.SystemNamespace).Get(ctx, NodeProxyName, metav1.GetOptions{})
	if err != nil {
		k.add("node proxies", Fail, "DaemonSet %s/%s: %v", trust.SystemNamespace, NodeProxyName, reason(err))
		return
	}
	pods, err := k.o.Kube.CoreV1().Pods(trust.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: nodeProxySelector})
	if err != nil {
		k.add("node proxies", Fail, "list pods: %v", err)
		return
	}
	readyOn := map[string]bool{}
	for i := range pods.Items {
		if PodReady(&pods.Items[i]) {
			readyOn[pods.Items[i].Spec.NodeName] = true
		}
	}
	nodes, err := k.o.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		k.add("node proxies", Fail, "list nodes: %v", err)
		return
	}
	var without []string
	for _, n := range nodes.Items {
		if !readyOn[n.Name] && !n.Spec.Unschedulable {
			without = append(without, n.Name)
		}
	}
	if len(without) > 0 || ds.Status.NumberReady < ds.Status.DesiredNumberScheduled {
		k.add("node proxies", Fail, "%d of %d ready; no ready node proxy on %s", ds.Status.NumberReady, ds.Status.DesiredNumberScheduled, strings.Join(without, ", "))
		return
	}
	k.add("node proxies", Pass, "ready on every node (%d): each agent has written its node's CNI configuration and handed over its pods", len(readyOn))
}

func PodReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// rootCertificate checks the roots the control plane publishes for node
// proxies.
func (k *checker) rootCertificate(ctx context.Context) {
	cm, err := k.o.Kube.CoreV1().ConfigMaps(trust.SystemNamespace).Get(ctx, rootsConfigMap, metav1.GetOptions{})
	if err != nil {
		k.add("root certificate", Fail, "ConfigMap %s/causeway-root-cert: %v", trust.SystemNamespace, reason(err))
		return
	}
	rest := []byte(cm.Data["root-cert.pem"])
	n := 0
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			k.add("root certificate", Fail, "root-cert.pem: %v", err)
			return
		}
		n++
		if problem := certProblem(cert.NotBefore, cert.NotAfter, k.o.Now, true); problem != "" {
			k.add("root certificate", Fail, "%s (serial %s): %s", cert.Subject, cert.SerialNumber, problem)
			return
		}
	}
	if n == 0 {
		k.add("root certificate", Fail, "ConfigMap %s/causeway-root-cert holds no certificate", trust.SystemNamespace)
		return
	}
	k.add("root certificate", Pass, "%d root(s) valid for more than %d days", n, int(rootNearExpiry.Hours()/24))
}

// certProblem says what is wrong with a certificate's validity at now,
// or "".
func certProblem(notBefore, notAfter, now time.Time, root bool) string {
	switch {
	case now.Before(notBefore):
		return "not valid before " + notBefore.UTC().Format(time.RFC3339)
	case !now.Before(notAfter):
		return "expired at " + notAfter.UTC().Format(time.RFC3339)
	case root && notAfter.Sub(now) < rootNearExpiry:
		return "expires at " + notAfter.UTC().Format(time.RFC3339) + ", within 30 days"
	case !root && float64(notAfter.Sub(now)) < leafNearExpiry*float64(notAfter.Sub(notBefore)):
		return "expires at " + notAfter.UTC().Format(time.RFC3339) + ", with less than a quarter of its lifetime left: it is not being renewed"
	}
	return ""
}

// waypoints checks every waypoint Gateway is programmed.
func (k *checker) waypoints(ctx context.Context) {
	gws, err := k.o.Gateway.GatewayV1().Gateways("").List(ctx, metav1.ListOptions{})
	if err != nil {
		k.add("waypoints", Fail, "list Gateways: %v", err)
		return
	}
	n := 0
	for _, g := range gws.Items {
		if string(g.Spec.GatewayClassName) != config.WaypointClass {
			continue
		}
		n++
		if c := meta.FindStatusCondition(g.Status.Conditions, string(gwv1.GatewayConditionProgrammed)); c == nil || c.Status != metav1.ConditionTrue {
			k.add("waypoint "+g.Namespace+"/"+g.Name, Fail, "not Programmed%s", conditionDetail(c))
			continue
		}
		k.add("waypoint "+g.Namespace+"/"+g.Name, Pass, "Programmed")
	}
	if n == 0 {
		k.add("waypoints", Pass, "none in the cluster")
	}
}

// proxyCertificates checks the certificates every proxy holds.
func (k *checker) proxyCertificates(ctx context.Context) {
	if k.o.Proxies == nil {
		return
	}
	proxies, err := k.o.Proxies(ctx)
	if err != nil {
		k.add("proxy certificates", Fail, "%v", err)
		return
	}
	for _, p := range proxies {
		name := p.Proxy + " certificates"
		if p.Err != nil {
			k.add(name, Fail, "%v", p.Err)
			continue
		}
		if problems := CertificateProblems(p.Certificates, k.o.Now); len(problems) > 0 {
			k.add(name, Fail, "%s", strings.Join(problems, "; "))
			continue
		}
		k.add(name, Pass, "%d identities, every certificate valid and renewed in time", len(p.Certificates))
	}
}

// CertificateProblems lists what is wrong with a proxy's certificates.
func CertificateProblems(certs []certmanager.CertificateStatus, now time.Time) []string {
	var out []string
	sort.Slice(certs, func(i, j int) bool { return certs[i].Identity < certs[j].Identity })
	for _, c := range certs {
		if c.State != certmanager.StateAvailable {
			out = append(out, c.Identity+": "+c.State)
			continue
		}
		for i, e := range c.CertChain {
			from, err1 := time.Parse(time.RFC3339, e.ValidFrom)
			to, err2 := time.Parse(time.RFC3339, e.ExpirationTime)
			if err := errors.Join(err1, err2); err != nil {
				out = append(out, fmt.Sprintf("%s: chain element %d: %v", c.Identity, i, err))
				continue
			}
			if p := certProblem(from, to, now, i > 0); p != "" {
				out = append(out, fmt.Sprintf("%s: %s %s: %s", c.Identity, chainRole(i), e.SerialNumber, p))
			}
		}
	}
	return out
}

func chainRole(i int) string {
	if i == 0 {
		return "leaf"
	}
	return "chain element " + strconv.Itoa(i)
}

// conditionDetail is ": REASON: MESSAGE" of a condition, or " (no status yet)".
func conditionDetail(c *metav1.Condition) string {
	if c == nil {
		return " (no status yet)"
	}
	return ": " + c.Reason + ": " + c.Message
}

// reason is err without the API machinery's wording, for "not found".
func reason(err error) string {
	if apierrors.IsNotFound(err) {
		return "not found"
	}
	return err.Error()
}

func ptrOr(p *int32, d int32) int32 {
	if p == nil {
		return d
	}
	return *p
}
