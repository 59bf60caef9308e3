package main

import (
	"bytes"
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/causeway-mesh/causeway/pkg/localmesh"
	"github.com/causeway-mesh/causeway/pkg/policy"
)

const repoRoot = "../.."

// statusPattern finds the HTTP status a README comment announces.
var statusPattern = regexp.MustCompile(`\b[2-5]\d\d\b`)

// readmeCode returns the lines of the README's fenced code blocks of the
// given language ("" for any).
func readmeCode(t *testing.T, lang string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	in, take := false, false
	for _, line := range strings.Split(string(data), "\n") {
		if fence, ok := strings.CutPrefix(line, "```"); ok {
			in = !in
			take = in && (lang == "" || fence == lang)
			continue
		}
		if in && take {
			out = append(out, line)
		}
	}
	return out
}

// splitComment splits a shell line into its words and its # comment.
func splitComment(line string) ([]string, string) {
	cmd, comment, _ := strings.Cut(line, "#")
	return strings.Fields(cmd), comment
}

// The README's meshctl policy commands run as written, from the repository
// root (where meshctl up made its policy repository from the sample's
// policies), and eval's answer is the status its comment announces.
func TestReadmePolicyCommandsRun(t *testing.T) {
	const upRepo = ".causeway-local/policy-repo"
	repo, err := localmesh.CreatePolicyRepo(filepath.Join(t.TempDir(), "policy-repo"), filepath.Join(repoRoot, "examples", "local", "policies"))
	if err != nil {
		t.Fatal(err)
	}
	ran, fromGit := 0, 0
	for _, line := range readmeCode(t, "sh") {
		words, comment := splitComment(line)
		if len(words) < 3 || words[0] != "bin/meshctl" || words[1] != "policy" {
			continue
		}
		args := slices.Clone(words[2:])
		for i, a := range args {
			if strings.HasPrefix(a, "examples/") {
				args[i] = filepath.Join(repoRoot, a)
			}
			if rest, ok := strings.CutPrefix(a, upRepo); ok {
				args[i] = repo.Path + rest
				fromGit++
			}
		}
		var out bytes.Buffer
		if err := policyCommand(context.Background(), args, &out); err != nil {
			t.Errorf("%s: %v\n%s", line, err, out.String())
			continue
		}
		ran++
		if args[0] != "eval" {
			continue
		}
		var d policy.Decision
		if err := json.Unmarshal(out.Bytes(), &d); err != nil {
			t.Fatalf("%s: %v\n%s", line, err, out.String())
		}
		got := strconv.Itoa(d.Status)
		if d.Allowed {
			got = "200"
		}
		if want := statusPattern.FindString(comment); want != got {
			t.Errorf("%s: decision %+v, comment %q", line, d, comment)
		}
	}
	if ran < 3 || fromGit == 0 {
		t.Fatalf("found %d meshctl policy commands in the README (%d from meshctl up's Git repository), want test and eval, and one from Git", ran, fromGit)
	}
}

// A curl line announcing a status prints it.
func TestReadmeCurlLinesShowTheStatus(t *testing.T) {
	n := 0
	for _, line := range readmeCode(t, "sh") {
		words, comment := splitComment(line)
		if !slices.Contains(words, "curl") || !statusPattern.MatchString(comment) {
			continue
		}
		n++
		if !strings.Contains(line, `-w '%{http_code}`) {
			t.Errorf("README line announces a status but does not print it (-w '%%{http_code}'):\n%s", line)
		}
	}
	if n == 0 {
		t.Fatal("no curl line with a status in the README")
	}
}

