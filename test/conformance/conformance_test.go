// Package conformance runs the official Gateway API conformance suite
// (sigs.k8s.io/gateway-api/conformance at the version go.mod pins,
// unmodified, its own manifests and echo workloads) against Causeway
// installed from manifests/ on the test cluster, and writes the suite's
// ConformanceReport. `make conformance` (hack/cluster/conformance.sh) runs
// it; without CAUSEWAY_CONFORMANCE_KUBECONFIG every test skips, so a plain
// `go test ./...` needs no cluster.
package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/gateway-api/conformance"
	confv1 "sigs.k8s.io/gateway-api/conformance/apis/v1"
	"sigs.k8s.io/gateway-api/conformance/utils/suite"
	"sigs.k8s.io/gateway-api/pkg/features"

	"github.com/causeway-mesh/causeway/internal/testcluster"
)

// The implementation as the report names it.
var implementation = confv1.Implementation{
	Organization: "causeway-mesh",
	Project:      "causeway",
	URL:          "https://github.com/causeway-mesh/causeway",
	Contact:      []string{"https://github.com/causeway-mesh/causeway/issues/new"},
}

// meshFeatures are the features Causeway claims for the MESH profiles
// (besides the profiles' core Mesh, HTTPRoute and GRPCRoute): every mesh
// extended feature, and the HTTPRoute features the mesh tests use. Each is
// claimed because its tests pass; a test whose features are not all
// claimed is skipped and reported as such.
var meshFeatures = []features.FeatureName{
	features.SupportMeshClusterIPMatching,
	features.SupportMeshConsumerRoute,
	features.SupportMeshHTTPRouteRewritePath,
	features.SupportMeshHTTPRouteSchemeRedirect,
	features.SupportMeshHTTPRouteRedirectPort,
	features.SupportMeshHTTPRouteRedirectPath,
	features.SupportMeshHTTPRouteBackendRequestHeaderModification,
	features.SupportMeshHTTPRouteQueryParamMatching,
	features.SupportMeshHTTPRouteNamedRouteRule,
	features.SupportHTTPRouteResponseHeaderModification,
	features.SupportHTTPRouteParentRefPort,
	features.SupportHTTPRoute303RedirectStatusCode,
	features.SupportHTTPRoute307RedirectStatusCode,
	features.SupportHTTPRoute308RedirectStatusCode,
}

// gatewayFeatures are the features Causeway's ingress Gateways (class
// causeway) claim for the GATEWAY profiles, besides the profiles' core
// Gateway, HTTPRoute, GRPCRoute and ReferenceGrant.
var gatewayFeatures = []features.FeatureName{
	features.SupportGatewayPort8080,
	features.SupportGatewayHTTPListenerIsolation,
	features.SupportHTTPRouteMethodMatching,
	features.SupportHTTPRouteQueryParamMatching,
	features.SupportHTTPRouteResponseHeaderModification,
	features.SupportHTTPRouteBackendRequestHeaderModification,
	features.SupportHTTPRouteSchemeRedirect,
	features.SupportHTTPRoutePortRedirect,
	features.SupportHTTPRoutePathRedirect,
	features.SupportHTTPRoutePathRewrite,
	features.SupportHTTPRouteParentRefPort,
	features.SupportHTTPRouteNamedRouteRule,
	features.SupportHTTPRoute303RedirectStatusCode,
	features.SupportHTTPRoute307RedirectStatusCode,
	features.SupportHTTPRoute308RedirectStatusCode,
	features.SupportGatewayInfrastructure,
	features.SupportGatewayAddressEmpty,
	features.SupportGatewayStaticAddresses,
	features.SupportGatewayHTTPSListenerDetectMisdirectedRequests,
	features.SupportHTTPRouteBackendProtocolH2C,
	features.SupportHTTPRouteBackendProtocolWebSocket,
	features.SupportHTTPRouteBackendTimeout,
	features.SupportHTTPRouteRequestTimeout,
	features.SupportHTTPRouteCORS,
	features.SupportHTTPRouteDestinationPortMatching,
	features.SupportHTTPRouteHostRewrite,
	features.SupportHTTPRouteRequestMirror,
	features.SupportHTTPRouteRequestMultipleMirrors,
	features.SupportHTTPRouteRequestPercentageMirror,
}

