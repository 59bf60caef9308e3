package conformance

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	confv1 "sigs.k8s.io/gateway-api/conformance/apis/v1"
	"sigs.k8s.io/gateway-api/conformance/utils/suite"
	"sigs.k8s.io/gateway-api/pkg/features"
	"sigs.k8s.io/yaml"
)

// TestPublishedReports checks the reports committed under
// conformance/reports (no cluster needed): each is named as the
// gateway-api repository requires (<channel>-<version>-<mode>-report.yaml,
// in the folder of the minor version of the Gateway API CRDs manifests/
// installs), listed in its README, names this implementation, succeeded in
// every profile it ran, and claims in each profile exactly the extended
// features TestMesh or TestGateway claims, so a claim cannot change
// without a new report.
func TestPublishedReports(t *testing.T) {
	api := bundleVersion(t)
	minor := api[:strings.LastIndex(api, ".")]
	dir := filepath.Join("..", "..", "conformance", "reports", minor, implementation.Organization+"-"+implementation.Project)
	files, err := filepath.Glob(filepath.Join(dir, "*-report.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no report in %s (gateway-api %s): %v", dir, api, err)
	}
	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var r confv1.ConformanceReport
		if err := yaml.UnmarshalStrict(data, &r); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		name := filepath.Base(file)
		want := r.GatewayAPIChannel + "-" + r.Version + "-" + r.Mode + "-report.yaml"
		if name != want || !strings.Contains(string(readme), "(./"+name+")") {
			t.Errorf("%s: want the name %s, listed in README.md", name, want)
		}
		impl := r.Implementation
		impl.Version = ""
		if !slices.Equal(impl.Contact, implementation.Contact) || impl.Organization != implementation.Organization ||
			impl.Project != implementation.Project || impl.URL != implementation.URL || r.Version == "" || strings.HasSuffix(r.Version, "-dirty") {
			t.Errorf("%s: implementation %+v, want %+v at a committed version", name, r.Implementation, implementation)
		}
		if r.GatewayAPIVersion != api {
			t.Errorf("%s: Gateway API %s, want %s (manifests/crds)", name, r.GatewayAPIVersion, api)
		}
		for _, p := range r.ProfileReports {
			if p.Core.Result != confv1.Success || p.Extended != nil && p.Extended.Result != confv1.Success {
				t.Errorf("%s: profile %s: %s", name, p.Name, p.Summary)
			}
			want, ok := claims[suite.ConformanceProfileName(p.Name)]
			if !ok {
				t.Errorf("%s: profile %s is not one test/conformance runs", name, p.Name)
				continue
			}
			// (The suite leaves out a profile's extended part when none
			// of its tests is extended, as in MESH-GRPC.)
			if p.Extended != nil && !slices.Equal(p.Extended.SupportedFeatures, want) {
				t.Errorf("%s: %s claims %v, test/conformance %v", name, p.Name, p.Extended.SupportedFeatures, want)
			}
		}
	}
}

// claims are the extended features each profile test/conformance runs
// claims, as its report lists them: those of the test's claimed features
// the profile has.
var claims = func() map[suite.ConformanceProfileName][]string {
	out := map[suite.ConformanceProfileName][]string{}
	for _, pc := range []struct {
		profile suite.ConformanceProfile
		claimed []features.FeatureName
	}{
		{suite.MeshHTTPConformanceProfile, meshFeatures}, {suite.MeshGRPCConformanceProfile, meshFeatures},
		{suite.GatewayHTTPConformanceProfile, gatewayFeatures}, {suite.GatewayGRPCConformanceProfile, gatewayFeatures},
	} {
		var names []string
		for _, f := range pc.claimed {
			if pc.profile.ExtendedFeatures.Has(f) {
				names = append(names, string(f))
			}
		}
		slices.Sort(names)
		out[pc.profile.Name] = names
	}
	return out
}()

// bundleVersion is the version of the Gateway API CRDs manifests/ installs
// (the suite reports the installed CRDs' version).
func bundleVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "manifests", "crds", "gateway-api-standard.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`gateway\.networking\.k8s\.io/bundle-version: (v\d+\.\d+\.\d+)`).FindSubmatch(data)
	if m == nil {
		t.Fatal("manifests/crds/gateway-api-standard.yaml names no bundle-version")
	}
	return string(m[1])
}
