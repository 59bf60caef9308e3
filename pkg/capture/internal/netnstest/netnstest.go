// Package netnstest builds throwaway network namespaces for tests: a
// "node" namespace holding a bridge, and "pods" wired to it by veth pairs,
// each with an IPv4 address and, when the kernel has IPv6, an IPv6 one.
// Nothing is created in the test process's own namespace, so no test
// traffic can leave the machine. Everything is removed at cleanup.
package netnstest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Require skips the test unless it runs as root with the ip tool.
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs the ip tool (iproute2) to create network namespaces")
	}
}

// HasIPv6 reports whether the kernel has IPv6.
func HasIPv6() bool {
	_, err := os.Stat("/proc/net/if_inet6")
	return err == nil
}

// NS is one network namespace.
type NS struct {
	Name string
	// File is an open descriptor of the namespace.
	File *os.File
}

// Fd is the namespace's descriptor.
func (n *NS) Fd() int { return int(n.File.Fd()) }

// Path is where the namespace is mounted.
func (n *NS) Path() string { return "/var/run/netns/" + n.Name }

// Cmd is a command that runs inside the namespace.
func (n *NS) Cmd(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}

// Run runs a command inside the namespace and fails the test on error.
func (n *NS) Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := n.Cmd(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %s %s: %v\n%s", n.Name, name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// New creates an empty namespace with loopback up.
func New(t testing.TB, role string) *NS {
	t.Helper()
	Require(t)
	var b [4]byte
	rand.Read(b[:])
	n := &NS{Name: "cw" + hex.EncodeToString(b[:]) + role}
	run(t, "ip", "netns", "add", n.Name)
	t.Cleanup(func() {
		if n.File != nil {
			n.File.Close()
		}
		exec.Command("ip", "netns", "delete", n.Name).Run()
	})
	f, err := os.Open(n.Path())
	if err != nil {
		t.Fatal(err)
	}
	n.File = f
	run(t, "ip", "-n", n.Name, "link", "set", "lo", "up")
	return n
}

// Net is a node namespace with a bridge and the pods attached to it.
type Net struct {
	Node *NS
	// Gateway4 and Gateway6 are the node's addresses on the bridge (the
	// pods' default gateways, where probes come from).
	Gateway4, Gateway6 netip.Addr
	IPv6               bool
	pods               int
}

// NewNet creates the node namespace and its bridge: 10.77.0.1/24 and,
// with IPv6, fd77::1/64.
func NewNet(t testing.TB) *Net {
	t.Helper()
	n := &Net{Node: New(t, "node"), Gateway4: netip.MustParseAddr("10.77.0.1"), IPv6: HasIPv6()}
	node := n.Node.Name
	run(t, "ip", "-n", node, "link", "add", "br0", "type", "bridge")
	run(t, "ip", "-n", node, "addr", "add", "10.77.0.1/24", "dev", "br0")
	if n.IPv6 {
		n.Gateway6 = netip.MustParseAddr("fd77::1")
		run(t, "ip", "-n", node, "addr", "add", "fd77::1/64", "dev", "br0", "nodad")
	}
	run(t, "ip", "-n", node, "link", "set", "br0", "up")
	return n
}

// Pod is a namespace on the bridge.
type Pod struct {
	*NS
	IP4, IP6 netip.Addr // IP6 is invalid without IPv6
}

// AddPod creates a pod namespace with the next addresses (10.77.0.N,
// fd77::N) and default routes through the node.
func (n *Net) AddPod(t testing.TB, role string) *Pod {
	t.Helper()
	n.pods++
	idx := n.pods + 10
	p := &Pod{NS: New(t, role), IP4: netip.AddrFrom4([4]byte{10, 77, 0, byte(idx)})}
	host := fmt.Sprintf("vh%d", idx)
	run(t, "ip", "-n", n.Node.Name, "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", p.Name)
	run(t, "ip", "-n", n.Node.Name, "link", "set", host, "master", "br0", "up")
	run(t, "ip", "-n", p.Name, "addr", "add", p.IP4.String()+"/24", "dev", "eth0")
	if n.IPv6 {
		p.IP6 = netip.MustParseAddr(fmt.Sprintf("fd77::%d", idx))
		run(t, "ip", "-n", p.Name, "addr", "add", p.IP6.String()+"/64", "dev", "eth0", "nodad")
	}
	run(t, "ip", "-n", p.Name, "link", "set", "eth0", "up")
	run(t, "ip", "-n", p.Name, "route", "add", "default", "via", n.Gateway4.String())
	if n.IPv6 {
		run(t, "ip", "-n", p.Name, "-6", "route", "add", "default", "via", n.Gateway6.String())
	}
	return p
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// RunAsPod starts a process inside the namespace, in a cgroup named as the
// kubelet names a pod's (pod<UID>, cgroupfs driver): how the node agent
// tells which pod a namespace is. The process and the cgroup are removed
// at cleanup.
func (n *NS) RunAsPod(t testing.TB, uid string) {
	t.Helper()
	root := ""
	// cgroup v2, the v2 hierarchy of a hybrid host, or v1's pids hierarchy.
	for _, dir := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/pids"} {
		if _, err := os.Stat(dir + "/cgroup.procs"); err == nil {
			root = dir
			break
		}
	}
	if root == "" {
		t.Skip("no cgroup hierarchy to place a pod's process in")
	}
	var b [4]byte
	rand.Read(b[:])
	parent := root + "/causeway-test-" + hex.EncodeToString(b[:])
	dir := parent + "/pod" + uid
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := n.Cmd("sleep", "infinity") // ip netns exec execs sleep: one pid
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		os.Remove(dir)
		os.Remove(parent)
	})
	if err := os.WriteFile(dir+"/cgroup.procs", []byte(fmt.Sprint(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
}
