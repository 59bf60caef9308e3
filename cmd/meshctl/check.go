package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/causeway-mesh/causeway/pkg/clustercheck"
)

func init() {
	register("check", "check a cluster for the mesh: prerequisites, then every component ready and certificates valid (--pre-install: only what an install needs) [-o table|json|yaml]", runCheck)
}

func runCheck(args []string) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	pre := fs.Bool("pre-install", false, "check only what an install needs: the cluster's version, its nodes, the Gateway API CRDs if present, and your permission to install")
	kf, _, err := parseArgs(fs, args, false, 0, "meshctl check [--pre-install] [-o table|json|yaml]")
	if err != nil {
		return err
	}
	c, err := kf.connect()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*kubeTimeout)
	defer cancel()
	results := clustercheck.Run(ctx, clustercheck.Options{Kube: c.client, Gateway: c.gateway, PreInstall: *pre, Proxies: c.proxyCertificates, Now: time.Now()})
	failed := 0
	for _, r := range results {
		if r.Status == clustercheck.Fail {
			failed++
		}
	}
	if err := render(os.Stdout, kf.output, results, func(w io.Writer) error {
		tw := newTable(w)
		fmt.Fprintln(tw, "CHECK\tSTATUS\tMESSAGE")
		for _, r := range results {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Check, r.Status, r.Message)
		}
		return tw.Flush()
	}); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d checks failed", failed, len(results))
	}
	return nil
}

// proxyCertificates reads the certificates of every ready node proxy and
// waypoint through its admin port.
func (c *cluster) proxyCertificates(ctx context.Context) ([]clustercheck.ProxyCertificates, error) {
	pods, err := c.meshPods(ctx)
	if err != nil {
		return nil, err
	}
	var out []clustercheck.ProxyCertificates
	for _, p := range pods {
		kind := proxyKind(p)
		if kind == "control plane" || !clustercheck.PodReady(p) {
			continue // an unready proxy fails its own check
		}
		pc := clustercheck.ProxyCertificates{Proxy: kind + " " + p.Namespace + "/" + p.Name}
		raw, err := c.adminGet(ctx, p, "/config_dump")
		if err == nil {
			var d *dump
			if d, err = parseDump(raw); err == nil {
				pc.Certificates = d.Certificates
			}
		}
		pc.Err = err
		out = append(out, pc)
	}
	return out, nil
}
