package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/internal/kubetest"
	"github.com/causeway-mesh/causeway/pkg/policy"
)

// policySets are two connection policy sets loaded by real engines, as the
// control plane loads them: "good" compiles and passes its test, "broken"
// does not compile. The answer is the control plane's (cmd/controlplane
// policySets.state): the active revision, or why there is none.
func policySets(t *testing.T) func(string) (string, string) {
	t.Helper()
	engines := map[string]*policy.Engine{}
	for name, files := range map[string]map[string]string{
		"good": {
			"authz.rego":      "package envoy.authz\n\ndefault allow := false\n\nallow if input.attributes.source.principal == \"spiffe://cluster.local/ns/shop/sa/allowed\"\n",
			"authz_test.rego": "package envoy.authz\n\ntest_other_denied if not allow with input as {\"attributes\": {\"source\": {\"principal\": \"x\"}}}\n",
		},
		"broken": {"authz.rego": "package envoy.authz\n\nallow if {\n\tinput.attributes.source.principal ==\n"},
	} {
		dir := t.TempDir()
		for f, content := range files {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		e, err := policy.NewEngine(policy.Options{Dir: dir, Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		err = e.Load(context.Background())
		if (err == nil) != (name == "good") {
			t.Fatalf("loading policy set %s: %v", name, err)
		}
		engines[name] = e
	}
	return func(name string) (string, string) {
		e, ok := engines[name]
		if !ok {
			return "", fmt.Sprintf("the control plane loads no policy set %q", name)
		}
		if rev := e.Revision(); rev != "" {
			return rev, ""
		}
		problem := fmt.Sprintf("policy set %q has no good revision at the control plane", name)
		if r := e.Status().LastRejection; r != nil {
			problem += ": " + r.Reason
		}
		return "", problem
	}
}

func TestWebhookConnectionPolicies(t *testing.T) {
	c := startWebhook(t)
	c.namespace("policies", nil)
	dyn, err := dynamic.NewForConfig(kubetest.Shared(t).Config)
	if err != nil {
		t.Fatal(err)
	}
	policies := dyn.Resource(config.ConnectionPolicyResource).Namespace("policies")
	apply := func(name, spec string) error {
		var u unstructured.Unstructured
		if err := yaml.Unmarshal([]byte("apiVersion: causeway.dev/v1alpha1\nkind: ConnectionPolicy\nmetadata: {name: "+name+"}\nspec: "+spec), &u.Object); err != nil {
			t.Fatal(err)
		}
		_, err := policies.Create(c.ctx, &u, metav1.CreateOptions{})
		return err
	}
	admitted(t, "a policy naming a set that compiled", apply("good", "{selector: {matchLabels: {app: db}}, policy: good}"))
	refused(t, "a policy naming a set that does not compile", apply("broken", "{policy: broken}"),
		`ConnectionPolicy policies/broken: spec.policy: policy set "broken" has no good revision at the control plane: `)
	refused(t, "the compiler's own words", apply("broken2", "{policy: broken}"), "authz.rego")
	refused(t, "a policy naming a set the control plane does not load", apply("unknown", "{policy: elsewhere}"),
		`spec.policy: the control plane loads no policy set "elsewhere"`)

	// An update is checked too.
	good, err := policies.Get(c.ctx, "good", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(good.Object, "broken", "spec", "policy"); err != nil {
		t.Fatal(err)
	}
	_, err = policies.Update(c.ctx, good, metav1.UpdateOptions{})
	refused(t, "an update naming the broken set", err, `policy set "broken" has no good revision`)
}

// What the CRD's schema already refuses never reaches the webhook from this
// apiserver; a cluster with another schema (or none) sends it, and the
// webhook refuses it with the translation's words.
func TestReviewConnectionPolicyPastTheSchema(t *testing.T) {
	w, err := New(Options{Gateways: emptyGateways(t), Namespaces: emptyNamespaces(t), IngressClasses: emptyIngressClasses(t), PolicySet: policySets(t), Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, spec, want string }{
		{"valid", `{"policy":"good","targetRefs":[{"group":"gateway.networking.k8s.io","kind":"Gateway","name":"wp"}]}`, ""},
		{"no policy", `{"selector":{"matchLabels":{"app":"db"}}}`, "spec.policy is required"},
		{"selector and targets", `{"policy":"good","selector":{"matchLabels":{"app":"db"}},"targetRefs":[{"group":"gateway.networking.k8s.io","kind":"Gateway","name":"wp"}]}`,
			"spec.selector and spec.targetRefs are exclusive"},
		{"bad label key", `{"policy":"good","selector":{"matchLabels":{"a/b/c":"db"}}}`, `spec.selector label "a/b/c"`},
		{"bad label value", `{"policy":"good","selector":{"matchLabels":{"app":"-db"}}}`, `spec.selector label app value "-db"`},
		{"a target not a Gateway", `{"policy":"good","targetRefs":[{"group":"","kind":"Service","name":"db"}]}`,
			"spec.targetRefs[0]: only group gateway.networking.k8s.io kind Gateway can be targeted"},
		{"an unknown field", `{"policy":"good","selectors":{}}`, `unreadable: `},
	} {
		t.Run(c.name, func(t *testing.T) {
			raw := `{"apiVersion":"causeway.dev/v1alpha1","kind":"ConnectionPolicy","metadata":{"namespace":"shop","name":"p"},"spec":` + c.spec + `}`
			resp := w.Review(&admissionv1.AdmissionRequest{UID: "u", Kind: metav1.GroupVersionKind{Group: "causeway.dev", Version: "v1alpha1", Kind: "ConnectionPolicy"},
				Operation: admissionv1.Create, Namespace: "shop", Name: "p", Object: runtime.RawExtension{Raw: []byte(raw)}})
			switch {
			case c.want == "" && !resp.Allowed:
				t.Fatalf("refused: %s", resp.Result.Message)
			case c.want != "" && resp.Allowed:
				t.Fatalf("admitted, want refused with %q", c.want)
			case c.want != "" && !strings.Contains(resp.Result.Message, "causeway: ConnectionPolicy shop/p: "+c.want):
				t.Fatalf("refused with %q, want %q", resp.Result.Message, c.want)
			}
		})
	}
}

func TestWebhookBackendTLSPolicies(t *testing.T) {
	c := startWebhook(t)
	c.namespace("tls", nil)
	apply := func(doc string) error {
		var p gwv1.BackendTLSPolicy
		if err := yaml.UnmarshalStrict([]byte(doc), &p); err != nil {
			t.Fatal(err)
		}
		_, err := c.gw.GatewayV1().BackendTLSPolicies("tls").Create(c.ctx, &p, metav1.CreateOptions{})
		return err
	}
	// Its ConfigMap and Service need not exist yet (applied in any order).
	admitted(t, "a valid policy", apply(`
metadata: {name: good}
spec:
  targetRefs: [{group: "", kind: Service, name: db}]
  validation:
    hostname: db.example.com
    caCertificateRefs: [{group: "", kind: ConfigMap, name: db-ca}]
    subjectAltNames: [{type: URI, uri: "spiffe://example.com/db"}]
`))
	refused(t, "options the mesh does not implement", apply(`
metadata: {name: options}
spec:
  targetRefs: [{group: "", kind: Service, name: db}]
  options: {example.com/cipher: fast}
  validation: {hostname: db.example.com, wellKnownCACertificates: System}
`), "BackendTLSPolicy tls/options: spec.options example.com/cipher: this mesh implements no options")
	refused(t, "a CA certificate reference of a kind the mesh cannot read", apply(`
metadata: {name: secret-ca}
spec:
  targetRefs: [{group: "", kind: Service, name: db}]
  validation:
    hostname: db.example.com
    caCertificateRefs: [{group: "", kind: Secret, name: db-ca}]
`), `spec.validation.caCertificateRefs[0]: kind Secret (group "") is not supported: name a ConfigMap`)
	refused(t, "a target that is not a Service", apply(`
metadata: {name: import}
spec:
  targetRefs: [{group: multicluster.x-k8s.io, kind: ServiceImport, name: db}]
  validation: {hostname: db.example.com, wellKnownCACertificates: System}
`), `spec.targetRefs[0]: only Services (group "", kind Service) can be targeted`)

	// An update is checked too.
	p, err := c.gw.GatewayV1().BackendTLSPolicies("tls").Get(c.ctx, "good", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Spec.Options = map[gwv1.AnnotationKey]gwv1.AnnotationValue{"example.com/x": "y"}
	_, err = c.gw.GatewayV1().BackendTLSPolicies("tls").Update(c.ctx, p, metav1.UpdateOptions{})
	refused(t, "an update adding options", err, "spec.options example.com/x")
}

// The shipped manifest registers the webhooks as Configuration does: the
// same rules, failure policies and scopes (the client configuration and
// the control plane's namespace differ by install).
func TestManifestMatchesConfiguration(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "manifests", "core", "webhook.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var manifest admissionregistrationv1.ValidatingWebhookConfiguration
	if err := yaml.UnmarshalStrict(data, &manifest); err != nil {
		t.Fatal(err)
	}
	want := Configuration(manifest.Name, "causeway-system", admissionregistrationv1.WebhookClientConfig{})
	strip := func(ws []admissionregistrationv1.ValidatingWebhook) string {
		out := make([]admissionregistrationv1.ValidatingWebhook, len(ws))
		for i, w := range ws {
			w.ClientConfig = admissionregistrationv1.WebhookClientConfig{}
			out[i] = w
		}
		b, err := json.MarshalIndent(out, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if got, want := strip(manifest.Webhooks), strip(want.Webhooks); !reflect.DeepEqual(got, want) {
		t.Fatalf("manifests/core/webhook.yaml:\n%s\nConfiguration:\n%s", got, want)
	}
	var names []string
	for _, w := range manifest.Webhooks {
		names = append(names, w.Name)
	}
	if !reflect.DeepEqual(names, Webhooks) {
		t.Fatalf("webhooks %v, want %v (the CA bundle is kept for those only)", names, Webhooks)
	}
}
