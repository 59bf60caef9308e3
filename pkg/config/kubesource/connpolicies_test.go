package kubesource_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/config/kubesource"
	"github.com/causeway-mesh/causeway/pkg/internal/kubetest"
)

// connPolicy is a ConnectionPolicy of namespace ns with the spec given as
// YAML, for the dynamic client.
func connPolicy(t *testing.T, ns, name, spec string) *unstructured.Unstructured {
	t.Helper()
	var s map[string]any
	if err := yaml.Unmarshal([]byte(spec), &s); err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": config.CausewayGroupVersion.String(), "kind": "ConnectionPolicy",
		"metadata": map[string]any{"namespace": ns, "name": name}, "spec": s,
	}}
}

// The CRD's schema refuses what the translation refuses, with a message
// that says why, and takes what it takes: `kubectl apply` (strict field
// validation, its default) answers at once instead of a policy that
// silently denies.
func TestConnectionPolicySchemaMatchesTranslation(t *testing.T) {
	env := kubetest.Shared(t)
	const ns = "connpolicy-schema"
	env.Create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	policies := env.Dynamic(t).Resource(config.ConnectionPolicyResource).Namespace(ns)
	gateway := "{group: gateway.networking.k8s.io, kind: Gateway, name: w}"
	for i, tc := range []struct {
		name, spec        string
		apiserver, refuse string // "": accepted
	}{
		{"policy only", "{policy: p}", "", ""},
		{"selector", "{selector: {matchLabels: {app: db, example.com/tier: a-1, empty: ''}}, policy: p}", "", ""},
		{"targetRefs", "{targetRefs: [" + gateway + "], policy: p}", "", ""},
		{"empty selector and no targetRefs", "{selector: {}, targetRefs: [], policy: p}", "", ""},
		{"no policy", "{selector: {matchLabels: {app: db}}}", "spec.policy: Required value", "spec.policy is required"},
		{"empty policy", "{policy: ''}", "spec.policy in body should be at least 1 chars long", "spec.policy is required"},
		{"both", "{selector: {matchLabels: {app: db}}, targetRefs: [" + gateway + "], policy: p}",
			"spec.selector and spec.targetRefs are exclusive", "spec.selector and spec.targetRefs are exclusive"},
		{"wrong kind", "{targetRefs: [{group: gateway.networking.k8s.io, kind: Service, name: w}], policy: p}",
			`spec.targetRefs[0].kind: Unsupported value: "Service"`, "only group gateway.networking.k8s.io kind Gateway"},
		{"wrong group", "{targetRefs: [{group: '', kind: Gateway, name: w}], policy: p}",
			`spec.targetRefs[0].group: Unsupported value: ""`, "only group gateway.networking.k8s.io kind Gateway"},
		{"no name", "{targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: ''}], policy: p}",
			"spec.targetRefs[0].name in body should be at least 1 chars long", "spec.targetRefs[0]: name is required"},
		{"bad label key", "{selector: {matchLabels: {'a b': x}}, policy: p}", "label keys must be qualified names", `spec.selector label "a b"`},
		{"bad label value", "{selector: {matchLabels: {app: 'x y'}}, policy: p}", "spec.selector.matchLabels.app in body should match", `spec.selector label app value "x y"`},
		{"long label value", "{selector: {matchLabels: {app: " + strings.Repeat("x", 64) + "}}, policy: p}", "may not be more than 63 bytes", "spec.selector label app value"},
		{"unknown field", "{policy: p, action: ALLOW}", `unknown field "spec.action"`, "unknown field"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "p" + string(rune('a'+i))
			_, err := policies.Create(context.Background(), connPolicy(t, ns, name, tc.spec), metav1.CreateOptions{FieldValidation: "Strict"})
			switch {
			case tc.apiserver == "" && err != nil:
				t.Errorf("the API server refused it: %v", err)
			case tc.apiserver != "" && (err == nil || !strings.Contains(err.Error(), tc.apiserver)):
				t.Errorf("the API server: %v, want an error with %q", err, tc.apiserver)
			}
			doc := "apiVersion: causeway.dev/v1alpha1\nkind: ConnectionPolicy\nmetadata: {name: " + name + ", namespace: " + ns + "}\nspec: " + tc.spec + "\n"
			objs, err := config.Decode("test.yaml", []byte(doc))
			var refused string
			if err != nil {
				refused = err.Error()
			} else {
				s, err := config.Translate(objs, config.Options{})
				if err != nil {
					t.Fatal(err)
				}
				if len(s.Rejected) > 0 {
					refused = s.Rejected[0].Reason
				}
			}
			switch {
			case tc.refuse == "" && refused != "":
				t.Errorf("the translation refused it: %s", refused)
			case tc.refuse != "" && !strings.Contains(refused, tc.refuse):
				t.Errorf("the translation: %q, want %q", refused, tc.refuse)
			}
		})
	}
}

