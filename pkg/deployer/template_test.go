package deployer

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/causeway-mesh/causeway/pkg/config"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func testGateway() *gwv1.Gateway {
	return &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "waypoint", Namespace: "shop", UID: "6b1f1a52-0000-4000-8000-000000000001"},
		Spec: gwv1.GatewaySpec{
			GatewayClassName: "causeway-waypoint",
			Listeners:        []gwv1.Listener{{Name: "mesh", Port: 15008, Protocol: "HBONE"}},
		},
	}
}

func testValues() Values {
	return Values{
		Image:                "causeway/waypoint:v1",
		XDSAddress:           "causeway-controlplane.causeway-system.svc:15012",
		ControlPlaneIdentity: "spiffe://cluster.local/ns/causeway-system/sa/controlplane",
		TrustDomain:          "cluster.local",
		TokenAudience:        "causeway-ca",
		RootCert:             "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
	}
}

// renderYAML is what the deployer would apply, as YAML documents.
func renderYAML(t *testing.T, tmpl *Template, gw *gwv1.Gateway, v Values) string {
	t.Helper()
	children, err := tmpl.Render(gw, v, nil)
	if err != nil {
		t.Fatal(err)
	}
	var docs []string
	for _, c := range children {
		b, err := yaml.Marshal(c.Apply)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(b))
	}
	return strings.Join(docs, "---\n")
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("rendering differs from %s (run with -update after checking):\n%s", path, got)
	}
}

func TestDefaultTemplateGolden(t *testing.T) {
	golden(t, "default.golden.yaml", renderYAML(t, DefaultTemplate(), testGateway(), testValues()))

	gw := testGateway()
	gw.Name = "edge"
	gw.Spec.Listeners[0].Port = 16008
	v := testValues()
	v.Replicas = 3
	v.ImagePullPolicy = "Never"
	golden(t, "port-replicas.golden.yaml", renderYAML(t, DefaultTemplate(), gw, v))
}