// meshLabels enroll the suite's mesh namespaces: their pods in the mesh,
// their Services bound to the namespace's waypoint (named "waypoint"). The
// suite puts them on the Namespaces it applies.
var meshLabels = map[string]string{
	"causeway.dev/dataplane-mode": "mesh",
	"causeway.dev/use-waypoint":   "waypoint",
}

// allowAll is the waypoints' Rego policy: the suite tests routing, and
// every request it makes is to be let through.
const allowAll = `package envoy.authz

default allow := true
`

func TestMesh(t *testing.T) {
	c := cluster(t)
	ctx := context.Background()
	install(t, c)
	for _, ns := range []string{suite.MeshNamespace, suite.MeshConsumerNamespace} {
		meshNamespace(t, c, ns)
	}
	for _, ns := range []string{suite.MeshNamespace, suite.MeshConsumerNamespace} {
		if err := c.Do(ctx, []string{"-n", ns, "wait", "--for=condition=Programmed", "--timeout=180s", "gateway/waypoint"}); err != nil {
			t.Fatal(err)
		}
	}

	run(t, []suite.ConformanceProfileName{suite.MeshHTTPConformanceProfileName, suite.MeshGRPCConformanceProfileName},
		meshFeatures, meshLabels, os.Getenv("CAUSEWAY_CONFORMANCE_REPORT"))
}

// TestGateway runs the GATEWAY profiles against ingress Gateways of class
// causeway. The suite's namespaces stay out of the mesh: its backends are
// plain pods, which the gateway reaches over plain TCP.
func TestGateway(t *testing.T) {
	c := cluster(t)
	install(t, c)
	gatewaySettings(t, c)
	if err := c.Do(context.Background(), []string{"wait", "--for=condition=Accepted", "--timeout=120s", "gatewayclass/causeway"}); err != nil {
		t.Fatal(err)
	}
	run(t, []suite.ConformanceProfileName{suite.GatewayHTTPConformanceProfileName, suite.GatewayGRPCConformanceProfileName},
		gatewayFeatures, nil, os.Getenv("CAUSEWAY_CONFORMANCE_GATEWAY_REPORT"), func(o *suite.ConformanceOptions) {
			o.UsableNetworkAddresses = []gwv1.GatewaySpecAddress{{Type: new(gwv1.IPAddressType), Value: usableAddress}}
			o.UnusableNetworkAddresses = []gwv1.GatewaySpecAddress{{Type: new(gwv1.IPAddressType), Value: unusableAddress}}
		})
}

// The static addresses of GatewayStaticAddresses: one of the test
// cluster's range for them (testcluster.StaticAddressRange), which the
// suite's Gateway takes (its Service's externalIP, served by kube-proxy on
// the nodes), and one off it, in the node range (hack/cluster/lib.sh
// NODE_RANGE), which the host blackholes but for the nodes' own addresses
// (.1 to .3).
const (
	usableAddress   = "10.250.1.1"
	unusableAddress = "10.250.0.200"
)