// Without the ConnectionPolicy CRD the source neither hangs nor fails: it
// says so once and has no policies. When a CRD appears it reads the kind;
// an object its type cannot hold (this CRD takes anything) is refused and
// denies its namespace's workloads, never dropped.
func TestConnectionPolicyKindAbsent(t *testing.T) {
	env := kubetest.Start(t) // its own apiserver: the CRD is deleted
	env.DeleteCRD(t, kubetest.ConnectionPolicyCRD)
	const ns = "connpolicy-absent"
	env.Create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{config.LabelDataplaneMode: "mesh"}}})

	core, logs := observer.New(zapcore.InfoLevel)
	src, err := kubesource.NewForConfig(env.ControlPlane(t), kubesource.Options{Debounce: 50 * time.Millisecond, KindRecheck: 100 * time.Millisecond, Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, src)
	first := r.next(t, "a first snapshot", func(*config.Snapshot) bool { return true })
	if len(first.ConnectionPolicies) != 0 {
		t.Fatalf("policies without their kind: %v", first.ConnectionPolicies)
	}
	time.Sleep(time.Second) // ten rechecks
	if n := logs.FilterMessageSnippet("ConnectionPolicy kind is not served").Len(); n != 1 {
		t.Fatalf("the missing kind logged %d times, want once", n)
	}

	env.InstallPermissiveConnectionPolicyCRD(t)
	policies := env.Dynamic(t).Resource(config.ConnectionPolicyResource).Namespace(ns)
	err = kubetest.WaitFor(context.Background(), patience, func() (bool, error) {
		_, err := policies.Create(context.Background(), connPolicy(t, ns, "good", "{selector: {matchLabels: {app: db}}, policy: p}"), metav1.CreateOptions{})
		return err == nil, nil // refused until the CRD is established
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policies.Create(context.Background(), connPolicy(t, ns, "odd", "{selector: {matchLabels: {app: db}}, policy: 7}"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := r.next(t, "both policies", func(s *config.Snapshot) bool { return len(s.ConnectionPolicies) == 2 })
	if good := s.ConnectionPolicies[ns+"/good"]; strings.HasPrefix(good.GetInvalidReason(), config.RefusedPrefix) || good.GetSelector()["app"] != "db" {
		t.Errorf("the good policy: %v", good)
	}
	odd := s.ConnectionPolicies[ns+"/odd"]
	if !strings.HasPrefix(odd.GetInvalidReason(), config.RefusedPrefix+"unreadable") || len(odd.GetSelector()) != 0 {
		t.Errorf("the unreadable policy is sent as %v, want it refused and selecting its whole namespace", odd)
	}
	if why := refusedObjects(s)["ConnectionPolicy "+ns+"/odd"]; !strings.Contains(why, "unreadable") {
		t.Errorf("refusals %v, want the unreadable policy's", refusedObjects(s))
	}
	if logs.FilterMessageSnippet("ConnectionPolicy kind is served now").Len() != 1 {
		t.Error("the kind's appearance was not logged")
	}
}
