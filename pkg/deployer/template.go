package deployer

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"text/template"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	policyv1ac "k8s.io/client-go/applyconfigurations/policy/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/tracing"
)

//go:embed waypoint.yaml
var defaultTemplate string

//go:embed ingress.yaml
var ingressTemplate string

// maxTemplateBytes bounds a template file: it is a handful of manifests.
const maxTemplateBytes = 1 << 20

// Values are what a template is rendered with, besides the Gateway.
type Values struct {
	Image           string
	ImagePullPolicy string // default IfNotPresent
	Replicas        int32  // default 2
	// XDSAddress is the control plane's xDS and CA address as waypoints
	// dial it (host:port).
	XDSAddress           string
	ControlPlaneIdentity string // SPIFFE ID the control plane presents
	TrustDomain          string
	TokenAudience        string // audience of the projected token the CA checks
	RootCert             string // PEM of the mesh roots
}

// templateData is what a template sees: Values plus the Gateway's facts.
// A waypoint's template reads HBONEPort, Policy and Tracing; an ingress
// Gateway's reads Ports, ServiceType and Addresses.
type templateData struct {
	Values
	Name, Namespace string
	HBONEPort       int32
	Policy          PolicySource
	Tracing         tracing.Settings
	Ports           []ListenerPort
	ServiceType     string
	// Addresses are the static addresses the ingress Gateway holds
	// (config.ResolveAddresses), which its Service carries as externalIPs.
	Addresses []string
}

// ListenerPort is a port an ingress Gateway's listeners serve on, as its
// Service and pods expose it: one per port number (listeners of one port
// share it, told apart by hostname).
type ListenerPort struct {
	Name        string // "http-80", "https-443": a valid Service port name
	Port        int32
	AppProtocol string // "http" or "https"
}

// AnnotationServiceType on an ingress Gateway sets its Service's type:
// LoadBalancer (the default, as Istio's gateways), NodePort or ClusterIP.
const AnnotationServiceType = "causeway.dev/service-type"

// ingressPorts are the ports of an ingress Gateway's HTTP and HTTPS
// listeners, in spec order of first appearance. Listeners of another
// protocol are not served (the status says so) and expose nothing.
func ingressPorts(gw *gwv1.Gateway) []ListenerPort {
	var out []ListenerPort
	seen := map[gwv1.PortNumber]bool{}
	for _, l := range gw.Spec.Listeners {
		if l.Protocol != gwv1.HTTPProtocolType && l.Protocol != gwv1.HTTPSProtocolType || seen[l.Port] {
			continue
		}
		seen[l.Port] = true
		proto := strings.ToLower(string(l.Protocol))
		out = append(out, ListenerPort{Name: fmt.Sprintf("%s-%d", proto, l.Port), Port: int32(l.Port), AppProtocol: proto})
	}
	return out
}

// serviceType reads an ingress Gateway's Service type annotation.
func serviceType(gw *gwv1.Gateway) (string, error) {
	switch t := gw.Annotations[AnnotationServiceType]; t {
	case "":
		return "LoadBalancer", nil
	case "LoadBalancer", "NodePort", "ClusterIP":
		return t, nil
	default:
		return "", fmt.Errorf("annotation %s: %q: want LoadBalancer, NodePort or ClusterIP", AnnotationServiceType, t)
	}
}

// Annotations of a waypoint Gateway naming its policy source.
const (
	// AnnotationPolicyConfigMap names a ConfigMap of Rego files (and data
	// files) in the Gateway's namespace, mounted as the policy directory
	// (default "<gateway>-policies").
	AnnotationPolicyConfigMap = "causeway.dev/policy-configmap"
	// AnnotationPolicyGitURL names an https Git repository of policies the
	// waypoint fetches itself; the ref, sub-directory and a Secret holding
	// a token (key "token") go in the annotations after it.
	AnnotationPolicyGitURL    = "causeway.dev/policy-git-url"
	AnnotationPolicyGitRef    = "causeway.dev/policy-git-ref"
	AnnotationPolicyGitDir    = "causeway.dev/policy-git-dir"
	AnnotationPolicyGitSecret = "causeway.dev/policy-git-secret"
)

// Annotations of a waypoint Gateway turning tracing on (docs/tracing.md):
// the OTLP receiver's host:port, the protocol (grpc, the default, or
// http) and the percentage of new traces sampled (default 1).
const (
	AnnotationTracingEndpoint = "causeway.dev/tracing-endpoint"
	AnnotationTracingProtocol = "causeway.dev/tracing-protocol"
	AnnotationTracingSampling = "causeway.dev/tracing-sampling"
)

