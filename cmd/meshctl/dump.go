package main

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/causeway-mesh/causeway/pkg/policy"
	"github.com/causeway-mesh/causeway/pkg/readlimit"
	"github.com/causeway-mesh/causeway/pkg/trust/certmanager"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

func init() {
	register("workloads", "list the workloads a proxy knows (--admin ADDR or --file DUMP)", runWorkloads)
	register("services", "list the services a proxy knows (--admin ADDR or --file DUMP)", runServices)
	register("certificates", "show a proxy's certificates (--admin ADDR or --file DUMP)", runCertificates)
}

// maxDump bounds how much of a config dump is read.
const maxDump = 64 << 20

// dump is the part of /config_dump (docs/design.md §8) that meshctl reads.
type dump struct {
	ByAddr       map[string]json.RawMessage      `json:"by_addr"`
	ByVIP        map[string]json.RawMessage      `json:"by_vip"`
	Certificates []certmanager.CertificateStatus `json:"certificates"`
	Policies     *policy.Status                  `json:"policies"` // waypoints
	// Connections are a node proxy's open inbound connections, each as
	// its log names it (src, src_identity, dst); nil when not listed.
	Connections *[]map[string]any `json:"connections"`
}

// loadDump reads a config dump from a proxy's admin address or a file.
func loadDump(name string, args []string) (*dump, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	admin := fs.String("admin", "", "admin address of a proxy (host:port)")
	file := fs.String("file", "", "config dump file (- for stdin)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	var r io.Reader
	switch {
	case *admin != "" && *file != "":
		return nil, errors.New("give --admin or --file, not both")
	case *admin != "":
		client := &http.Client{Timeout: 10 * time.Second}
		resp, err := client.Get("http://" + *admin + "/config_dump")
		if err != nil {
			return nil, fmt.Errorf("fetch config dump: %w", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
			return nil, fmt.Errorf("config dump from %s: %s: %s", *admin, resp.Status, strings.TrimSpace(string(msg)))
		}
		r = resp.Body
	case *file == "-":
		r = os.Stdin
	case *file != "":
		f, err := os.Open(*file)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	default:
		return nil, errors.New("give --admin ADDR or --file DUMP")
	}
	data, err := readlimit.All(r, maxDump)
	if err != nil {
		return nil, fmt.Errorf("read config dump: %w", err)
	}
	return parseDump(data)
}

// parseDump reads a /config_dump document.
func parseDump(data []byte) (*dump, error) {
	var d dump
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("parse config dump: %w", err)
	}
	return &d, nil
}

func runWorkloads(args []string) error {
	d, err := loadDump("workloads", args)
	if err != nil {
		return err
	}
	return writeWorkloads(os.Stdout, d)
}

// writeWorkloads prints the workloads of a dump as a table.
func writeWorkloads(out io.Writer, d *dump) error {
	rows, err := d.workloads()
	if err != nil {
		return err
	}
	tw := newTable(out)
	fmt.Fprintln(tw, "NAMESPACE\tPOD NAME\tADDRESS\tNODE\tWAYPOINT\tPROTOCOL\tIDENTITY")
	for _, w := range rows {
		proto := "TCP"
		if w.GetHbone() {
			proto = "HBONE"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", w.GetNamespace(), w.GetName(), orNA(strings.Join(w.GetAddresses(), ",")),
			orNA(w.GetNode()), refOrNone(w.GetWaypoint()), proto, orNA(w.GetIdentity()))
	}
	return tw.Flush()
}

// workloads are the dump's workloads, each once (a workload is listed
// under each of its addresses), by namespace and name.
func (d *dump) workloads() ([]*meshv1.Workload, error) {
	seen := map[string]*meshv1.Workload{}
	for addr, raw := range d.ByAddr {
		w := new(meshv1.Workload)
		if err := protojson.Unmarshal(raw, w); err != nil {
			return nil, fmt.Errorf("workload at %s: %w", addr, err)
		}
		seen[w.GetUid()] = w
	}
	rows := make([]*meshv1.Workload, 0, len(seen))
	for _, w := range seen {
		rows = append(rows, w)
	}
	sort.Slice(rows, func(i, j int) bool {
		return rows[i].GetNamespace()+"/"+rows[i].GetName() < rows[j].GetNamespace()+"/"+rows[j].GetName()
	})
	return rows, nil
}

func runServices(args []string) error {
	d, err := loadDump("services", args)
	if err != nil {
		return err
	}
	return writeServices(os.Stdout, d)
}

// writeServices prints the services of a dump as a table.
func writeServices(out io.Writer, d *dump) error {
	services, err := d.services()
	if err != nil {
		return err
	}
	tw := newTable(out)
	fmt.Fprintln(tw, "NAMESPACE\tSERVICE NAME\tSERVICE VIP\tPORTS\tWAYPOINT\tENDPOINTS")
	for _, s := range services {
		var ports []string
		for _, p := range s.GetPorts() {
			ports = append(ports, fmt.Sprintf("%d/%s", p.GetPort(), orDefault(p.GetAppProtocol(), "tcp")))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", s.GetNamespace(), s.GetName(), orNA(strings.Join(s.GetVips(), ",")),
			orNA(strings.Join(ports, ",")), refOrNone(s.GetWaypoint()), len(s.GetEndpoints()))
	}
	return tw.Flush()
}

// services are the dump's services, each once, by namespace and name.
func (d *dump) services() ([]*meshv1.Service, error) {
	seen := map[string]*meshv1.Service{}
	for vip, raw := range d.ByVIP {
		s := new(meshv1.Service)
		if err := protojson.Unmarshal(raw, s); err != nil {
			return nil, fmt.Errorf("service at %s: %w", vip, err)
		}
		seen[s.GetNamespace()+"/"+s.GetName()] = s
	}
	out := make([]*meshv1.Service, 0, len(seen))
	for _, s := range seen {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].GetNamespace()+"/"+out[i].GetName() < out[j].GetNamespace()+"/"+out[j].GetName()
	})
	return out, nil
}

