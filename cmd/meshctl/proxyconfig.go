package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/causeway-mesh/causeway/pkg/policy"
)

func init() {
	register("proxy-config", "what a node proxy or waypoint pod of a cluster holds: proxy-config workloads|services|certificates|connections|policy|all POD [-n NS] [-o table|json|yaml]", runProxyConfig)
}

// proxyConfigKinds are the views of a proxy's /config_dump.
var proxyConfigKinds = []string{"workloads", "services", "certificates", "connections", "policy", "all"}

func runProxyConfig(args []string) error {
	usage := "meshctl proxy-config " + strings.Join(proxyConfigKinds, "|") + " POD [-n NAMESPACE] [-o table|json|yaml]"
	kf, pos, err := parseArgs(flag.NewFlagSet("proxy-config", flag.ContinueOnError), args, true, 2, usage)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return errors.New("usage: " + usage)
	}
	kind, podName := pos[0], pos[1]
	if !contains(proxyConfigKinds, kind) {
		return fmt.Errorf("unknown view %q: want one of %s", kind, strings.Join(proxyConfigKinds, ", "))
	}
	c, err := kf.connect()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*kubeTimeout)
	defer cancel()
	pod, podKind, err := c.proxyPod(ctx, podName, false)
	if err != nil {
		return err
	}
	raw, err := c.adminGet(ctx, pod, "/config_dump")
	if err != nil {
		return err
	}
	d, err := parseDump(raw)
	if err != nil {
		return fmt.Errorf("%s %s/%s: %w", podKind, pod.Namespace, pod.Name, err)
	}
	return writeProxyConfig(os.Stdout, kf.output, kind, podKind, pod.Namespace+"/"+pod.Name, raw, d, time.Now())
}

// writeProxyConfig writes one view of a proxy's dump (raw, parsed as d).
func writeProxyConfig(w io.Writer, format, kind, podKind, pod string, raw []byte, d *dump, now time.Time) error {
	switch kind {
	case "workloads":
		ws, err := protoList(d.workloads())
		if err != nil {
			return err
		}
		return render(w, format, ws, func(w io.Writer) error { return writeWorkloads(w, d) })
	case "services":
		ss, err := protoList(d.services())
		if err != nil {
			return err
		}
		return render(w, format, ss, func(w io.Writer) error { return writeServices(w, d) })
	case "certificates":
		return render(w, format, d.Certificates, func(w io.Writer) error { return writeCertificates(w, d.Certificates, now) })
	case "connections":
		if d.Connections == nil {
			return fmt.Errorf("%s %s lists no connections (node proxies list the inbound connections they hold to their pods)", podKind, pod)
		}
		return render(w, format, *d.Connections, func(w io.Writer) error { return writeConnections(w, d) })
	case "policy":
		if d.Policies == nil {
			return fmt.Errorf("%s %s holds no waypoint policy (only waypoints enforce Rego policies; ConnectionPolicies are Kubernetes objects: kubectl get connectionpolicy -A)", podKind, pod)
		}
		return render(w, format, d.Policies, func(w io.Writer) error { return writePolicy(w, d.Policies) })
	}
	// all: the dump as the proxy serves it, or every table.
	return render(w, format, json.RawMessage(raw), func(w io.Writer) error {
		sections := []struct {
			title string
			write func(io.Writer) error
		}{
			{"WORKLOADS (by_addr)", func(w io.Writer) error { return writeWorkloads(w, d) }},
			{"SERVICES (by_vip)", func(w io.Writer) error { return writeServices(w, d) }},
			{"CERTIFICATES", func(w io.Writer) error { return writeCertificates(w, d.Certificates, now) }},
		}
		if d.Connections != nil {
			sections = append(sections, struct {
				title string
				write func(io.Writer) error
			}{"CONNECTIONS (inbound)", func(w io.Writer) error { return writeConnections(w, d) }})
		}
		if d.Policies != nil {
			sections = append(sections, struct {
				title string
				write func(io.Writer) error
			}{"POLICY", func(w io.Writer) error { return writePolicy(w, d.Policies) }})
		}
		fmt.Fprintf(w, "%s %s\n", podKind, pod)
		for _, s := range sections {
			fmt.Fprintf(w, "\n%s\n", s.title)
			if err := s.write(w); err != nil {
				return err
			}
		}
		return nil
	})
}

// protoList is ms as JSON objects (protojson, the dump's own encoding).
func protoList[M proto.Message](ms []M, err error) ([]json.RawMessage, error) {
	if err != nil {
		return nil, err
	}
	out := make([]json.RawMessage, 0, len(ms))
	for _, m := range ms {
		b, err := protojson.Marshal(m)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// writeConnections prints a node proxy's open inbound connections, each
// with the workload it reaches, by destination.
func writeConnections(w io.Writer, d *dump) error {
	workloads := map[string]string{}
	for addr, raw := range d.ByAddr {
		var wl struct{ Name, Namespace string }
		if json.Unmarshal(raw, &wl) == nil {
			workloads[addr] = wl.Namespace + "/" + wl.Name
		}
	}
	type row struct{ src, id, dst, workload string }
	var rows []row
	for _, c := range *d.Connections {
		r := row{src: fmt.Sprint(c["src"]), id: fmt.Sprint(c["src_identity"]), dst: fmt.Sprint(c["dst"])}
		host := r.dst
		if i := strings.LastIndexByte(host, ':'); i >= 0 {
			host = strings.Trim(host[:i], "[]")
		}
		r.workload = orNA(workloads[host])
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].dst+rows[i].src < rows[j].dst+rows[j].src })
	tw := newTable(w)
	fmt.Fprintln(tw, "SOURCE\tSOURCE IDENTITY\tDESTINATION\tDESTINATION WORKLOAD")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.src, r.id, r.dst, r.workload)
	}
	return tw.Flush()
}

// writePolicy prints a waypoint's policy status.
func writePolicy(w io.Writer, s *policy.Status) error {
	tw := newTable(w)
	activated := "never"
	if s.ActivatedAt != nil {
		activated = s.ActivatedAt.UTC().Format(time.RFC3339)
	}
	fmt.Fprintln(tw, "REVISION\tDECISION PATH\tACTIVATED\tTESTS PASSED\tFILES")
	fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\n", orNA(s.Revision), orNA(s.DecisionPath), activated, s.Tests, len(s.Files))
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(s.Sources) > 0 {
		names := make([]string, 0, len(s.Sources))
		for n := range s.Sources {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintln(tw, "\nSOURCE\tLOCATION\tREVISION\tREAD ERROR")
		for _, n := range names {
			src := s.Sources[n]
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", n, orNA(src.Location), orNA(src.Revision), orDefault(src.ReadError, "-"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if r := s.LastRejection; r != nil {
		fmt.Fprintf(w, "\nlast rejection: %s revision %s at %s (%s): %s\n", r.Source, orNA(r.Revision), r.At.UTC().Format(time.RFC3339), r.Stage, r.Reason)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