// tracingSettings reads a Gateway's tracing annotations.
func tracingSettings(gw *gwv1.Gateway) (tracing.Settings, error) {
	a := gw.Annotations
	if a[AnnotationTracingEndpoint] == "" {
		for _, k := range []string{AnnotationTracingProtocol, AnnotationTracingSampling} {
			if _, ok := a[k]; ok {
				return tracing.Settings{}, fmt.Errorf("annotation %s needs %s", k, AnnotationTracingEndpoint)
			}
		}
	}
	s, err := tracing.Parse(a[AnnotationTracingEndpoint], a[AnnotationTracingProtocol], a[AnnotationTracingSampling])
	if err != nil {
		return s, fmt.Errorf("tracing annotations: %w", err)
	}
	return s, nil
}

// PolicySource is where a waypoint's policies come from: a ConfigMap, or
// a Git repository when GitURL is set. Either way the waypoint denies every
// request until it has compiled a policy (its pods do not start while the
// ConfigMap is missing, and are not ready before the first fetch).
type PolicySource struct {
	ConfigMap                         string
	GitURL, GitRef, GitDir, GitSecret string
}

// policySource reads a Gateway's policy annotations.
func policySource(gw *gwv1.Gateway) (PolicySource, error) {
	a := gw.Annotations
	p := PolicySource{ConfigMap: a[AnnotationPolicyConfigMap], GitURL: a[AnnotationPolicyGitURL],
		GitRef: a[AnnotationPolicyGitRef], GitDir: a[AnnotationPolicyGitDir], GitSecret: a[AnnotationPolicyGitSecret]}
	if p.GitURL == "" {
		for _, k := range []string{AnnotationPolicyGitRef, AnnotationPolicyGitDir, AnnotationPolicyGitSecret} {
			if _, ok := a[k]; ok {
				return p, fmt.Errorf("annotation %s needs %s", k, AnnotationPolicyGitURL)
			}
		}
		if p.ConfigMap == "" {
			p.ConfigMap = gw.Name + "-policies"
		}
		if errs := validation.IsDNS1123Subdomain(p.ConfigMap); len(errs) > 0 {
			return p, fmt.Errorf("annotation %s: %q is not a ConfigMap name: %s", AnnotationPolicyConfigMap, p.ConfigMap, strings.Join(errs, "; "))
		}
		return p, nil
	}
	if p.ConfigMap != "" {
		return p, fmt.Errorf("annotations %s and %s name two policy sources: give one", AnnotationPolicyConfigMap, AnnotationPolicyGitURL)
	}
	// ssh needs host keys and a private key the default template has no
	// place for; an operator's own template can pass them.
	if u, err := url.Parse(p.GitURL); err != nil || u.Scheme != "https" || u.Host == "" {
		return p, fmt.Errorf("annotation %s: %q is not an https:// URL", AnnotationPolicyGitURL, p.GitURL)
	}
	if p.GitSecret != "" {
		if errs := validation.IsDNS1123Subdomain(p.GitSecret); len(errs) > 0 {
			return p, fmt.Errorf("annotation %s: %q is not a Secret name: %s", AnnotationPolicyGitSecret, p.GitSecret, strings.Join(errs, "; "))
		}
	}
	return p, nil
}

// Template renders a Gateway's objects. It is immutable once built.
type Template struct {
	tmpl *template.Template
}

// DefaultTemplate returns the waypoint template shipped with the deployer.
func DefaultTemplate() *Template { return builtin("waypoint.yaml", defaultTemplate) }

// IngressTemplate returns the ingress Gateway template shipped with the
// deployer.
func IngressTemplate() *Template { return builtin("ingress.yaml", ingressTemplate) }

func builtin(name, text string) *Template {
	t, err := ParseTemplate(name, text)
	if err != nil {
		panic("deployer: the built-in template " + name + " does not parse: " + err.Error())
	}
	return t
}

// LoadTemplate reads a template file (the manifests may ship their own).
func LoadTemplate(path string) (*Template, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTemplateBytes+1))
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", path, err)
	}
	if len(b) > maxTemplateBytes {
		return nil, fmt.Errorf("template %s: larger than %d bytes", path, maxTemplateBytes)
	}
	return ParseTemplate(path, string(b))
}

// ParseTemplate parses a template's text. Missing values are errors, so a
// template naming a value that does not exist fails at render time rather
// than producing "<no value>".
func ParseTemplate(name, text string) (*Template, error) {
	t, err := template.New(name).Option("missingkey=error").Funcs(template.FuncMap{
		"quote":  quote,
		"indent": indent,
	}).Parse(text)
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", name, err)
	}
	return &Template{tmpl: t}, nil
}