// The README's causeway-policy.yaml example is a valid settings file.
func TestReadmeSettingsExampleIsValid(t *testing.T) {
	example := strings.Join(readmeCode(t, "yaml"), "\n")
	if !strings.Contains(example, "decisionPath:") {
		t.Fatalf("no settings example in the README:\n%s", example)
	}
	dir := t.TempDir()
	writeTestFiles(t, dir, map[string]string{
		policy.SettingsFile: example,
		"authz.rego":        "package envoy.http.public\n\nallow := true\n",
	})
	e, err := policy.NewEngine(policy.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Load(context.Background()); err != nil {
		t.Fatalf("the README's settings: %v", err)
	}
	if st := e.Status().Settings; st.From != policy.SettingsFile || !st.ParseBody {
		t.Errorf("settings = %+v", st)
	}
}

// The README names every package whose tests need root (they check the
// effective user id), and no other.
func TestReadmeNamesTheTestsThatNeedRoot(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "Tests that need root:")
	if !ok {
		t.Fatal(`the README has no "Tests that need root:" sentence`)
	}
	sentence, _, _ := strings.Cut(rest, ".")
	var named []string
	if strings.TrimSpace(sentence) != "none" {
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(sentence, -1) {
			named = append(named, m[1])
		}
	}
	var need []string
	fset := token.NewFileSet()
	err = filepath.WalkDir(repoRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && p != repoRoot {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			// os.Geteuid, or the capture tests' netnstest.Require.
			if sel, ok := n.(*ast.SelectorExpr); ok && (sel.Sel.Name == "Geteuid" || isNetnsRequire(sel)) {
				rel, _ := filepath.Rel(repoRoot, filepath.Dir(p))
				if !slices.Contains(need, rel) {
					need = append(need, rel)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(need)
	slices.Sort(named)
	if !slices.Equal(need, named) {
		t.Errorf("README names %q as needing root; the tests checking for root are in %q", named, need)
	}
}

func isNetnsRequire(sel *ast.SelectorExpr) bool {
	pkg, ok := sel.X.(*ast.Ident)
	return ok && pkg.Name == "netnstest" && sel.Sel.Name == "Require"
}

func TestMakeDemoTakesBasePort(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not installed")
	}
	cmd := exec.Command("make", "-n", "demo", "BASE_PORT=19999")
	cmd.Dir = repoRoot
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n demo: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "meshctl demo") || !strings.Contains(string(out), "--base-port 19999") {
		t.Errorf("make -n demo BASE_PORT=19999:\n%s", out)
	}
}

// The README's kubectl commands name directories and files that exist:
// every -k, -f and --from-file path, from the repository root.
func TestReadmeKubectlPathsExist(t *testing.T) {
	n := 0
	for _, line := range readmeCode(t, "sh") {
		words, _ := splitComment(line)
		if len(words) == 0 || words[0] != "kubectl" {
			continue
		}
		for i, w := range words {
			var path string
			switch {
			case (w == "-k" || w == "-f") && i+1 < len(words):
				path = words[i+1]
			case strings.HasPrefix(w, "--from-file="):
				path = strings.TrimPrefix(w, "--from-file=")
			default:
				continue
			}
			n++
			checkReadmePath(t, path, line)
		}
	}
	if n < 4 {
		t.Fatalf("found %d paths in the README's kubectl commands, want the install, the sample, its policies and the uninstall", n)
	}
}

// checkReadmePath: a README command's path exists from the repository root,
// or, under dist/, is a file the release script writes there.
func checkReadmePath(t *testing.T, path, line string) {
	t.Helper()
	if rest, ok := strings.CutPrefix(path, "dist/"); ok {
		script, err := os.ReadFile(filepath.Join(repoRoot, "hack", "chart", "release.sh"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(script), `$OUT/`+rest) {
			t.Errorf("README line names %s, which hack/chart/release.sh does not write:\n%s", path, line)
		}
		return
	}
	if _, err := os.Stat(filepath.Join(repoRoot, path)); err != nil {
		t.Errorf("README line names a path that does not exist: %v\n%s", err, line)
	}
}

// The README's helm install and upgrade commands render: the same chart,
// namespace and values given to `helm template` (with Helm from
// hack/chart/helm.sh) pass the chart's schema and templates.
func TestReadmeHelmCommandsRender(t *testing.T) {
	helm := os.Getenv("CAUSEWAY_HELM")
	if helm == "" {
		home, _ := os.UserHomeDir()
		helm = filepath.Join(home, ".cache", "causeway", "helm-v4.3.2", "helm")
	}
	if _, err := os.Stat(helm); err != nil {
		t.Skipf("helm not found at %s (hack/chart/helm.sh builds it; make test sets CAUSEWAY_HELM): %v", helm, err)
	}
	n := 0
	for _, line := range readmeCode(t, "sh") {
		words, _ := splitComment(line)
		if len(words) < 4 || words[0] != "helm" || (words[1] != "install" && words[1] != "upgrade") {
			continue
		}
		n++
		args := []string{"template", words[2]}
		for i := 3; i < len(words); i++ {
			switch w := words[i]; {
			case w == "--create-namespace" || w == "--reuse-values":
				// install and upgrade only; the render needs neither
			case w == "--values" || w == "-f":
				if i+1 < len(words) {
					checkReadmePath(t, words[i+1], line)
				}
				args = append(args, w)
			case strings.HasPrefix(w, "charts/"):
				checkReadmePath(t, w, line)
				args = append(args, filepath.Join(repoRoot, w))
			case strings.HasPrefix(w, "manifests/"):
				args = append(args, filepath.Join(repoRoot, w))
			default:
				args = append(args, w)
			}
		}
		if out, err := exec.Command(helm, args...).CombinedOutput(); err != nil {
			t.Errorf("README line does not render: helm %s: %v\n%s\n%s", strings.Join(args, " "), err, out, line)
		}
	}
	if n < 3 {
		t.Fatalf("found %d helm install or upgrade commands in the README, want the install, the test cluster's and the upgrade", n)
	}
}
