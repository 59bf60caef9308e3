package podns

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/causeway-mesh/causeway/pkg/readlimit"
)

// A pod's IP in its status can be stale: after a node reboots, the kubelet
// recreates the sandboxes and the runtime hands out addresses afresh, so an
// enrolled pod's old IP can already be another pod's before the status
// catches up. An IP alone then names the wrong namespace, and capturing it
// would give the other pod this pod's identity. Owners confirms that an
// address is the pod's own: the kubelet names each pod's cgroup after the
// pod's UID, so the node's process table tells which processes are the
// pod's, and /proc/<pid>/net shows their namespace's addresses. Reading
// those files needs neither hostPID nor CAP_SYS_PTRACE (unlike entering
// /proc/<pid>/ns/net): only the node's /proc, mounted read-only.

// Bounds on what is read from the process table.
const (
	maxCgroupFile = 64 << 10
	maxAddrFile   = 4 << 20
	maxProcesses  = 1 << 20
)

// Owners maps pod UIDs to the processes in their cgroups, from one scan of
// a /proc (the node's, mounted in the agent's container).
type Owners struct {
	proc string
	pids map[string][]int
}

// ScanOwners reads the cgroup of every process under proc. Processes that
// end meanwhile, or are not a pod's, are skipped.
func ScanOwners(proc string) (*Owners, error) {
	if err := CheckProc(proc); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(proc)
	if err != nil {
		return nil, fmt.Errorf("the node's process table: %w", err)
	}
	o := &Owners{proc: proc, pids: map[string][]int{}}
	n := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		if n++; n > maxProcesses {
			return nil, fmt.Errorf("more than %d processes under %s", maxProcesses, proc)
		}
		data, err := readlimit.File(filepath.Join(proc, e.Name(), "cgroup"), maxCgroupFile)
		if err != nil {
			continue
		}
		if uid := podUID(data); uid != "" {
			o.pids[uid] = append(o.pids[uid], pid)
		}
	}
	return o, nil
}

// CheckProc says whether proc is a proc file system.
func CheckProc(proc string) error {
	if _, err := os.Stat(filepath.Join(proc, "self", "cgroup")); err != nil {
		return fmt.Errorf("%s is not a proc file system (the node's /proc, mounted read-only): %w", proc, err)
	}
	return nil
}

// podUID returns the pod UID a /proc/<pid>/cgroup names, or "". The
// kubelet names the pod's cgroup pod<UID> (cgroupfs driver) or
// kubepods[-<qos>]-pod<UID, '-' as '_'>.slice (systemd driver); paths may
// be relative to the reader's cgroup namespace ("/../..").
func podUID(cgroup []byte) string {
	for line := range bytes.Lines(cgroup) {
		// hierarchy-ID:controllers:path
		f := bytes.SplitN(bytes.TrimSpace(line), []byte(":"), 3)
		if len(f) != 3 {
			continue
		}
		for c := range strings.SplitSeq(string(f[2]), "/") {
			if uid, ok := strings.CutPrefix(c, "pod"); ok && validUID(uid) {
				return uid
			}
			if s, ok := strings.CutSuffix(c, ".slice"); ok && strings.HasPrefix(c, "kubepods-") {
				if i := strings.LastIndex(s, "-pod"); i >= 0 {
					if uid := strings.ReplaceAll(s[i+len("-pod"):], "_", "-"); validUID(uid) {
						return uid
					}
				}
			}
		}
	}
	return ""
}

// validUID accepts the UUIDs the API server assigns.
func validUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, r := range s {
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if r != '-' {
				return false
			}
		case !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f'):
			return false
		}
	}
	return true
}

// Confirm says whether every one of ips is an address of the network
// namespace the pod's processes run in; an error says why not.
func (o *Owners) Confirm(uid string, ips []netip.Addr) error {
	pids := o.pids[uid]
	if len(pids) == 0 {
		return fmt.Errorf("no process of pod %s on this node (no cgroup pod%s under %s)", uid, uid, o.proc)
	}
	var last error
	for _, pid := range pids {
		local, err := o.localAddrs(pid)
		if err != nil {
			last = err // ended since the scan: try its siblings
			continue
		}
		for _, ip := range ips {
			if _, ok := local[ip]; !ok {
				return fmt.Errorf("%s is not an address of pod %s's network namespace (its status may be stale)", ip, uid)
			}
		}
		return nil
	}
	return fmt.Errorf("addresses of pod %s's network namespace: %w", uid, last)
}

// localAddrs reads the addresses of the process's network namespace: the
// local routes of its IPv4 routing tables, and its IPv6 interface
// addresses.
func (o *Owners) localAddrs(pid int) (map[netip.Addr]struct{}, error) {
	dir := filepath.Join(o.proc, strconv.Itoa(pid), "net")
	trie, err := readlimit.File(filepath.Join(dir, "fib_trie"), maxAddrFile)
	if err != nil {
		return nil, err
	}
	out := localRoutes4(trie)
	v6, err := readlimit.File(filepath.Join(dir, "if_inet6"), maxAddrFile)
	if err != nil && !errors.Is(err, os.ErrNotExist) { // no IPv6 in this kernel
		return nil, err
	}
	for line := range bytes.Lines(v6) {
		if a, ok := inet6Addr(strings.Fields(string(line))); ok {
			out[a] = struct{}{}
		}
	}
	return out, nil
}

// localRoutes4 reads /proc/net/fib_trie: a leaf line "|-- 10.0.0.5" is
// followed by its routes, "/32 host LOCAL" when the address is the
// namespace's own.
func localRoutes4(trie []byte) map[netip.Addr]struct{} {
	out := map[netip.Addr]struct{}{}
	var leaf netip.Addr
	for l := range bytes.Lines(trie) {
		line := string(bytes.TrimSpace(l))
		if s, ok := strings.CutPrefix(line, "|-- "); ok {
			leaf, _ = netip.ParseAddr(s)
			continue
		}
		if leaf.Is4() && strings.HasPrefix(line, "/32 host LOCAL") {
			out[leaf] = struct{}{}
		}
	}
	return out
}

// inet6Addr reads a /proc/net/if_inet6 line: address (32 hex digits),
// ifindex, prefix length, scope, flags, name.
func inet6Addr(f []string) (netip.Addr, bool) {
	if len(f) < 6 || len(f[0]) != 32 {
		return netip.Addr{}, false
	}
	b, err := hex.DecodeString(f[0])
	if err != nil {
		return netip.Addr{}, false
	}
	return netip.AddrFrom16([16]byte(b)), true
}
