package manifests

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

const repoRoot = "../.."

// helm finds the Helm that hack/chart/helm.sh builds, or skips.
func helm(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("CAUSEWAY_HELM")
	if bin == "" {
		home, _ := os.UserHomeDir()
		bin = filepath.Join(home, ".cache", "causeway", "helm-v4.3.2", "helm")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("helm not found at %s (hack/chart/helm.sh builds it; make test sets CAUSEWAY_HELM): %v", bin, err)
	}
	return bin
}

// helmTemplate renders the chart with args; it returns the objects, or
// helm's error output when it refuses.
func helmTemplate(t *testing.T, args ...string) ([]*unstructured.Unstructured, string) {
	t.Helper()
	cmd := exec.Command(helm(t), append([]string{"template", "causeway", filepath.Join(repoRoot, "charts", "causeway"), "--namespace", "causeway-system"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return nil, stderr.String()
	}
	return decodeObjects(t, "helm template", out), ""
}

// Values the schema or the templates refuse fail `helm template` (and so
// `helm install`) with a message naming the value.
func TestChartRefusesBadValues(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"wrong type", []string{"--set", "controlPlane.replicas=two"}, "at '/controlPlane/replicas': got string, want integer"},
		{"unknown key", []string{"--set", "controlPlane.replica=3"}, "at '/controlPlane': additional properties 'replica' not allowed"},
		{"unknown top-level key", []string{"--set", "registry=r.example"}, "additional properties 'registry' not allowed"},
		{"no replica", []string{"--set", "controlPlane.replicas=0"}, "at '/controlPlane/replicas': minimum: got 0, want 1"},
		{"no waypoint replica", []string{"--set", "waypoint.replicas=0"}, "at '/waypoint/replicas': minimum: got 0, want 1"},
		{"digest", []string{"--set", "images.nodeproxy.digest=sha256:abc"}, "at '/images/nodeproxy/digest'"},
		{"gateway addresses not a list", []string{"--set", "gatewayAddresses=192.0.2.0/28"}, "at '/gatewayAddresses': got string, want array"},
		{"gateway address not a CIDR", []string{"--set-json", `gatewayAddresses=["edge.example.com"]`}, "at '/gatewayAddresses/0'"},
		{"log level", []string{"--set", "logLevel=verbose"}, "at '/logLevel': value must be one of 'debug', 'info', 'warn', 'error'"},
		{"pull policy", []string{"--set", "image.pullPolicy=Sometimes"}, "at '/image/pullPolicy'"},
		{"relative CNI directory", []string{"--set", "cni.binDir=opt/cni/bin"}, "at '/cni/binDir'"},
		{"resources", []string{"--set", "nodeProxy.resources.limits.cpu=lots"}, "at '/nodeProxy/resources/limits/cpu'"},
		{"toleration", []string{"--set-json", `nodeProxy.tolerations=[{"operator":"Exist"}]`}, "at '/nodeProxy/tolerations/0/operator'"},
		{"policy set named twice", []string{"--set-json", `controlPlane.connectionPolicySets=[{"name":"a"},{"name":"a"}]`}, `the set "a" is named twice`},
		{"another namespace", []string{"--namespace", "mesh"}, `causeway installs into the namespace causeway-system (its identities name it), not "mesh"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			objs, stderr := helmTemplate(t, c.args...)
			if objs != nil {
				t.Fatalf("helm template %v rendered %d objects, want a refusal", c.args, len(objs))
			}
			if !strings.Contains(stderr, c.want) {
				t.Errorf("helm template %v:\n%s\nwant it to say %q", c.args, stderr, c.want)
			}
		})
	}
}

// The values reach the objects: images by digest or tag from another
// registry, log levels, scheduling, the CNI directories, one control plane
// replica (no PodDisruptionBudget then), more connection policy sets, the
// CIDRs of static Gateway addresses; and the install's invariants hold for
// them.
func TestChartValues(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	objs, stderr := helmTemplate(t,
		"--set", "image.registry=registry.example:5000/mesh", "--set", "image.tag=v1.2.3",
		"--set", "images.nodeproxy.digest="+digest, "--set", "images.waypoint.digest="+digest,
		"--set", "images.agent.registry=other.example", "--set", "image.pullPolicy=Always",
		"--set", "logLevel=warn", "--set", "nodeProxy.agent.logLevel=debug",
		"--set", "cni.binDir=/home/kubernetes/bin", "--set", "cni.confDir=/var/lib/rancher/k3s/agent/etc/cni/net.d",
		"--set", "controlPlane.replicas=1", "--set", "waypoint.replicas=3", "--set-json", `controlPlane.nodeSelector={"pool":"system"}`,
		"--set-json", `controlPlane.connectionPolicySets=[{"name":"default"},{"name":"shared","source":"git:https://git.example/p.git"}]`,
		"--set-json", `gatewayAddresses=["192.0.2.0/28","2001:db8::/120"]`,
		"--set", "imagePullSecrets[0]=pull")
	if objs == nil {
		t.Fatal(stderr)
	}
	var ds *appsv1.DaemonSet
	var cp *appsv1.Deployment
	for _, u := range objs {
		switch {
		case u.GetKind() == "PodDisruptionBudget":
			t.Errorf("a PodDisruptionBudget %s for one control plane replica (it would block every drain)", u.GetName())
		case u.GetKind() == "Namespace":
			t.Errorf("the Namespace is rendered without namespace.create")
		case u.GetKind() == "DaemonSet":
			ds = convert[appsv1.DaemonSet](t, u)
		case u.GetKind() == "Deployment":
			cp = convert[appsv1.Deployment](t, u)
		}
	}
	if ds == nil || cp == nil {
		t.Fatal("no DaemonSet or Deployment rendered")
	}
	images := map[string]string{}
	for _, c := range append(append(ds.Spec.Template.Spec.InitContainers, ds.Spec.Template.Spec.Containers...), cp.Spec.Template.Spec.Containers...) {
		images[c.Name] = c.Image
		if c.ImagePullPolicy != corev1.PullAlways {
			t.Errorf("%s: pull policy %s, want Always", c.Name, c.ImagePullPolicy)
		}
	}
	want := map[string]string{
		"install-cni":  "registry.example:5000/mesh/causeway-cni:v1.2.3",
		"agent":        "other.example/causeway-agent:v1.2.3",
		"nodeproxy":    "registry.example:5000/mesh/nodeproxy@" + digest,
		"controlplane": "registry.example:5000/mesh/controlplane:v1.2.3",
	}
	for name, image := range want {
		if images[name] != image {
			t.Errorf("%s: image %s, want %s", name, images[name], image)
		}
	}
	args := func(spec corev1.PodSpec, name string) []string {
		for _, c := range spec.Containers {
			if c.Name == name {
				return c.Args
			}
		}
		return nil
	}
	cpArgs := args(cp.Spec.Template.Spec, "controlplane")
	for _, a := range []string{"--waypoint-image=registry.example:5000/mesh/waypoint@" + digest, "--log-level=warn",
		"--waypoint-image-pull-policy=Always", "--waypoint-replicas=3", "--gateway-address-cidrs=192.0.2.0/28,2001:db8::/120",
		"--connection-policy=default=dir:/etc/causeway/connection-policies/default", "--connection-policy=shared=git:https://git.example/p.git"} {
		if !slices.Contains(cpArgs, a) {
			t.Errorf("control plane args %q, want %s", cpArgs, a)
		}
	}
	if v := cp.Spec.Template.Spec.Volumes; len(v) != 1 || v[0].ConfigMap == nil || v[0].ConfigMap.Name != "connection-policy-default" {
		t.Errorf("control plane volumes %+v, want the ConfigMap of the set default alone", v)
	}
	if *cp.Spec.Replicas != 1 || cp.Spec.Template.Spec.NodeSelector["pool"] != "system" || cp.Spec.Template.Spec.ImagePullSecrets[0].Name != "pull" {
		t.Errorf("control plane: replicas %d, nodeSelector %v, pull secrets %v", *cp.Spec.Replicas, cp.Spec.Template.Spec.NodeSelector, cp.Spec.Template.Spec.ImagePullSecrets)
	}
	if a := args(ds.Spec.Template.Spec, "agent"); !slices.Contains(a, "--log-level=debug") {
		t.Errorf("agent args %q, want its own --log-level=debug", a)
	}
	if a := args(ds.Spec.Template.Spec, "nodeproxy"); !slices.Contains(a, "--log-level=warn") {
		t.Errorf("node proxy args %q, want the global --log-level=warn", a)
	}
	hostPaths := map[string]string{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	if hostPaths["cni-bin"] != "/home/kubernetes/bin" || hostPaths["cni-conf"] != "/var/lib/rancher/k3s/agent/etc/cni/net.d" {
		t.Errorf("CNI host paths %v", hostPaths)
	}
	for name, spec := range podSpecs(t, objs) {
		for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
			checkContainer(t, name+"/"+c.Name, c)
		}
	}
	checkRBAC(t, objs)
}

// The drift check passes on the repository as committed, and fails, naming
// the file and line, when a copy's chart or generated manifests differ.
func TestDriftCheck(t *testing.T) {
	h := helm(t)
	copyRepo := func(t *testing.T) string {
		dir := t.TempDir()
		for _, p := range []string{"charts", "manifests", "go.mod", "go.sum"} {
			if out, err := exec.Command("cp", "-a", filepath.Join(repoRoot, p), dir).CombinedOutput(); err != nil {
				t.Fatalf("cp %s: %v\n%s", p, err, out)
			}
		}
		return dir
	}
	check := func(t *testing.T, repo string, extra ...string) (string, error) {
		cmd := exec.Command("go", append([]string{"run", "./hack/manifests", "-helm", h, "-repo", repo}, extra...)...)
		cmd.Dir = repoRoot
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	edit := func(t *testing.T, path, old, new string) {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(data, []byte(old)) {
			t.Fatalf("%s has no %q", path, old)
		}
		if err := os.WriteFile(path, bytes.Replace(data, []byte(old), []byte(new), 1), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	base := copyRepo(t)
	if out, err := check(t, base, "-check"); err != nil {
		t.Fatalf("the committed manifests are not what the chart renders: %v\n%s", err, out)
	}
	for _, c := range []struct {
		name   string
		mutate func(repo string)
		want   string
	}{
		{"chart default changed", func(repo string) {
			edit(t, filepath.Join(repo, "charts/causeway/values.yaml"), "  replicas: 2\n", "  replicas: 3\n")
		}, `manifests/core/controlplane.yaml: differs at line`},
		{"generated manifest edited", func(repo string) {
			edit(t, filepath.Join(repo, "manifests/core/nodeproxy.yaml"), "maxSurge: 1", "maxSurge: 2")
		}, `manifests/core/nodeproxy.yaml: differs at line`},
		{"template edited", func(repo string) {
			edit(t, filepath.Join(repo, "charts/causeway/templates/webhook.yaml"), "timeoutSeconds: 5", "timeoutSeconds: 6")
		}, `manifests/core/webhook.yaml: differs at line`},
		{"file not generated", func(repo string) {
			if err := os.WriteFile(filepath.Join(repo, "manifests/core/extra.yaml"), []byte("kind: ConfigMap\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, `manifests/core/extra.yaml: not generated from the chart`},
		{"generated file removed", func(repo string) {
			if err := os.Remove(filepath.Join(repo, "charts/causeway/crds/gateway-api-standard.yaml")); err != nil {
				t.Fatal(err)
			}
		}, `charts/causeway/crds/gateway-api-standard.yaml: missing`},
	} {
		t.Run(c.name, func(t *testing.T) {
			repo := copyRepo(t)
			c.mutate(repo)
			out, err := check(t, repo, "-check")
			if err == nil || !strings.Contains(out, c.want) || !strings.Contains(out, "run `make manifests`") {
				t.Fatalf("drift check after %s: %v\n%s\nwant a failure saying %q", c.name, err, out, c.want)
			}
			// make manifests brings the copy back in line.
			if out, err := check(t, repo); err != nil {
				t.Fatalf("write: %v\n%s", err, out)
			}
			if out, err := check(t, repo, "-check"); err != nil {
				t.Fatalf("check after writing: %v\n%s", err, out)
			}
		})
	}
}

// hack/chart/release.sh packages the chart as the version and renders an
// install.yaml with every image by digest, and refuses values that leave an
// image unpinned.
func TestReleaseRender(t *testing.T) {
	t.Setenv("CAUSEWAY_HELM", helm(t))
	values := "image: {registry: registry.example:5000/causeway}\nimages:\n"
	digests := map[string]string{}
	for i, name := range []string{"controlplane", "nodeproxy", "agent", "cni", "waypoint"} {
		digests[name] = "sha256:" + strings.Repeat(string(rune('1'+i)), 64)
		values += "  " + name + ": {digest: " + digests[name] + "}\n"
	}
	run := func(values string) (string, string, error) {
		dir := t.TempDir()
		vf := filepath.Join(dir, "values.yaml")
		if err := os.WriteFile(vf, []byte(values), 0o644); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, "dist")
		cmd := exec.Command(filepath.Join(repoRoot, "hack", "chart", "release.sh"), "v1.2.3", vf, out)
		b, err := cmd.CombinedOutput()
		return out, string(b), err
	}
	out, msg, err := run(values)
	if err != nil {
		t.Fatalf("release.sh: %v\n%s", err, msg)
	}
	if _, err := os.Stat(filepath.Join(out, "causeway-1.2.3.tgz")); err != nil {
		t.Error(err)
	}
	install, err := os.ReadFile(filepath.Join(out, "install.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, d := range digests {
		img := map[string]string{"agent": "causeway-agent", "cni": "causeway-cni"}[name]
		if img == "" {
			img = name
		}
		if !strings.Contains(string(install), "registry.example:5000/causeway/"+img+"@"+d+"\n") {
			t.Errorf("install.yaml does not name %s by digest %s", img, d)
		}
	}
	for _, kind := range []string{"kind: Namespace\n", "name: gateways.gateway.networking.k8s.io\n", "name: connectionpolicies.causeway.dev\n"} {
		if !strings.Contains(string(install), kind) {
			t.Errorf("install.yaml has no %q", kind)
		}
	}
	// One image left to its tag: refused, naming it.
	_, msg, err = run(strings.Replace(values, "  waypoint: {digest: "+digests["waypoint"]+"}\n", "", 1))
	if err == nil || !strings.Contains(msg, "images not pinned by digest") || !strings.Contains(msg, "--waypoint-image=registry.example:5000/causeway/waypoint:v1.2.3") {
		t.Errorf("release.sh with the waypoint's digest missing: %v\n%s", err, msg)
	}
}

// The IngressClass causeway (docs/ingress.md): rendered by default, not the
// cluster's default class unless ingressClass.default says so; not
// rendered with ingressClass.create false.
func TestChartIngressClass(t *testing.T) {
	for _, c := range []struct {
		args            []string
		want, isDefault bool
	}{
		{nil, true, false},
		{[]string{"--set", "ingressClass.default=true"}, true, true},
		{[]string{"--set", "ingressClass.create=false"}, false, false},
	} {
		objs, stderr := helmTemplate(t, c.args...)
		if objs == nil {
			t.Fatal(stderr)
		}
		var class *unstructured.Unstructured
		for _, u := range objs {
			if u.GetKind() == "IngressClass" {
				class = u
			}
		}
		if (class != nil) != c.want {
			t.Errorf("%v: IngressClass rendered %v, want %v", c.args, class != nil, c.want)
			continue
		}
		if class == nil {
			continue
		}
		ctrl, _, _ := unstructured.NestedString(class.Object, "spec", "controller")
		if class.GetName() != "causeway" || ctrl != "causeway.dev/ingress-controller" ||
			(class.GetAnnotations()["ingressclass.kubernetes.io/is-default-class"] == "true") != c.isDefault {
			t.Errorf("%v: IngressClass %s (controller %s, annotations %v), default %v", c.args, class.GetName(), ctrl, class.GetAnnotations(), c.isDefault)
		}
	}
}