// The Gateway's annotations choose the policy source: a ConfigMap of its
// choosing, or a Git repository with a token from a Secret.
func TestTemplatePolicySource(t *testing.T) {
	gw := testGateway()
	gw.Annotations = map[string]string{AnnotationPolicyConfigMap: "shop-rego"}
	children, err := DefaultTemplate().Render(gw, testValues(), nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := children[len(children)-1].Apply.(*appsv1ac.DeploymentApplyConfiguration).Spec.Template.Spec
	if got := *spec.Volumes[len(spec.Volumes)-1].ConfigMap.Name; got != "shop-rego" {
		t.Fatalf("policies volume from ConfigMap %q, want shop-rego", got)
	}

	gw.Annotations = map[string]string{AnnotationPolicyGitURL: "https://git.example/policies.git",
		AnnotationPolicyGitRef: "main", AnnotationPolicyGitDir: "shop", AnnotationPolicyGitSecret: "git-token"}
	golden(t, "git.golden.yaml", renderYAML(t, DefaultTemplate(), gw, testValues()))

	for _, c := range []struct {
		annotations map[string]string
		want        string
	}{
		{map[string]string{AnnotationPolicyConfigMap: "a", AnnotationPolicyGitURL: "https://git.example/p.git"}, "two policy sources"},
		{map[string]string{AnnotationPolicyGitRef: "main"}, "needs " + AnnotationPolicyGitURL},
		{map[string]string{AnnotationPolicyGitURL: "ssh://git@git.example/p.git"}, "not an https:// URL"},
		{map[string]string{AnnotationPolicyGitURL: "/srv/policies"}, "not an https:// URL"},
		{map[string]string{AnnotationPolicyConfigMap: "Not_A_Name"}, "not a ConfigMap name"},
		{map[string]string{AnnotationPolicyGitURL: "https://git.example/p.git", AnnotationPolicyGitSecret: "a b"}, "not a Secret name"},
	} {
		gw.Annotations = c.annotations
		if _, err := DefaultTemplate().Render(gw, testValues(), nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("annotations %v: got %v, want an error mentioning %q", c.annotations, err, c.want)
		}
	}
}

// Tracing annotations become the waypoint's tracing flags; bad ones are
// refused (the deployer reports them on the Gateway as InvalidWaypoint).
func TestTemplateTracing(t *testing.T) {
	gw := testGateway()
	args := func() []string {
		children, err := DefaultTemplate().Render(gw, testValues(), nil)
		if err != nil {
			t.Fatal(err)
		}
		return children[len(children)-1].Apply.(*appsv1ac.DeploymentApplyConfiguration).Spec.Template.Spec.Containers[0].Args
	}
	for _, a := range args() {
		if strings.HasPrefix(a, "--tracing") {
			t.Errorf("no tracing annotations: flag %s", a)
		}
	}
	gw.Annotations = map[string]string{AnnotationTracingEndpoint: "jaeger.tracing:4318", AnnotationTracingProtocol: "http", AnnotationTracingSampling: "0.5"}
	want := []string{"--tracing-endpoint=jaeger.tracing:4318", "--tracing-protocol=http", "--tracing-sampling=0.5"}
	if got := args(); !slices.Equal(got[len(got)-3:], want) {
		t.Errorf("tracing flags %q, want %q", got[len(got)-3:], want)
	}
	gw.Annotations = map[string]string{AnnotationTracingEndpoint: "jaeger.tracing:4317"}
	want = []string{"--tracing-endpoint=jaeger.tracing:4317", "--tracing-protocol=grpc", "--tracing-sampling=1"}
	if got := args(); !slices.Equal(got[len(got)-3:], want) {
		t.Errorf("tracing flags %q, want the defaults %q", got[len(got)-3:], want)
	}
	for _, c := range []struct {
		annotations map[string]string
		want        string
	}{
		{map[string]string{AnnotationTracingEndpoint: "http://jaeger:4318"}, "want host:port"},
		{map[string]string{AnnotationTracingEndpoint: "jaeger:4317", AnnotationTracingSampling: "often"}, `tracing sampling "often"`},
		{map[string]string{AnnotationTracingEndpoint: "jaeger:4317", AnnotationTracingSampling: "101"}, "from 0 to 100"},
		{map[string]string{AnnotationTracingEndpoint: "jaeger:4317", AnnotationTracingProtocol: "thrift"}, "want grpc or http"},
		{map[string]string{AnnotationTracingSampling: "5"}, "needs " + AnnotationTracingEndpoint},
	} {
		gw.Annotations = c.annotations
		if _, err := DefaultTemplate().Render(gw, testValues(), nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("annotations %v: got %v, want an error mentioning %q", c.annotations, err, c.want)
		}
	}
}

func TestTemplateFromFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tmpl.yaml")
	text := `
# a minimal template: a template may leave kinds out
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{quote .Name}}
  namespace: {{quote .Namespace}}
  # a template cannot hand its objects to another owner
  ownerReferences: [{apiVersion: v1, kind: ConfigMap, name: other, uid: "1"}]
---
`
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	tmpl, err := LoadTemplate(path)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "file.golden.yaml", renderYAML(t, tmpl, testGateway(), testValues()))
}

func TestTemplateRefusals(t *testing.T) {
	for _, c := range []struct{ name, text, want string }{
		{"another kind", "apiVersion: v1\nkind: Secret\nmetadata: {name: '{{.Name}}', namespace: '{{.Namespace}}'}\n", "kind v1 Secret"},
		{"another name", "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: admin, namespace: '{{.Namespace}}'}\n", "must be named shop/waypoint"},
		{"another namespace", "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: '{{.Name}}', namespace: kube-system}\n", "must be named shop/waypoint"},
		{"no namespace", "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: '{{.Name}}'}\n", "must be named shop/waypoint"},
		{"twice", "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: '{{.Name}}', namespace: '{{.Namespace}}'}\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {name: '{{.Name}}', namespace: '{{.Namespace}}'}\n", "a second ServiceAccount"},
		{"unknown field", "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: '{{.Name}}', namespace: '{{.Namespace}}'}\nsecretz: []\n", "unknown field"},
		{"missing value", "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: '{{.Nmae}}'}\n", "Nmae"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tmpl, err := ParseTemplate(c.name, c.text)
			if err == nil {
				_, err = tmpl.Render(testGateway(), testValues(), nil)
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, c.want)
			}
		})
	}
	gw := testGateway()
	gw.Spec.Listeners[0].Protocol = "HTTP"
	if _, err := DefaultTemplate().Render(gw, testValues(), nil); err == nil || !strings.Contains(err.Error(), "no listener with protocol HBONE") {
		t.Fatalf("a Gateway without an HBONE listener: got %v", err)
	}
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, make([]byte, maxTemplateBytes+1), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTemplate(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("an oversized template: got %v", err)
	}
}

