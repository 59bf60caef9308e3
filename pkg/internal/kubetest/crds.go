package kubetest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
)

const gatewayAPIModule = "sigs.k8s.io/gateway-api"

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// ConnectionPolicyCRD is the name of the mesh's own CRD, which every
// apiserver here serves (manifests/core/connectionpolicy-crd.yaml).
const ConnectionPolicyCRD = "connectionpolicies.causeway.dev"

// moduleDir finds a module's directory with the go command: the module
// cache's copy of a dependency, or the main module's checkout for "". (A
// test binary carries no dependency list in its build info.)
func moduleDir(module string) (string, error) {
	args := []string{"list", "-m", "-f", "{{.Dir}}"}
	if module != "" {
		args = append(args, module)
	}
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
		}
		return "", fmt.Errorf("find module %q: go list: %w", module, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// crdFiles are the Gateway API standard-channel CRDs of the module the
// tests are built with, and the mesh's own.
func crdFiles() ([]string, error) {
	gw, err := moduleDir(gatewayAPIModule)
	if err != nil {
		return nil, err
	}
	files, err := filepath.Glob(filepath.Join(gw, "config", "crd", "standard", "*.yaml"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("gateway API CRDs in %s: none found (%v)", gw, err)
	}
	main, err := moduleDir("")
	if err != nil {
		return nil, err
	}
	own := filepath.Join(main, "manifests", "core", "connectionpolicy-crd.yaml")
	if _, err := os.Stat(own); err != nil {
		return nil, fmt.Errorf("the mesh's CRD: %w", err)
	}
	return append(files, own), nil
}

// installCRDs creates the Gateway API standard CRDs and the mesh's own and
// waits until they are served.
func (e *Env) installCRDs() error {
	files, err := crdFiles()
	if err != nil {
		return err
	}
	var docs []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		docs = append(docs, string(data))
	}
	return e.createCRDs(docs)
}

// createCRDs creates the CRDs of the YAML documents (other kinds are
// skipped) and waits until they are established.
func (e *Env) createCRDs(docs []string) error {
	dyn, err := dynamic.NewForConfig(e.Config)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var names []string
	for i, doc := range docs {
		obj := &unstructured.Unstructured{}
		if err := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(doc), 64<<10).Decode(&obj.Object); err != nil {
			return fmt.Errorf("CRD document %d: %w", i+1, err)
		}
		if obj.GetKind() != "CustomResourceDefinition" {
			continue // e.g. the ValidatingAdmissionPolicy guarding upgrades
		}
		if _, err := dyn.Resource(crdResource).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create CRD %s: %w", obj.GetName(), err)
		}
		names = append(names, obj.GetName())
	}
	for _, n := range names {
		err := WaitFor(ctx, 60*time.Second, func() (bool, error) {
			u, err := dyn.Resource(crdResource).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w", n, err)
		}
	}
	return nil
}

// permissiveConnectionPolicyCRD serves the ConnectionPolicy kind with a
// schema that takes anything: a CRD other than the mesh's.
const permissiveConnectionPolicyCRD = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: connectionpolicies.causeway.dev}
spec:
  group: causeway.dev
  scope: Namespaced
  names: {kind: ConnectionPolicy, listKind: ConnectionPolicyList, plural: connectionpolicies, singular: connectionpolicy}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`

// InstallPermissiveConnectionPolicyCRD serves the ConnectionPolicy kind
// (after DeleteCRD of the mesh's) with a schema that takes any object, so
// that a test can create what the mesh's schema refuses.
func (e *Env) InstallPermissiveConnectionPolicyCRD(t testing.TB) {
	t.Helper()
	if err := e.createCRDs([]string{permissiveConnectionPolicyCRD}); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
}

// DeleteCRD deletes a CRD and waits until its kind is no longer served.
func (e *Env) DeleteCRD(t testing.TB, name string) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	u, err := dyn.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("kubetest: CRD %s: %v", name, err)
	}
	group, _, _ := unstructured.NestedString(u.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(u.Object, "spec", "names", "plural")
	versions, _, _ := unstructured.NestedSlice(u.Object, "spec", "versions")
	if err := dyn.Resource(crdResource).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("kubetest: delete CRD %s: %v", name, err)
	}
	disc := e.Clientset(t).Discovery()
	for _, v := range versions {
		version, _ := v.(map[string]any)["name"].(string)
		gvr := schema.GroupVersionResource{Group: group, Version: version, Resource: plural}
		// Gone from the API and from discovery.
		err := WaitFor(ctx, 60*time.Second, func() (bool, error) {
			if _, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1}); !apierrors.IsNotFound(err) {
				return false, nil
			}
			res, err := disc.ServerResourcesForGroupVersion(gvr.GroupVersion().String())
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			return err == nil && !slices.ContainsFunc(res.APIResources, func(r metav1.APIResource) bool { return r.Name == plural }), nil
		})
		if err != nil {
			t.Fatalf("kubetest: %s still served: %v", gvr, err)
		}
	}
}

func tlsConfig(pool *x509.CertPool) *tls.Config {
	if pool == nil {
		return nil
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}
