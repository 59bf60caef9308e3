package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/causeway-mesh/causeway/pkg/analyze"
)

func init() {
	register("analyze", "list the routes, waypoints, bindings and connection policies of a cluster that will not work, with the reasons their status gives (-A: every namespace) [-o table|json|yaml]", runAnalyze)
}

func runAnalyze(args []string) error {
	fs := flag.NewFlagSet("analyze", flag.ContinueOnError)
	all := fs.Bool("A", false, "every namespace")
	fs.BoolVar(all, "all-namespaces", false, "same as -A")
	kf, _, err := parseArgs(fs, args, true, 0, "meshctl analyze [-n NAMESPACE | -A] [-o table|json|yaml]")
	if err != nil {
		return err
	}
	c, err := kf.connect()
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(c.cfg)
	if err != nil {
		return err
	}
	ns := c.namespace
	if *all {
		ns = ""
	} else if _, err := c.client.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		return fmt.Errorf("namespace %q not found", ns)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*kubeTimeout)
	defer cancel()
	findings, err := analyze.Run(ctx, analyze.Clients{Kube: c.client, Gateway: c.gateway, Dynamic: dyn}, ns)
	if err != nil {
		return err
	}
	sort.SliceStable(findings, func(i, j int) bool {
		fi, fj := findings[i], findings[j]
		if fi.Level != fj.Level {
			return fi.Level == analyze.LevelError
		}
		return fi.Kind+" "+fi.Object < fj.Kind+" "+fj.Object
	})
	errs := 0
	for _, f := range findings {
		if f.Level == analyze.LevelError {
			errs++
		}
	}
	if err := render(os.Stdout, kf.output, findings, func(w io.Writer) error {
		if len(findings) == 0 {
			_, err := fmt.Fprintln(w, "no problems found")
			return err
		}
		tw := newTable(w)
		fmt.Fprintln(tw, "LEVEL\tKIND\tOBJECT\tREASON\tMESSAGE")
		for _, f := range findings {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", f.Level, f.Kind, f.Object, f.Reason, f.Message)
		}
		return tw.Flush()
	}); err != nil {
		return err
	}
	if errs > 0 {
		return fmt.Errorf("%d errors found", errs)
	}
	return nil
}