// quote renders a value as a JSON string, which YAML reads as the same
// string whatever it holds.
func quote(v any) (string, error) {
	b, err := json.Marshal(fmt.Sprint(v))
	return string(b), err
}

// indent prefixes every line of s with n spaces (for block scalars).
func indent(n int, s string) string {
	pad := strings.Repeat(" ", n)
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = pad + l
	}
	return strings.Join(lines, "\n")
}

// Child is one object the deployer applies for a Gateway.
type Child struct {
	Kind      string
	Name      string
	Namespace string
	// Apply is the server-side apply configuration:
	// *corev1ac.ServiceAccountApplyConfiguration, *corev1ac.ConfigMapApplyConfiguration,
	// *corev1ac.ServiceApplyConfiguration, *policyv1ac.PodDisruptionBudgetApplyConfiguration
	// or *appsv1ac.DeploymentApplyConfiguration.
	Apply any
}

// childKinds are the kinds a template may produce, by apiVersion and kind,
// with a constructor of the empty apply configuration.
var childKinds = map[string]func() any{
	"v1/ServiceAccount":             func() any { return &corev1ac.ServiceAccountApplyConfiguration{} },
	"v1/ConfigMap":                  func() any { return &corev1ac.ConfigMapApplyConfiguration{} },
	"v1/Service":                    func() any { return &corev1ac.ServiceApplyConfiguration{} },
	"policy/v1/PodDisruptionBudget": func() any { return &policyv1ac.PodDisruptionBudgetApplyConfiguration{} },
	"apps/v1/Deployment":            func() any { return &appsv1ac.DeploymentApplyConfiguration{} },
}

// Render produces a Gateway's objects: a waypoint's (class
// causeway-waypoint) or an ingress Gateway's (class causeway). Every object
// must be of a kind above, in the Gateway's namespace, and bear the
// Gateway's name (one object per kind), so no template can make the
// deployer touch anything else; each gets the Gateway's
// spec.infrastructure labels and annotations (where the template sets no
// value of its own), the gateway-name label and a controller owner
// reference to the Gateway, so garbage collection removes it with the
// Gateway. addresses are the static addresses an ingress Gateway holds
// (config.ResolveAddresses).
func (t *Template) Render(gw *gwv1.Gateway, v Values, addresses []string) ([]Child, error) {
	data, err := gatewayData(gw)
	if err != nil {
		return nil, fmt.Errorf("gateway %s/%s: %w", gw.Namespace, gw.Name, err)
	}
	data.Addresses = addresses
	if v.ImagePullPolicy == "" {
		v.ImagePullPolicy = "IfNotPresent"
	}
	if v.Replicas == 0 {
		v.Replicas = 2
	}
	data.Values = v
	name := "template " + t.tmpl.Name()
	var out bytes.Buffer
	if err := t.tmpl.Execute(&out, data); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	owner := metav1ac.OwnerReference().
		WithAPIVersion(gwv1.GroupVersion.String()).WithKind("Gateway").
		WithName(gw.Name).WithUID(gw.UID).WithController(true)
	var children []Child
	seen := map[string]bool{}
	for i, doc := range splitDocuments(out.String()) {
		c, err := decodeChild(doc)
		if err != nil {
			return nil, fmt.Errorf("%s, document %d: %w", name, i+1, err)
		}
		if c.Namespace != gw.Namespace || c.Name != gw.Name {
			return nil, fmt.Errorf("%s, document %d: %s %s/%s: a Gateway's objects must be named %s/%s", name, i+1, c.Kind, c.Namespace, c.Name, gw.Namespace, gw.Name)
		}
		if seen[c.Kind] {
			return nil, fmt.Errorf("%s, document %d: a second %s", name, i+1, c.Kind)
		}
		seen[c.Kind] = true
		children = append(children, c)
	}
	for _, c := range children {
		meta := childMeta(c)
		if inf := gw.Spec.Infrastructure; inf != nil {
			meta.Labels = withDefaults(meta.Labels, inf.Labels)
			meta.Annotations = withDefaults(meta.Annotations, inf.Annotations)
			// The pods are made in response to the Gateway too (what
			// spec.infrastructure asks, and what selects them for
			// monitoring and network policies).
			if pm := podTemplateMeta(c); pm != nil {
				pm.Labels = withDefaults(pm.Labels, inf.Labels)
				pm.Annotations = withDefaults(pm.Annotations, inf.Annotations)
			}
		}
		meta.WithLabels(map[string]string{config.LabelGatewayName: gw.Name})
		meta.OwnerReferences = nil // ours alone: a template cannot hand the objects to another owner
		meta.WithOwnerReferences(owner)
	}
	return children, nil
}