// run runs the suite's profiles, claiming the features, with the labels on
// the Namespaces it applies, and writes its report to the file report
// (none when empty), with the options set changes.
func run(t *testing.T, profiles []suite.ConformanceProfileName, claimed []features.FeatureName, labels map[string]string, report string, set ...func(*suite.ConformanceOptions)) {
	t.Helper()
	opts := conformance.DefaultOptions(t)
	opts.GatewayClassName = "causeway"
	opts.ConformanceProfiles = profiles
	opts.SupportedFeatures = claimed
	opts.NamespaceLabels = labels
	opts.CleanupBaseResources = true
	opts.Mode = "default"
	opts.Implementation = implementation
	opts.Implementation.Version = os.Getenv("CAUSEWAY_CONFORMANCE_VERSION")
	opts.ReportOutputPath = report
	for _, f := range set {
		f(&opts)
	}
	if report != "" {
		if err := os.MkdirAll(filepath.Dir(report), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	conformance.RunConformanceWithOptions(t, opts)
}

// cluster is the test cluster named by CAUSEWAY_CONFORMANCE_KUBECONFIG,
// which the suite's clients use too (KUBECONFIG); without it the test
// skips.
func cluster(t *testing.T) *testcluster.Cluster {
	t.Helper()
	kubeconfig := os.Getenv("CAUSEWAY_CONFORMANCE_KUBECONFIG")
	if kubeconfig == "" {
		t.Skip("no cluster: CAUSEWAY_CONFORMANCE_KUBECONFIG is not set (make conformance sets it and brings a cluster up)")
	}
	kubectl := os.Getenv("CAUSEWAY_CONFORMANCE_KUBECTL")
	if kubectl == "" {
		kubectl = "kubectl"
	}
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kubeconfig)
	return &testcluster.Cluster{Kubectl: kubectl, Kubeconfig: kubeconfig, Repo: repo}
}

// install installs Causeway from manifests/ with the images
// hack/cluster/images.sh pushed (its overlay), and removes it when the test
// ends.
func install(t *testing.T, c *testcluster.Cluster) {
	t.Helper()
	if _, err := os.Stat(c.Overlay()); err != nil {
		t.Fatalf("the images' overlay: %v (hack/cluster/images.sh writes it)", err)
	}
	t.Cleanup(func() {
		if err := c.UninstallMesh(context.Background()); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})
	if err := c.InstallMesh(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// gatewaySettings has the control plane deploy every gateway with one
// replica (--waypoint-replicas=1) instead of the manifests' two: the suite
// keeps a dozen Gateways at once, and two pods of each, at the 100m CPU a
// gateway pod requests, do not fit the test cluster's two cores. And it
// lets ingress Gateways take static addresses from the test cluster's
// range for them (--gateway-address-cidrs), for GatewayStaticAddresses.
func gatewaySettings(t *testing.T, c *testcluster.Cluster) {
	t.Helper()
	ctx := context.Background()
	out, err := c.Run(ctx, time.Minute, "", "-n", testcluster.SystemNS, "get", "deployment", testcluster.ControlPlane, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("the control plane's Deployment: %v", err)
	}
	for ci, ctr := range d.Spec.Template.Spec.Containers {
		for ai, arg := range ctr.Args {
			if strings.HasPrefix(arg, "--waypoint-replicas=") {
				args := fmt.Sprintf("/spec/template/spec/containers/%d/args", ci)
				patch := fmt.Sprintf(`[{"op":"replace","path":"%s/%d","value":"--waypoint-replicas=1"},{"op":"add","path":"%s/-","value":"--gateway-address-cidrs=%s"}]`,
					args, ai, args, testcluster.StaticAddressRange)
				if err := c.Do(ctx,
					[]string{"-n", testcluster.SystemNS, "patch", "deployment", testcluster.ControlPlane, "--type=json", "-p", patch},
					[]string{"-n", testcluster.SystemNS, "rollout", "status", "deployment/" + testcluster.ControlPlane, "--timeout=180s"},
				); err != nil {
					t.Fatal(err)
				}
				return
			}
		}
	}
	t.Fatal("the control plane's Deployment has no --waypoint-replicas argument")
}

// meshNamespace makes ns ahead of the suite, enrolled, with its waypoint
// (allowing everything) deployed by the control plane, and deletes it when
// the test ends: the suite applies its own Namespace object over it (with
// meshLabels) and leaves it to whoever made it.
func meshNamespace(t *testing.T, c *testcluster.Cluster, ns string) {
	t.Helper()
	var labels []string
	for k, v := range meshLabels {
		labels = append(labels, fmt.Sprintf("    %s: %s", k, v))
	}
	policy := strings.ReplaceAll(strings.TrimSpace(allowAll), "\n", "\n    ")
	objects := fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: %[1]s
  labels:
%[2]s
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: waypoint-policies
  namespace: %[1]s
data:
  authz.rego: |
    %[3]s
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: waypoint
  namespace: %[1]s
  labels:
    causeway.dev/waypoint-for: service
spec:
  gatewayClassName: causeway-waypoint
  listeners:
  - name: mesh
    port: 15008
    protocol: HBONE
`, ns, strings.Join(labels, "\n"), policy)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		if err := c.Do(ctx, []string{"delete", "namespace", ns, "--ignore-not-found", "--wait=true"}); err != nil {
			t.Errorf("delete namespace %s: %v", ns, err)
		}
	})
	if err := c.Apply(context.Background(), objects); err != nil {
		t.Fatal(err)
	}
}
