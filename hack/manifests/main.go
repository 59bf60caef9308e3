// Command manifests writes, or checks, what is generated from the Helm
// chart (charts/causeway), the one source of the install:
//
//   - manifests/core: the chart rendered with its default values (and its
//     Namespace), one file per template, for `kubectl apply -k`;
//   - manifests/crds/gateway-api-standard.yaml and the chart's
//     crds/gateway-api-standard.yaml: the Gateway API standard-channel CRDs
//     of the sigs.k8s.io/gateway-api module the code is built against.
//
// `make manifests` writes them; `make test` runs it with -check, which fails
// on any difference (a file changed, missing or left over).
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

const (
	chartDir         = "charts/causeway"
	coreDir          = "manifests/core"
	crdsFile         = "gateway-api-standard.yaml"
	namespace        = "causeway-system"
	gatewayAPIModule = "sigs.k8s.io/gateway-api"
)

func main() {
	helm := flag.String("helm", "helm", "the helm binary")
	repo := flag.String("repo", ".", "the repository's root")
	check := flag.Bool("check", false, "compare with the files instead of writing them; exit 1 on any difference")
	flag.Parse()
	files, err := generate(*helm, *repo)
	if err == nil && *check {
		var diffs []string
		if diffs, err = compare(*repo, files); err == nil && len(diffs) > 0 {
			err = fmt.Errorf("generated from %s, out of date (run `make manifests` and commit):\n  %s", chartDir, strings.Join(diffs, "\n  "))
		}
	} else if err == nil {
		err = write(*repo, files)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "manifests:", err)
		os.Exit(1)
	}
}

// generate returns the generated files' contents by path relative to repo.
func generate(helm, repo string) (map[string][]byte, error) {
	chart := filepath.Join(repo, chartDir)
	core, err := render(helm, chart, "--set", "namespace.create=true")
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{}
	var names []string
	for _, t := range core {
		files[filepath.Join(coreDir, t.name)] = []byte(fmt.Sprintf(header, "templates/"+t.name) + strings.Join(t.docs, "---\n"))
		names = append(names, t.name)
	}
	slices.Sort(names)
	files[filepath.Join(coreDir, "kustomization.yaml")] = kustomization(names)
	for path, crdsOnly := range map[string]bool{filepath.Join("manifests", "crds", crdsFile): false, filepath.Join(chartDir, "crds", crdsFile): true} {
		if files[path], err = gatewayCRDs(repo, crdsOnly); err != nil {
			return nil, err
		}
	}
	return files, nil
}

const header = "# Generated from charts/causeway (%s) by `make manifests`:\n# edit the chart, not this file.\n"

// sourceLine starts each document of `helm template`'s output.
var sourceLine = regexp.MustCompile(`(?m)^# Source: [^/\n]+/templates/([^\n]+)\n`)

// template is the documents of one template file, in Helm's install order.
type template struct {
	name string
	docs []string
}