// gatewayData is what a template sees of a Gateway, by its class.
func gatewayData(gw *gwv1.Gateway) (templateData, error) {
	d := templateData{Name: gw.Name, Namespace: gw.Namespace}
	var err error
	if string(gw.Spec.GatewayClassName) == config.IngressClass {
		d.Ports = ingressPorts(gw)
		d.ServiceType, err = serviceType(gw)
		return d, err
	}
	if d.HBONEPort, err = hbonePort(gw); err != nil {
		return d, err
	}
	if d.Policy, err = policySource(gw); err != nil {
		return d, err
	}
	d.Tracing, err = tracingSettings(gw)
	return d, err
}

// withDefaults adds to m the entries of defaults whose keys m lacks.
func withDefaults[K ~string, V ~string](m map[string]string, defaults map[K]V) map[string]string {
	for k, v := range defaults {
		if _, ok := m[string(k)]; !ok {
			if m == nil {
				m = map[string]string{}
			}
			m[string(k)] = string(v)
		}
	}
	return m
}

// hbonePort is the port of the Gateway's HBONE listener.
func hbonePort(gw *gwv1.Gateway) (int32, error) {
	for _, l := range gw.Spec.Listeners {
		if string(l.Protocol) == config.WaypointProtocol {
			return int32(l.Port), nil
		}
	}
	return 0, fmt.Errorf("no listener with protocol %s", config.WaypointProtocol)
}

// splitDocuments splits multi-document YAML, dropping empty documents.
func splitDocuments(s string) []string {
	var docs []string
	for _, d := range strings.Split("\n"+s, "\n---") {
		if strings.TrimSpace(stripComments(d)) != "" {
			docs = append(docs, d)
		}
	}
	return docs
}

func stripComments(d string) string {
	var b strings.Builder
	for _, l := range strings.Split(d, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func decodeChild(doc string) (Child, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
		return Child{}, err
	}
	mk := childKinds[tm.APIVersion+"/"+tm.Kind]
	if mk == nil {
		return Child{}, fmt.Errorf("kind %s %s: a template may hold only ServiceAccount, ConfigMap, Service, PodDisruptionBudget and Deployment", tm.APIVersion, tm.Kind)
	}
	c := Child{Kind: tm.Kind, Apply: mk()}
	if err := yaml.UnmarshalStrict([]byte(doc), c.Apply); err != nil {
		return Child{}, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	m := childMeta(c)
	if m == nil || m.Name == nil || *m.Name == "" {
		return Child{}, fmt.Errorf("%s: metadata.name is required", tm.Kind)
	}
	c.Name = *m.Name
	if m.Namespace != nil {
		c.Namespace = *m.Namespace
	}
	return c, nil
}

// podTemplateMeta returns the metadata of a rendered Deployment's pod
// template (made when the template has none), or nil for other kinds.
func podTemplateMeta(c Child) *metav1ac.ObjectMetaApplyConfiguration {
	d, ok := c.Apply.(*appsv1ac.DeploymentApplyConfiguration)
	if !ok {
		return nil
	}
	if d.Spec == nil {
		d.Spec = appsv1ac.DeploymentSpec()
	}
	if d.Spec.Template == nil {
		d.Spec.Template = corev1ac.PodTemplateSpec()
	}
	if d.Spec.Template.ObjectMetaApplyConfiguration == nil {
		d.Spec.Template.ObjectMetaApplyConfiguration = &metav1ac.ObjectMetaApplyConfiguration{}
	}
	return d.Spec.Template.ObjectMetaApplyConfiguration
}

// childMeta returns the metadata of a rendered child's apply configuration.
func childMeta(c Child) *metav1ac.ObjectMetaApplyConfiguration {
	switch o := c.Apply.(type) {
	case *corev1ac.ServiceAccountApplyConfiguration:
		return o.ObjectMetaApplyConfiguration
	case *corev1ac.ConfigMapApplyConfiguration:
		return o.ObjectMetaApplyConfiguration
	case *corev1ac.ServiceApplyConfiguration:
		return o.ObjectMetaApplyConfiguration
	case *policyv1ac.PodDisruptionBudgetApplyConfiguration:
		return o.ObjectMetaApplyConfiguration
	case *appsv1ac.DeploymentApplyConfiguration:
		return o.ObjectMetaApplyConfiguration
	}
	return nil // not a child kind: decodeChild makes only the kinds above
}
