package e2ek8s

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// The whole install passes the real API server's validation, admission
// and the Gateway API CRDs' schemas (the CRDs are created for real first,
// since a server-side dry run of a custom object needs its CRD served).
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
	run("apply", "--server-side", "-k", filepath.Join(root, "crds"))
	run("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
	run("apply", "--server-side", "--dry-run=server", "-k", filepath.Join(root, "overlays", "local-images"))
}
