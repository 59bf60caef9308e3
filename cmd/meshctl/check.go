package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
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
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/trust/certmanager"
)

func init() {
	register("check", "check a cluster for the mesh: prerequisites, then every component ready and certificates valid (--pre-install: only what an install needs) [-o table|json|yaml]", runCheck)
}

// Check outcomes.
const (
	checkPass = "PASS"
	checkFail = "FAIL"
	checkWarn = "WARN"
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

// checkResult is the outcome of one check.
type checkResult struct {
	Check   string `json:"check"`
	Status  string `json:"status"`
	Message string `json:"message"`
}

type checker struct {
	c       *cluster
	now     time.Time
	results []checkResult
}

func (k *checker) add(check, status, format string, args ...any) {
	k.results = append(k.results, checkResult{Check: check, Status: status, Message: fmt.Sprintf(format, args...)})
}

func runCheck(args []string) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	pre := fs.Bool("pre-install", false, "check only what an install needs: the cluster's version, its nodes, the Gateway API CRDs if present, and your permission to install")
	kf, _, err := parseArgs(fs, args, false, 0, "meshctl check [--pre-install] [-o table|json|yaml]")
	if err != nil {
		return err
	}
	c, err := kf.connect()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*kubeTimeout)
	defer cancel()
	k := &checker{c: c, now: time.Now()}
	k.kubernetesVersion()
	k.nodes(ctx)
	k.gatewayAPI(*pre)
	if *pre {
		k.permissions(ctx)
	} else {
		k.installed(ctx)
	}
	failed := 0
	for _, r := range k.results {
		if r.Status == checkFail {
			failed++
		}
	}
	if err := render(os.Stdout, kf.output, k.results, func(w io.Writer) error {
		tw := newTable(w)
		fmt.Fprintln(tw, "CHECK\tSTATUS\tMESSAGE")
		for _, r := range k.results {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Check, r.Status, r.Message)
		}
		return tw.Flush()
	}); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d checks failed", failed, len(k.results))
	}
	return nil
}

func (k *checker) kubernetesVersion() {
	v, err := k.c.client.Discovery().ServerVersion()
	if err != nil {
		k.add("kubernetes", checkFail, "cannot read the API server's version: %v", err)
		return
	}
	got, err := version.ParseGeneric(v.GitVersion)
	if err != nil {
		k.add("kubernetes", checkFail, "API server version %q: %v", v.GitVersion, err)
		return
	}
	if got.LessThan(minKubernetes) {
		k.add("kubernetes", checkFail, "API server %s; the mesh needs %s or later (bound tokens that name their node)", v.GitVersion, minKubernetes)
		return
	}
	k.add("kubernetes", checkPass, "API server %s", v.GitVersion)
}

// nodes checks what the API says of each node: Ready, Linux on an
// architecture the images are built for, a kernel new enough for the
// capture rules. Whether nftables is usable there, and the CNI
// directories, only the node agent sees (the node proxy pod of each node
// is ready only once its agent has handed it the node's pods).
func (k *checker) nodes(ctx context.Context) {
	list, err := k.c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		k.add("nodes", checkFail, "cannot list nodes: %v", err)
		return
	}
	if len(list.Items) == 0 {
		k.add("nodes", checkFail, "the cluster has no nodes")
		return
	}
	for _, n := range list.Items {
		name := "node " + n.Name
		info := n.Status.NodeInfo
		var problems []string
		if info.OperatingSystem != "linux" {
			problems = append(problems, "operating system "+info.OperatingSystem+", want linux")
		}
		if !contains(nodeArchitectures, info.Architecture) {
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
			k.add(name, checkFail, "%s", strings.Join(problems, "; "))
			continue
		}
		k.add(name, checkPass, "Ready, %s/%s, kernel %s, %s (nftables and the CNI directories are checked by the node agent on the node)", info.OperatingSystem, info.Architecture, info.KernelVersion, info.ContainerRuntimeVersion)
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
	res, err := k.c.client.Discovery().ServerResourcesForGroupVersion(gwv1.GroupVersion.String())
	switch {
	case apierrors.IsNotFound(err) && pre:
		k.add("Gateway API CRDs", checkPass, "not installed: the chart installs the standard channel's")
		return
	case apierrors.IsNotFound(err):
		k.add("Gateway API CRDs", checkFail, "%s is not served: the Gateway API CRDs are not installed (the chart installs them)", gwv1.GroupVersion)
		return
	case err != nil:
		k.add("Gateway API CRDs", checkFail, "discovery of %s: %v", gwv1.GroupVersion, err)
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
		k.add("Gateway API CRDs", checkFail, "%s does not serve %s: install the standard channel's CRDs, v1.4 or later (Helm never upgrades CRDs)", gwv1.GroupVersion, strings.Join(missing, ", "))
		return
	}
	k.add("Gateway API CRDs", checkPass, "%s serves %s", gwv1.GroupVersion, strings.Join(gatewayResources, ", "))
}

