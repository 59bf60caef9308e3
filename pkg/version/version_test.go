package version

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestStamped builds a command with the version stamped the way the
// Makefile does, and checks that --version reports it.
func TestStamped(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "echo")
	build := exec.Command("go", "build", "-trimpath", "-o", bin,
		"-ldflags", "-X github.com/causeway-mesh/causeway/pkg/version.version=v9.8.7-test -X github.com/causeway-mesh/causeway/pkg/version.revision=0123abcd", "../../cmd/echo")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("echo --version: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`^echo v9\.8\.7-test \(0123abcd\) go1\.\d+`).Match(out) {
		t.Fatalf("echo --version printed %q", out)
	}
}

// TestUnstamped: a test binary has no stamp and no module version, so it
// says "devel" rather than nothing.
func TestUnstamped(t *testing.T) {
	if got := Version(); got == "" || strings.ContainsAny(got, " \n") {
		t.Fatalf("Version() = %q", got)
	}
	var b strings.Builder
	Print(&b, "x")
	if !strings.HasPrefix(b.String(), "x "+Version()) || !strings.HasSuffix(b.String(), "\n") {
		t.Fatalf("Print wrote %q", b.String())
	}
}