// A name that YAML would read as something else stays a string.
func TestQuoteKeepsStrings(t *testing.T) {
	gw := testGateway()
	v := testValues()
	v.Image = "img: {x: 1}\n- y"
	children, err := DefaultTemplate().Render(gw, v, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := children[len(children)-1].Apply.(*appsv1ac.DeploymentApplyConfiguration)
	if got := *d.Spec.Template.Spec.Containers[0].Image; got != v.Image {
		t.Fatalf("image = %q, want %q", got, v.Image)
	}
}

func testIngress() *gwv1.Gateway {
	hostname := gwv1.Hostname("shop.example.com")
	return &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: "shop", UID: "6b1f1a52-0000-4000-8000-000000000002"},
		Spec: gwv1.GatewaySpec{
			GatewayClassName: config.IngressClass,
			Listeners: []gwv1.Listener{
				{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType},
				{Name: "https", Port: 443, Protocol: gwv1.HTTPSProtocolType, Hostname: &hostname},
				{Name: "https-other", Port: 443, Protocol: gwv1.HTTPSProtocolType},
				{Name: "tcp", Port: 9000, Protocol: gwv1.TCPProtocolType},
			},
		},
	}
}

// An ingress Gateway: one Service and container port per listener port
// (listeners sharing a port share it; a protocol the ingress does not
// serve exposes nothing), LoadBalancer by default.
func TestIngressTemplateGolden(t *testing.T) {
	golden(t, "ingress.golden.yaml", renderYAML(t, IngressTemplate(), testIngress(), testValues()))
}

func TestIngressServiceTypeAndInfrastructure(t *testing.T) {
	gw := testIngress()
	gw.Annotations = map[string]string{AnnotationServiceType: "ClusterIP"}
	gw.Spec.Infrastructure = &gwv1.GatewayInfrastructure{
		Labels:      map[gwv1.LabelKey]gwv1.LabelValue{"team": "shop", config.LabelUseWaypoint: "waypoint"},
		Annotations: map[gwv1.AnnotationKey]gwv1.AnnotationValue{"lb.example.com/internal": "true"},
	}
	children, err := IngressTemplate().Render(gw, testValues(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range children {
		m := childMeta(c)
		if m.Labels["team"] != "shop" || m.Annotations["lb.example.com/internal"] != "true" {
			t.Errorf("%s: labels %v, annotations %v: want the Gateway's infrastructure ones", c.Kind, m.Labels, m.Annotations)
		}
		if d, ok := c.Apply.(*appsv1ac.DeploymentApplyConfiguration); ok {
			pm := d.Spec.Template.ObjectMetaApplyConfiguration
			if pm.Labels["team"] != "shop" || pm.Annotations["lb.example.com/internal"] != "true" {
				t.Errorf("pod template: labels %v, annotations %v: want the Gateway's infrastructure ones", pm.Labels, pm.Annotations)
			}
			if pm.Annotations["prometheus.io/port"] != "15020" || pm.Labels[config.LabelGatewayName] != gw.Name {
				t.Errorf("pod template: labels %v, annotations %v: the template's own were lost", pm.Labels, pm.Annotations)
			}
		}
		svc, ok := c.Apply.(*corev1ac.ServiceApplyConfiguration)
		if !ok {
			continue
		}
		if *svc.Spec.Type != "ClusterIP" {
			t.Errorf("Service type %s, want the annotation's ClusterIP", *svc.Spec.Type)
		}
		if m.Labels[config.LabelUseWaypoint] != config.UseWaypointNone {
			t.Errorf("Service label %s=%q: the template's own value must win over the infrastructure's", config.LabelUseWaypoint, m.Labels[config.LabelUseWaypoint])
		}
	}
	gw.Annotations[AnnotationServiceType] = "ExternalName"
	if _, err := IngressTemplate().Render(gw, testValues(), nil); err == nil || !strings.Contains(err.Error(), "want LoadBalancer, NodePort or ClusterIP") {
		t.Errorf("service type ExternalName: got %v", err)
	}
}

// The static addresses an ingress Gateway holds are its Service's
// externalIPs; without any, the Service has none.
func TestIngressExternalIPs(t *testing.T) {
	for _, addrs := range [][]string{nil, {"192.0.2.1", "2001:db8::5"}} {
		children, err := IngressTemplate().Render(testIngress(), testValues(), addrs)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, c := range children {
			if svc, ok := c.Apply.(*corev1ac.ServiceApplyConfiguration); ok {
				found = true
				if !slices.Equal(svc.Spec.ExternalIPs, addrs) {
					t.Errorf("Service externalIPs %q, want %q", svc.Spec.ExternalIPs, addrs)
				}
			}
		}
		if !found {
			t.Fatal("no Service rendered")
		}
	}
}