// installRights are what `helm install` of the chart creates.
var installRights = []authzv1.ResourceAttributes{
	{Verb: "create", Resource: "namespaces"},
	{Verb: "create", Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"},
	{Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "clusterroles"},
	{Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "clusterrolebindings"},
	{Verb: "create", Group: "admissionregistration.k8s.io", Resource: "validatingwebhookconfigurations"},
	{Verb: "create", Namespace: systemNamespace, Group: "rbac.authorization.k8s.io", Resource: "roles"},
	{Verb: "create", Namespace: systemNamespace, Group: "rbac.authorization.k8s.io", Resource: "rolebindings"},
	{Verb: "create", Namespace: systemNamespace, Resource: "serviceaccounts"},
	{Verb: "create", Namespace: systemNamespace, Resource: "services"},
	{Verb: "create", Namespace: systemNamespace, Resource: "configmaps"},
	{Verb: "create", Namespace: systemNamespace, Resource: "secrets"}, // Helm's release
	{Verb: "create", Namespace: systemNamespace, Group: "apps", Resource: "deployments"},
	{Verb: "create", Namespace: systemNamespace, Group: "apps", Resource: "daemonsets"},
	{Verb: "create", Namespace: systemNamespace, Group: "policy", Resource: "poddisruptionbudgets"},
}

// permissions asks the API server whether the caller may create what an
// install creates (SelfSubjectAccessReview, which anyone may ask).
func (k *checker) permissions(ctx context.Context) {
	var denied []string
	for _, ra := range installRights {
		ra := ra
		r, err := k.c.client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authzv1.SelfSubjectAccessReview{
			Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &ra}}, metav1.CreateOptions{})
		if err != nil {
			k.add("permissions", checkFail, "cannot ask the API server about permissions: %v", err)
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
		k.add("permissions", checkFail, "you may not %s: the install needs them", strings.Join(denied, ", "))
		return
	}
	k.add("permissions", checkPass, "you may create everything the chart creates")
	ns, err := k.c.client.CoreV1().Namespaces().Get(ctx, systemNamespace, metav1.GetOptions{})
	if err == nil {
		if e := ns.Labels["pod-security.kubernetes.io/enforce"]; e != "" && e != "privileged" {
			k.add("namespace "+systemNamespace, checkFail, "Pod Security enforces %q there; the node proxy needs privileged (NET_ADMIN, SYS_ADMIN, host directories)", e)
		}
	}
}

// installed checks every component of an install, and the certificates
// the proxies hold.
func (k *checker) installed(ctx context.Context) {
	apps := k.c.client.AppsV1()
	if _, err := k.c.client.CoreV1().Namespaces().Get(ctx, systemNamespace, metav1.GetOptions{}); err != nil {
		k.add("control plane", checkFail, "namespace %s: %v: the mesh is not installed", systemNamespace, reason(err))
		return
	}
	if d, err := apps.Deployments(systemNamespace).Get(ctx, controlPlaneValue, metav1.GetOptions{}); err != nil {
		k.add("control plane", checkFail, "Deployment %s/%s: %v", systemNamespace, controlPlaneValue, reason(err))
	} else if want := ptrOr(d.Spec.Replicas, 1); d.Status.ReadyReplicas < want || d.Status.UpdatedReplicas < want {
		k.add("control plane", checkFail, "Deployment %s/%s: %d of %d replicas ready, %d updated", systemNamespace, controlPlaneValue, d.Status.ReadyReplicas, want, d.Status.UpdatedReplicas)
	} else {
		k.add("control plane", checkPass, "%d of %d replicas ready", d.Status.ReadyReplicas, want)
	}
	k.nodeProxies(ctx)
	if _, err := k.c.client.Discovery().ServerResourcesForGroupVersion(config.CausewayGroupVersion.String()); err != nil {
		k.add("ConnectionPolicy CRD", checkFail, "%s is not served: %v", config.CausewayGroupVersion, reason(err))
	} else {
		k.add("ConnectionPolicy CRD", checkPass, "%s is served", config.CausewayGroupVersion)
	}
	if gc, err := k.c.gateway.GatewayV1().GatewayClasses().Get(ctx, config.WaypointClass, metav1.GetOptions{}); err != nil {
		k.add("GatewayClass", checkFail, "%s: %v (the control plane's leader creates it)", config.WaypointClass, reason(err))
	} else if c := meta.FindStatusCondition(gc.Status.Conditions, string(gwv1.GatewayClassConditionStatusAccepted)); c == nil || c.Status != metav1.ConditionTrue {
		k.add("GatewayClass", checkFail, "%s is not Accepted%s", config.WaypointClass, conditionDetail(c))
	} else {
		k.add("GatewayClass", checkPass, "%s Accepted", config.WaypointClass)
	}
	if wh, err := k.c.client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "causeway-validation", metav1.GetOptions{}); err != nil {
		k.add("webhook", checkFail, "ValidatingWebhookConfiguration causeway-validation: %v", reason(err))
	} else {
		var noCA []string
		for _, w := range wh.Webhooks {
			if len(w.ClientConfig.CABundle) == 0 {
				noCA = append(noCA, w.Name)
			}
		}
		if len(noCA) > 0 {
			k.add("webhook", checkFail, "no CA bundle yet for %s (the control plane writes it)", strings.Join(noCA, ", "))
		} else {
			k.add("webhook", checkPass, "%d webhooks with their CA bundle", len(wh.Webhooks))
		}
	}
	k.rootCertificate(ctx)
	k.waypoints(ctx)
	k.proxyCertificates(ctx)
}