// render runs `helm template` on the chart with args and groups the
// documents by template file, in the order each file first appears.
func render(helm, chart string, args ...string) ([]template, error) {
	cmd := exec.Command(helm, append([]string{"template", "causeway", chart, "--namespace", namespace}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm template %s: %v: %s", chart, err, bytes.TrimSpace(stderr.Bytes()))
	}
	var ts []template
	index := map[string]int{}
	for _, doc := range strings.Split(string(out), "\n---\n") {
		doc = strings.TrimPrefix(doc, "---\n")
		m := sourceLine.FindStringSubmatchIndex(doc)
		if m == nil {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			return nil, fmt.Errorf("helm template %s: a document without a source line:\n%.200s", chart, doc)
		}
		name := doc[m[2]:m[3]]
		if filepath.Base(name) != name || filepath.Ext(name) != ".yaml" {
			return nil, fmt.Errorf("helm template %s: template %q is not a YAML file at the top of templates/", chart, name)
		}
		i, ok := index[name]
		if !ok {
			i = len(ts)
			index[name] = i
			ts = append(ts, template{name: name})
		}
		ts[i].docs = append(ts[i].docs, strings.TrimSpace(doc[m[1]:])+"\n")
	}
	if len(ts) == 0 {
		return nil, fmt.Errorf("helm template %s: no documents", chart)
	}
	return ts, nil
}

func kustomization(files []string) []byte {
	var b strings.Builder
	b.WriteString(fmt.Sprintf(header, "templates/*") + "# Causeway without the Gateway API CRDs (for clusters that have them).\n")
	b.WriteString("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n")
	for _, f := range files {
		b.WriteString("- " + f + "\n")
	}
	return []byte(b.String())
}

// kindLine finds the kinds of a file's objects.
var kindLine = regexp.MustCompile(`(?m)^kind: (\S+)$`)

// gatewayCRDs concatenates the standard channel's files in the order of
// the module's config/crd/kustomization.yaml. crdsOnly leaves out the files
// of other kinds (its ValidatingAdmissionPolicy refusing CRD downgrades),
// which a chart's crds/ directory may not hold.
func gatewayCRDs(repo string, crdsOnly bool) ([]byte, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}} {{.Version}}", gatewayAPIModule)
	cmd.Dir = repo
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("find %s: go list: %v", gatewayAPIModule, err)
	}
	dir, version, ok := strings.Cut(strings.TrimSpace(string(out)), " ")
	if !ok || dir == "" {
		return nil, fmt.Errorf("find %s: go list said %q (is the module downloaded? go mod download)", gatewayAPIModule, out)
	}
	kust, err := os.ReadFile(filepath.Join(dir, "config", "crd", "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Gateway API %s, standard channel: the CRDs Causeway is built against\n"+
		"# (sigs.k8s.io/gateway-api config/crd, the files its kustomization lists", version)
	if crdsOnly {
		b.WriteString(",\n# but for its ValidatingAdmissionPolicy")
	}
	b.WriteString(").\n# Regenerate with: make manifests\n")
	n := 0
	for _, line := range strings.Split(string(kust), "\n") {
		f, ok := strings.CutPrefix(strings.TrimSpace(line), "- standard/")
		if !ok {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, "config", "crd", "standard", f))
		if err != nil {
			return nil, err
		}
		if crdsOnly && slices.ContainsFunc(kindLine.FindAllSubmatch(data, -1), func(m [][]byte) bool { return string(m[1]) != "CustomResourceDefinition" }) {
			continue
		}
		b.WriteString("---\n")
		b.Write(data)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("%s: no standard/ files in config/crd/kustomization.yaml", dir)
	}
	return b.Bytes(), nil
}

// compare lists the generated files that differ from the repository's,
// and the files of manifests/core that nothing generates.
func compare(repo string, files map[string][]byte) ([]string, error) {
	var diffs []string
	for path, want := range files {
		got, err := os.ReadFile(filepath.Join(repo, path))
		switch {
		case errors.Is(err, os.ErrNotExist):
			diffs = append(diffs, path+": missing")
		case err != nil:
			return nil, err
		case !bytes.Equal(got, want):
			diffs = append(diffs, path+": differs"+firstDifference(got, want))
		}
	}
	extra, err := leftOver(repo, files)
	if err != nil {
		return nil, err
	}
	for _, path := range extra {
		diffs = append(diffs, path+": not generated from the chart")
	}
	slices.Sort(diffs)
	return diffs, nil
}

// leftOver lists the files of manifests/core that are not generated.
func leftOver(repo string, files map[string][]byte) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(repo, coreDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var extra []string
	for _, e := range entries {
		if p := filepath.Join(coreDir, e.Name()); files[p] == nil {
			extra = append(extra, p)
		}
	}
	return extra, nil
}

// firstDifference names the first line where got and want differ.
func firstDifference(got, want []byte) string {
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf(" at line %d: has %q, the chart renders %q", i+1, gl, wl)
		}
	}
	return ""
}

// write writes the generated files and removes left-over ones.
func write(repo string, files map[string][]byte) error {
	extra, err := leftOver(repo, files)
	if err != nil {
		return err
	}
	for _, path := range extra {
		if err := os.RemoveAll(filepath.Join(repo, path)); err != nil {
			return err
		}
	}
	for path, data := range files {
		p := filepath.Join(repo, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return err
		}
	}
	return nil
}
