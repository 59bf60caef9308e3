package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ns"
)

// Config is the plugin's entry in the chained conflist.
type Config struct {
	types.PluginConf
	// AgentSocket is the node agent's socket (default DefaultAgentSocket).
	AgentSocket string `json:"agent_socket,omitempty"`
	// Timeout bounds the whole wait for the agent (default 30s): the
	// sandbox fails, and kubelet retries, rather than hang.
	Timeout string `json:"timeout,omitempty"`
	// ExcludeNamespaces are never sent to the agent (default
	// DefaultExcludeNamespaces).
	ExcludeNamespaces []string `json:"exclude_namespaces,omitempty"`
}

// stderr is where the plugin reports what does not fail the call
// (container runtimes log a plugin's stderr).
var stderr io.Writer = os.Stderr

// k8sArgs are the CNI_ARGS the container runtime passes for a pod.
type k8sArgs struct {
	types.CommonArgs
	K8S_POD_NAME      types.UnmarshallableString //nolint:revive // CNI_ARGS names
	K8S_POD_NAMESPACE types.UnmarshallableString //nolint:revive
}

func parseConfig(stdin []byte) (*Config, time.Duration, error) {
	c := &Config{}
	if err := json.Unmarshal(stdin, c); err != nil {
		return nil, 0, fmt.Errorf("causeway-cni: parse config: %w", err)
	}
	if err := version.ParsePrevResult(&c.PluginConf); err != nil {
		return nil, 0, fmt.Errorf("causeway-cni: parse prevResult: %w", err)
	}
	if c.AgentSocket == "" {
		c.AgentSocket = DefaultAgentSocket
	}
	if c.ExcludeNamespaces == nil {
		c.ExcludeNamespaces = DefaultExcludeNamespaces
	}
	timeout := 30 * time.Second
	if c.Timeout != "" {
		d, err := time.ParseDuration(c.Timeout)
		if err != nil || d <= 0 {
			return nil, 0, fmt.Errorf("causeway-cni: timeout %q is not a positive duration", c.Timeout)
		}
		timeout = d
	}
	return c, timeout, nil
}

// event builds the agent's event, or nil when the sandbox is not a
// Kubernetes pod the agent should see.
func event(args *skel.CmdArgs, c *Config) (*Event, error) {
	var ka k8sArgs
	ka.IgnoreUnknown = true
	if err := types.LoadArgs(args.Args, &ka); err != nil {
		return nil, fmt.Errorf("causeway-cni: CNI_ARGS: %w", err)
	}
	ev := &Event{ContainerID: args.ContainerID, Netns: args.Netns,
		PodName: string(ka.K8S_POD_NAME), Namespace: string(ka.K8S_POD_NAMESPACE)}
	if ev.PodName == "" || ev.Namespace == "" || slices.Contains(c.ExcludeNamespaces, ev.Namespace) {
		return nil, nil
	}
	if c.PrevResult != nil {
		res, err := current.NewResultFromResult(c.PrevResult)
		if err != nil {
			return nil, fmt.Errorf("causeway-cni: prevResult: %w", err)
		}
		for _, ip := range res.IPs {
			if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
				ev.IPs = append(ev.IPs, a.Unmap())
			}
			if a, ok := netip.AddrFromSlice(ip.Gateway); ok && ip.Gateway != nil {
				ev.Gateways = append(ev.Gateways, a.Unmap())
			}
		}
	}
	return ev, nil
}

// Add asks the agent to capture the pod and returns only once it is
// captured, or not enrolled; any failure fails the sandbox.
func Add(args *skel.CmdArgs) error {
	c, ev, timeout, err := prepare(args)
	if err != nil {
		return err
	}
	if ev != nil {
		if _, err := ns.GetNS(ev.Netns); err != nil {
			return fmt.Errorf("causeway-cni: %w", err)
		}
		r, err := call(c.AgentSocket, PathAdd, ev, timeout)
		if err != nil {
			return types.NewError(types.ErrTryAgainLater, "causeway-cni: the pod is not captured: "+err.Error(), "")
		}
		if r.Captured {
			if err := migrateRequests(ev.Netns); err != nil {
				fmt.Fprintf(stderr, "causeway-cni: %s/%s: connections queued at a closing node proxy listener will be reset: %v\n", ev.Namespace, ev.PodName, err)
			}
		}
	}
	return passThrough(c)
}

// MigrateReqSysctl lets the kernel move connections still queued at a
// closing listener to another of its SO_REUSEPORT group (per network
// namespace, Linux 5.14+): when an old node proxy stops, what it had not
// accepted yet in the pod goes to the new one instead of being reset. The
// plugin sets it, running as root in the node's mount namespace; the node
// proxy's container sees /proc/sys read-only.
const MigrateReqSysctl = "/proc/sys/net/ipv4/tcp_migrate_req"

// migrateRequests sets MigrateReqSysctl in the pod's network namespace.
func migrateRequests(netnsPath string) error {
	return ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
		// /proc/sys/net shows the namespace of the thread that opens it.
		return os.WriteFile(MigrateReqSysctl, []byte("1"), 0)
	})
}

// Del releases the pod. An agent that cannot be reached does not fail the
// deletion: the rules go with the namespace, and the agent forgets pods
// whose sandbox is gone.
func Del(args *skel.CmdArgs) error {
	c, ev, timeout, err := prepare(args)
	if err != nil || ev == nil {
		return err
	}
	if _, err := call(c.AgentSocket, PathDel, ev, timeout); err != nil {
		fmt.Fprintf(stderr, "causeway-cni: release %s/%s: %v\n", ev.Namespace, ev.PodName, err)
	}
	return nil
}

// Check verifies that a pod the agent captures still has its rules.
func Check(args *skel.CmdArgs) error {
	c, ev, timeout, err := prepare(args)
	if err != nil || ev == nil {
		return err
	}
	if _, err := call(c.AgentSocket, PathCheck, ev, timeout); err != nil {
		return fmt.Errorf("causeway-cni: check: %w", err)
	}
	return nil
}

// prepare reads the configuration and the event of a call (nil when the
// agent is not to be asked).
func prepare(args *skel.CmdArgs) (*Config, *Event, time.Duration, error) {
	c, timeout, err := parseConfig(args.StdinData)
	if err != nil {
		return nil, nil, 0, err
	}
	ev, err := event(args, c)
	return c, ev, timeout, err
}

func passThrough(c *Config) error {
	if c.PrevResult == nil {
		return errors.New("causeway-cni: no prevResult: the plugin must be chained after the one that sets up the network")
	}
	return types.PrintResult(c.PrevResult, c.CNIVersion)
}

// call posts ev to the agent and decodes its reply; a reply that reports
// a failure is an error.
func call(socket, path string, ev *Event, timeout time.Duration) (*Reply, error) {
	body, err := json.Marshal(ev)
	if err != nil {
		return nil, err
	}
	client := &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}}}
	resp, err := client.Post("http://causeway-agent"+path, "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("node agent at %s: %w", socket, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, MaxBody+1))
	if err != nil {
		return nil, fmt.Errorf("node agent reply: %w", err)
	}
	if len(raw) > MaxBody {
		return nil, fmt.Errorf("node agent reply exceeds %d bytes", MaxBody)
	}
	var r Reply
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("node agent reply (status %d): %w", resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusOK {
		kind := "not retryable"
		if r.Retryable {
			kind = "retryable"
		}
		return &r, fmt.Errorf("node agent: %s (%s)", r.Reason, kind)
	}
	return &r, nil
}
