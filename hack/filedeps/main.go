// Command filedeps prints which files of a Go package use declarations of
// which other files of it, so that a package can keep its files in an
// order a reader can follow, each using only those before it.
//
//	go run ./hack/filedeps [-v] DIR    every file-to-file edge (-v: and the names behind it)
//	go run ./hack/filedeps -check DIR  exit 1 if a file uses one listed after it
//
// -check reads the order from DIR/doc.go: the files named at the start of
// its tab-indented comment lines, lowest first. Test files are left out.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

func main() {
	verbose := flag.Bool("v", false, "name the declarations behind each edge")
	check := flag.Bool("check", false, "check the order listed in DIR/doc.go")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: filedeps [-v] [-check] DIR")
		os.Exit(2)
	}
	dir := flag.Arg(0)
	edges, err := fileEdges(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "filedeps:", err)
		os.Exit(2)
	}
	if !*check {
		for _, e := range edges {
			fmt.Println(e.format(*verbose))
		}
		return
	}
	order, err := listedOrder(filepath.Join(dir, "doc.go"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "filedeps:", err)
		os.Exit(2)
	}
	bad := violations(dir, edges, order)
	for _, b := range bad {
		fmt.Println(b)
	}
	if len(bad) > 0 {
		os.Exit(1)
	}
}

// edge is a file using declarations (package-level names, methods, fields)
// of another file of the package.
type edge struct {
	from, to string
	names    []string
}

func (e edge) format(verbose bool) string {
	s := fmt.Sprintf("%s -> %s (%d)", e.from, e.to, len(e.names))
	if verbose {
		s += ": " + strings.Join(e.names, ", ")
	}
	return s
}

func fileEdges(dir string) ([]edge, error) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi os.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		return nil, err
	}
	if len(pkgs) != 1 {
		return nil, fmt.Errorf("%s: want one package, found %d", dir, len(pkgs))
	}
	var files []*ast.File
	for _, p := range pkgs {
		for _, f := range p.Files {
			files = append(files, f)
		}
	}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil)}
	pkg, err := conf.Check(dir, fset, files, info)
	if err != nil {
		return nil, err
	}
	file := func(p token.Pos) string { return filepath.Base(fset.Position(p).Filename) }
	byPair := map[[2]string]map[string]bool{}
	for id, obj := range info.Uses {
		if obj.Pkg() != pkg || !obj.Pos().IsValid() {
			continue
		}
		name, ok := declName(obj, pkg)
		if !ok {
			continue
		}
		k := [2]string{file(id.Pos()), file(obj.Pos())}
		if k[0] == k[1] {
			continue
		}
		if byPair[k] == nil {
			byPair[k] = map[string]bool{}
		}
		byPair[k][name] = true
	}
	var out []edge
	for k, names := range byPair {
		e := edge{from: k[0], to: k[1]}
		for n := range names {
			e.names = append(e.names, n)
		}
		sort.Strings(e.names)
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].from != out[j].from {
			return out[i].from < out[j].from
		}
		return out[i].to < out[j].to
	})
	return out, nil
}

// declName names obj if it is declared at package level, or is a method or
// a struct field: what one file can use of another.
func declName(obj types.Object, pkg *types.Package) (string, bool) {
	qual := func(*types.Package) string { return "" }
	switch o := obj.(type) {
	case *types.Func:
		if r := o.Type().(*types.Signature).Recv(); r != nil {
			return types.TypeString(r.Type(), qual) + "." + o.Name(), true
		}
	case *types.Var:
		if o.IsField() {
			return "field " + o.Name(), true
		}
	}
	return obj.Name(), obj.Parent() == pkg.Scope()
}

var listed = regexp.MustCompile(`^//\t(\S+\.go)\b`)

func listedOrder(doc string) ([]string, error) {
	f, err := os.Open(doc)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var order []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := listed.FindStringSubmatch(sc.Text()); m != nil {
			order = append(order, m[1])
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(order) == 0 {
		return nil, fmt.Errorf("%s lists no files", doc)
	}
	return order, nil
}

func violations(dir string, edges []edge, order []string) []string {
	rank := map[string]int{}
	for i, f := range order {
		rank[f] = i
	}
	var bad []string
	names, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	for _, n := range names {
		b := filepath.Base(n)
		if _, ok := rank[b]; !ok && !strings.HasSuffix(b, "_test.go") && b != "doc.go" {
			bad = append(bad, b+": not listed in doc.go")
		}
	}
	for _, e := range edges {
		rf, okf := rank[e.from]
		rt, okt := rank[e.to]
		if okf && okt && rt > rf {
			bad = append(bad, e.format(true)+": uses a file listed after it")
		}
	}
	return bad
}
