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
type templateData struct {
	Values
	Name, Namespace string
	HBONEPort       int32
	Policy          PolicySource
	Tracing         tracing.Settings
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

// Template renders a waypoint's objects. It is immutable once built.
type Template struct {
	tmpl *template.Template
}

// DefaultTemplate returns the template shipped with the deployer.
func DefaultTemplate() *Template {
	t, err := ParseTemplate("waypoint.yaml", defaultTemplate)
	if err != nil {
		panic("deployer: the built-in template does not parse: " + err.Error())
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
		return nil, fmt.Errorf("waypoint template %s: %w", path, err)
	}
	if len(b) > maxTemplateBytes {
		return nil, fmt.Errorf("waypoint template %s: larger than %d bytes", path, maxTemplateBytes)
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
		return nil, fmt.Errorf("waypoint template: %w", err)
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

// Child is one object the deployer applies for a waypoint.
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

// Render produces a waypoint Gateway's objects. Every object must be of a
// kind above, in the Gateway's namespace, and bear the Gateway's name (one
// object per kind), so no template can make the deployer touch anything
// else; each gets the gateway-name label and a controller owner reference
// to the Gateway, so garbage collection removes it with the Gateway.
func (t *Template) Render(gw *gwv1.Gateway, v Values) ([]Child, error) {
	port, err := hbonePort(gw)
	if err != nil {
		return nil, err
	}
	policy, err := policySource(gw)
	if err != nil {
		return nil, fmt.Errorf("gateway %s/%s: %w", gw.Namespace, gw.Name, err)
	}
	traces, err := tracingSettings(gw)
	if err != nil {
		return nil, fmt.Errorf("gateway %s/%s: %w", gw.Namespace, gw.Name, err)
	}
	if v.ImagePullPolicy == "" {
		v.ImagePullPolicy = "IfNotPresent"
	}
	if v.Replicas == 0 {
		v.Replicas = 2
	}
	var out bytes.Buffer
	if err := t.tmpl.Execute(&out, templateData{Values: v, Name: gw.Name, Namespace: gw.Namespace, HBONEPort: port, Policy: policy, Tracing: traces}); err != nil {
		return nil, fmt.Errorf("waypoint template: %w", err)
	}
	owner := metav1ac.OwnerReference().
		WithAPIVersion(gwv1.GroupVersion.String()).WithKind("Gateway").
		WithName(gw.Name).WithUID(gw.UID).WithController(true)
	var children []Child
	seen := map[string]bool{}
	for i, doc := range splitDocuments(out.String()) {
		c, err := decodeChild(doc)
		if err != nil {
			return nil, fmt.Errorf("waypoint template, document %d: %w", i+1, err)
		}
		if c.Namespace != gw.Namespace || c.Name != gw.Name {
			return nil, fmt.Errorf("waypoint template, document %d: %s %s/%s: a waypoint's objects must be named %s/%s", i+1, c.Kind, c.Namespace, c.Name, gw.Namespace, gw.Name)
		}
		if seen[c.Kind] {
			return nil, fmt.Errorf("waypoint template, document %d: a second %s", i+1, c.Kind)
		}
		seen[c.Kind] = true
		children = append(children, c)
	}
	for _, c := range children {
		meta := childMeta(c)
		meta.WithLabels(map[string]string{config.LabelGatewayName: gw.Name})
		meta.OwnerReferences = nil // ours alone: a template cannot hand the objects to another owner
		meta.WithOwnerReferences(owner)
	}
	return children, nil
}

// hbonePort is the port of the Gateway's HBONE listener.
func hbonePort(gw *gwv1.Gateway) (int32, error) {
	for _, l := range gw.Spec.Listeners {
		if string(l.Protocol) == config.WaypointProtocol {
			return int32(l.Port), nil
		}
	}
	return 0, fmt.Errorf("gateway %s/%s has no listener with protocol %s", gw.Namespace, gw.Name, config.WaypointProtocol)
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
		return Child{}, fmt.Errorf("kind %s %s: a waypoint template may hold only ServiceAccount, ConfigMap, Service, PodDisruptionBudget and Deployment", tm.APIVersion, tm.Kind)
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
