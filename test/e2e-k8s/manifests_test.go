package e2ek8s

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// The whole install passes the real API server's validation, admission
// and the Gateway API CRDs' schemas (the CRDs and the namespace are created
// for real first: a server-side dry run needs them served).
func TestManifestsServerDryRun(t *testing.T) {
	requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	root := filepath.Join("..", "..", "manifests")
	run := func(args ...string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, kubectl, append([]string{"--kubeconfig", kubeconfig}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, out)
		}
	}
	// A dry run creates nothing, so the objects in causeway-system need
	// their namespace for real.
	run("apply", "--server-side", "-k", filepath.Join(root, "crds"))
	run("apply", "--server-side", "-f", filepath.Join(root, "core", "namespace.yaml"))
	t.Cleanup(func() {
		exec.Command(kubectl, "--kubeconfig", kubeconfig, "delete", "namespace", "causeway-system", "--wait=false").Run()
	})
	run("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
	run("apply", "--server-side", "--dry-run=server", "-k", filepath.Join(root, "overlays", "local-images"))
}
