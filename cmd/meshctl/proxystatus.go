package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/causeway-mesh/causeway/pkg/xds"
	"github.com/causeway-mesh/causeway/pkg/xds/meshv1"
)

func init() {
	register("proxy-status", "each node proxy's and waypoint's xDS state, as the control plane replicas see it (versions sent and acknowledged, rejections) [-o table|json|yaml]", runProxyStatus)
}

// proxyStatus is one proxy's xDS state: its connection to a control plane
// replica and, per resource type, where the exchange stands.
type proxyStatus struct {
	Pod          string    `json:"pod,omitempty"` // "" for a client that is no pod of the cluster
	Kind         string    `json:"kind"`
	Node         string    `json:"node,omitempty"`
	NodeID       string    `json:"node_id,omitempty"`
	ControlPlane string    `json:"control_plane,omitempty"` // the replica it is connected to
	Version      string    `json:"control_plane_version,omitempty"`
	Since        time.Time `json:"connected_since,omitzero"`
	// Connected is false for a running proxy pod no replica serves.
	Connected bool           `json:"connected"`
	Types     []xds.TypeSync `json:"types,omitempty"`
}

func runProxyStatus(args []string) error {
	kf, _, err := parseArgs(flag.NewFlagSet("proxy-status", flag.ContinueOnError), args, false, 0, "meshctl proxy-status [-o table|json|yaml]")
	if err != nil {
		return err
	}
	c, err := kf.connect()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*kubeTimeout)
	defer cancel()
	cps, err := c.client.CoreV1().Pods(systemNamespace).List(ctx, metav1.ListOptions{LabelSelector: controlPlaneSelector})
	if err != nil {
		return fmt.Errorf("list control plane pods: %w", err)
	}
	syncz := map[string]*xds.Syncz{}
	for i := range cps.Items {
		p := &cps.Items[i]
		if p.Status.Phase != corev1.PodRunning {
			continue
		}
		data, err := c.adminGet(ctx, p, "/debug/syncz")
		if err != nil {
			return fmt.Errorf("control plane %s: %w", p.Name, err)
		}
		var s xds.Syncz
		if err := json.Unmarshal(data, &s); err != nil {
			return fmt.Errorf("control plane %s: /debug/syncz: %w", p.Name, err)
		}
		syncz[p.Name] = &s
	}
	if len(syncz) == 0 {
		return fmt.Errorf("no running control plane pod in %s (%s): is the mesh installed?", systemNamespace, controlPlaneSelector)
	}
	pods, err := c.meshPods(ctx)
	if err != nil {
		return err
	}
	statuses := proxyStatuses(syncz, pods)
	return render(os.Stdout, kf.output, statuses, func(w io.Writer) error { return writeProxyStatus(w, statuses) })
}

// proxyStatuses joins what the control plane replicas say of their
// clients with the proxy pods: a client is its pod by the pod its
// credential names, else by its address.
func proxyStatuses(syncz map[string]*xds.Syncz, pods []*corev1.Pod) []proxyStatus {
	byName, byIP := map[string]*corev1.Pod{}, map[string]*corev1.Pod{}
	for _, p := range pods {
		if proxyKind(p) == "control plane" {
			continue
		}
		byName[p.Namespace+"/"+p.Name] = p
		for _, ip := range p.Status.PodIPs {
			byIP[ip.IP] = p
		}
	}
	seen := map[string]bool{}
	var out []proxyStatus
	cpNames := make([]string, 0, len(syncz))
	for n := range syncz {
		cpNames = append(cpNames, n)
	}
	sort.Strings(cpNames)
	for _, cp := range cpNames {
		s := syncz[cp]
		for _, cl := range s.Clients {
			st := proxyStatus{NodeID: cl.NodeID, ControlPlane: cp, Version: s.Version, Since: cl.Since, Connected: true, Types: cl.Types, Kind: clientKind(cl.NodeID)}
			p := byName[cl.Pod]
			if p == nil {
				p = byIP[remoteIP(cl.Remote)]
			}
			if p != nil {
				st.Pod, st.Kind, st.Node = p.Namespace+"/"+p.Name, proxyKind(p), p.Spec.NodeName
				seen[st.Pod] = true
			}
			out = append(out, st)
		}
	}
	for name, p := range byName {
		if !seen[name] {
			out = append(out, proxyStatus{Pod: name, Kind: proxyKind(p), Node: p.Spec.NodeName})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Pod+out[i].NodeID < out[j].Pod+out[j].NodeID
	})
	return out
}

// clientKind tells a client's kind from its node id (pkg/xds names).
func clientKind(nodeID string) string {
	switch {
	case strings.HasPrefix(nodeID, xds.NodeProxyIDPrefix):
		return "node proxy"
	case strings.HasPrefix(nodeID, xds.WaypointIDPrefix):
		return "waypoint"
	}
	return "unknown"
}

// remoteIP is the address of "ip:port" or "[ip]:port".
func remoteIP(remote string) string {
	if i := strings.LastIndexByte(remote, ':'); i >= 0 {
		remote = remote[:i]
	}
	return strings.Trim(remote, "[]")
}

// writeProxyStatus prints one row per proxy, one column per resource type
// any of them asked for.
func writeProxyStatus(w io.Writer, statuses []proxyStatus) error {
	used := map[string]bool{}
	for _, s := range statuses {
		for _, t := range s.Types {
			used[t.Type] = true
		}
	}
	var types []string
	for _, u := range meshv1.TypeURLs {
		if n := xds.TypeName(u); used[n] {
			types = append(types, n)
		}
	}
	tw := newTable(w)
	head := []string{"NAME", "KIND", "NODE", "CONTROL PLANE", "VERSION"}
	for _, t := range types {
		head = append(head, strings.ToUpper(t))
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, s := range statuses {
		name := orDefault(s.Pod, s.NodeID)
		if !s.Connected {
			row := []string{name, s.Kind, orNA(s.Node), "NOT CONNECTED", "-"}
			for range types {
				row = append(row, "-")
			}
			fmt.Fprintln(tw, strings.Join(row, "\t"))
			continue
		}
		row := []string{name, s.Kind, orNA(s.Node), s.ControlPlane, s.Version}
		for _, t := range types {
			row = append(row, syncCell(s.Types, t))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range statuses {
		for _, t := range s.Types {
			if t.NACK != nil {
				fmt.Fprintf(w, "%s %s: rejected version %s at %s: %s\n", orDefault(s.Pod, s.NodeID), t.Type, orNA(t.NACK.Version), t.NACK.At.UTC().Format(time.RFC3339), t.NACK.Message)
			}
		}
	}
	return nil
}

// syncCell is one type's state: "SYNCED (12)", "STALE (sent 13, acked 12)", ...
func syncCell(types []xds.TypeSync, name string) string {
	for _, t := range types {
		if t.Type != name {
			continue
		}
		switch t.Status {
		case xds.SyncSynced:
			return fmt.Sprintf("%s (%s)", t.Status, t.AckedVersion)
		case xds.SyncNotSent:
			return t.Status
		}
		return fmt.Sprintf("%s (sent %s, acked %s)", t.Status, t.SentVersion, orDefault(t.AckedVersion, "none"))
	}
	return "-"
}