func (k *checker) nodeProxies(ctx context.Context) {
	ds, err := k.c.client.AppsV1().DaemonSets(systemNamespace).Get(ctx, nodeProxyLabelValue, metav1.GetOptions{})
	if err != nil {
		k.add("node proxies", checkFail, "DaemonSet %s/%s: %v", systemNamespace, nodeProxyLabelValue, reason(err))
		return
	}
	pods, err := k.c.client.CoreV1().Pods(systemNamespace).List(ctx, metav1.ListOptions{LabelSelector: nodeProxySelector})
	if err != nil {
		k.add("node proxies", checkFail, "list pods: %v", err)
		return
	}
	readyOn := map[string]bool{}
	for i := range pods.Items {
		if podReady(&pods.Items[i]) {
			readyOn[pods.Items[i].Spec.NodeName] = true
		}
	}
	nodes, err := k.c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		k.add("node proxies", checkFail, "list nodes: %v", err)
		return
	}
	var without []string
	for _, n := range nodes.Items {
		if !readyOn[n.Name] && !n.Spec.Unschedulable {
			without = append(without, n.Name)
		}
	}
	if len(without) > 0 || ds.Status.NumberReady < ds.Status.DesiredNumberScheduled {
		k.add("node proxies", checkFail, "%d of %d ready; no ready node proxy on %s", ds.Status.NumberReady, ds.Status.DesiredNumberScheduled, orDefault(strings.Join(without, ", "), "-"))
		return
	}
	k.add("node proxies", checkPass, "ready on every node (%d): each agent has written its node's CNI configuration and handed over its pods", len(readyOn))
}

func podReady(p *corev1.Pod) bool {
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
	cm, err := k.c.client.CoreV1().ConfigMaps(systemNamespace).Get(ctx, "causeway-root-cert", metav1.GetOptions{})
	if err != nil {
		k.add("root certificate", checkFail, "ConfigMap %s/causeway-root-cert: %v", systemNamespace, reason(err))
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
			k.add("root certificate", checkFail, "root-cert.pem: %v", err)
			return
		}
		n++
		if problem := certProblem(cert.NotBefore, cert.NotAfter, k.now, true); problem != "" {
			k.add("root certificate", checkFail, "%s (serial %s): %s", cert.Subject, cert.SerialNumber, problem)
			return
		}
	}
	if n == 0 {
		k.add("root certificate", checkFail, "ConfigMap %s/causeway-root-cert holds no certificate", systemNamespace)
		return
	}
	k.add("root certificate", checkPass, "%d root(s) valid for more than %d days", n, int(rootNearExpiry.Hours()/24))
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
	gws, err := k.c.gateway.GatewayV1().Gateways("").List(ctx, metav1.ListOptions{})
	if err != nil {
		k.add("waypoints", checkFail, "list Gateways: %v", err)
		return
	}
	n := 0
	for _, g := range gws.Items {
		if string(g.Spec.GatewayClassName) != config.WaypointClass {
			continue
		}
		n++
		if c := meta.FindStatusCondition(g.Status.Conditions, string(gwv1.GatewayConditionProgrammed)); c == nil || c.Status != metav1.ConditionTrue {
			k.add("waypoint "+g.Namespace+"/"+g.Name, checkFail, "not Programmed%s", conditionDetail(c))
			continue
		}
		k.add("waypoint "+g.Namespace+"/"+g.Name, checkPass, "Programmed")
	}
	if n == 0 {
		k.add("waypoints", checkPass, "none in the cluster")
	}
}

// proxyCertificates reads every node proxy's and waypoint's certificates
// through its admin port.
func (k *checker) proxyCertificates(ctx context.Context) {
	pods, err := k.c.meshPods(ctx)
	if err != nil {
		k.add("proxy certificates", checkFail, "%v", err)
		return
	}
	for _, p := range pods {
		kind := proxyKind(p)
		if kind == "control plane" || !podReady(p) {
			continue // an unready proxy is reported above
		}
		name := kind + " " + p.Namespace + "/" + p.Name + " certificates"
		raw, err := k.c.adminGet(ctx, p, "/config_dump")
		if err != nil {
			k.add(name, checkFail, "%v", err)
			continue
		}
		d, err := parseDump(raw)
		if err != nil {
			k.add(name, checkFail, "%v", err)
			continue
		}
		if problems := certificateProblems(d.Certificates, k.now); len(problems) > 0 {
			k.add(name, checkFail, "%s", strings.Join(problems, "; "))
			continue
		}
		k.add(name, checkPass, "%d identities, every certificate valid and renewed in time", len(d.Certificates))
	}
}

// certificateProblems lists what is wrong with a proxy's certificates.
func certificateProblems(certs []certmanager.CertificateStatus, now time.Time) []string {
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