func runCertificates(args []string) error {
	d, err := loadDump("certificates", args)
	if err != nil {
		return err
	}
	return writeCertificates(os.Stdout, d.Certificates, time.Now())
}

// writeCertificates prints the table of docs/design.md §8.
func writeCertificates(w io.Writer, certs []certmanager.CertificateStatus, now time.Time) error {
	sort.Slice(certs, func(i, j int) bool { return certs[i].Identity < certs[j].Identity })
	tw := newTable(w)
	fmt.Fprintln(tw, "CERTIFICATE NAME\tTYPE\tSTATUS\tVALID CERT\tSERIAL NUMBER\tNOT AFTER\tNOT BEFORE")
	for _, c := range certs {
		status := c.State
		if strings.HasPrefix(status, "Unavailable") {
			status = "Unavailable"
		}
		if len(c.CertChain) == 0 {
			fmt.Fprintf(tw, "%s\tNA\t%s\tfalse\tNA\tNA\tNA\n", c.Identity, orNA(status))
			continue
		}
		for i, e := range c.CertChain {
			typ := "Intermediate"
			if i == 0 {
				typ = "Leaf"
			} else if isRoot(e.PEM) {
				typ = "Root"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%t\t%s\t%s\t%s\n", c.Identity, typ, orNA(status),
				validAt(e.ValidFrom, e.ExpirationTime, now), orNA(e.SerialNumber), orNA(e.ExpirationTime), orNA(e.ValidFrom))
		}
	}
	return tw.Flush()
}

func isRoot(p string) bool {
	block, _ := pem.Decode([]byte(p))
	if block == nil {
		return false
	}
	c, err := x509.ParseCertificate(block.Bytes)
	return err == nil && c.IsCA && c.CheckSignatureFrom(c) == nil
}

func validAt(from, to string, now time.Time) bool {
	f, err1 := time.Parse(time.RFC3339, from)
	t, err2 := time.Parse(time.RFC3339, to)
	return err1 == nil && err2 == nil && !now.Before(f) && now.Before(t)
}

func orNA(s string) string { return orDefault(s, "NA") }

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func refOrNone(r *meshv1.Ref) string {
	if r == nil {
		return "None"
	}
	return r.GetNamespace() + "/" + r.GetName()
}
