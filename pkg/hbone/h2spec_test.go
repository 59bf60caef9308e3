package hbone

import (
	"context"
	"encoding/xml"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// h2specPath finds the h2spec binary where go install puts it: PATH,
// $(go env GOBIN) or $(go env GOPATH)/bin.
func h2specPath() (string, error) {
	if p, err := exec.LookPath("h2spec"); err == nil {
		return p, nil
	}
	out, err := exec.Command("go", "env", "GOBIN", "GOPATH").Output()
	if err != nil {
		return "", err
	}
	env := strings.SplitN(string(out), "\n", 2)
	dirs := []string{strings.TrimSpace(env[0])}
	if len(env) > 1 {
		for _, dir := range filepath.SplitList(strings.TrimSpace(env[1])) {
			dirs = append(dirs, filepath.Join(dir, "bin"))
		}
	}
	for _, dir := range dirs {
		p := filepath.Join(dir, "h2spec")
		if _, err := os.Stat(p); dir != "" && err == nil {
			return p, nil
		}
	}
	return "", errors.New("not in PATH, $(go env GOBIN) or $(go env GOPATH)/bin")
}

// h2specReport is the part of h2spec's JUnit report we read.
type h2specReport struct {
	Suites []struct {
		Name  string `xml:"name,attr"`
		Cases []struct {
			Package   string    `xml:"package,attr"`
			ClassName string    `xml:"classname,attr"`
			Failure   *struct{} `xml:"failure"`
			Error     *struct{} `xml:"error"`
			Skipped   *struct{} `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// The server passes every h2spec (RFC 7540/9113 and HPACK) case, over TLS
// without a client certificate (an unauthenticated peer, as a waypoint
// accepts). h2spec speaks GET and POST, which the server answers with 405
// and a body, and that is all its cases need. The server runs with its
// defaults, as the waypoint and node proxies do.
// H2SPEC_ARGS adds arguments to h2spec (sections such as http2/5.1, or -v).
func TestH2Spec(t *testing.T) {
	bin, err := h2specPath()
	if err != nil {
		t.Skipf("h2spec not installed (go install github.com/summerwind/h2spec/cmd/h2spec@v2.2.1+incompatible): %v", err)
	}
	m := newMesh(t)
	_, addr := startServer(t, m, &dialHandler{}, nil)
	report := filepath.Join(t.TempDir(), "h2spec.xml")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-t", "-k", "-h", addr.Addr().String(),
		"-p", strconv.Itoa(int(addr.Port())), "-o", "5", "-j", report)
	if extra := os.Getenv("H2SPEC_ARGS"); extra != "" {
		cmd.Args = append(cmd.Args, strings.Fields(extra)...)
	}
	out, runErr := cmd.CombinedOutput()
	if testing.Verbose() {
		t.Logf("%s", out)
	}
	raw, err := os.ReadFile(report)
	if err != nil {
		t.Fatalf("h2spec wrote no report (%v): %v\n%s", runErr, err, out)
	}
	var rep h2specReport
	if err := xml.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("reading h2spec's report: %v", err)
	}
	var failed []string
	passed, skipped := 0, 0
	for _, s := range rep.Suites {
		for _, c := range s.Cases {
			switch {
			case c.Failure != nil || c.Error != nil:
				failed = append(failed, c.Package+" "+s.Name+": "+c.ClassName)
			case c.Skipped != nil:
				skipped++
			default:
				passed++
			}
		}
	}
	t.Logf("h2spec: %d passed, %d skipped, %d failed", passed, skipped, len(failed))
	if passed == 0 {
		t.Fatalf("h2spec ran no case (%v):\n%s", runErr, out)
	}
	if len(failed) > 0 {
		t.Errorf("h2spec cases failed:\n  %s", strings.Join(failed, "\n  "))
	}
}
