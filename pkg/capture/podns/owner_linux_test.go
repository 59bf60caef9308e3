package podns

import (
	"crypto/rand"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/causeway-mesh/causeway/pkg/capture/internal/netnstest"
)

const uid = "3f2a9c1e-7b4d-4e8f-9a0b-1c2d3e4f5a6b"

// Cgroup files as the kernel shows them under each kubelet driver.
func TestPodUID(t *testing.T) {
	underscored := strings.ReplaceAll(uid, "-", "_")
	for _, tc := range []struct{ name, file, want string }{
		{"cgroupfs, v2", "0::/kubepods/besteffort/pod" + uid + "/0123abcd\n", uid},
		{"cgroupfs, guaranteed", "0::/kubepods/pod" + uid + "/0123abcd\n", uid},
		{"systemd", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + underscored + ".slice/cri-containerd-0123.scope\n", uid},
		{"systemd, guaranteed", "0::/kubepods.slice/kubepods-pod" + underscored + ".slice/cri-containerd-0123.scope\n", uid},
		{"v1, several hierarchies", "12:pids:/kubepods/burstable/pod" + uid + "/0123\n11:memory:/kubepods/burstable/pod" + uid + "/0123\n0::/\n", uid},
		{"seen from another cgroup namespace", "0::/../../kubepods/besteffort/pod" + uid + "/0123\n", uid},
		{"a node's own cgroup root", "0::/causeway-node2/kubepods/besteffort/pod" + uid + "/0123\n", uid},
		{"a system service", "0::/system.slice/containerd.service\n", ""},
		{"pod, not a UID", "0::/kubepods/besteffort/podcast/0123\n", ""},
		{"upper-case UID", "0::/kubepods/pod" + strings.ToUpper(uid) + "/0123\n", ""},
		{"slice, not the kubelet's", "0::/user.slice/user-pod" + underscored + ".slice\n", ""},
		{"malformed", "no colons here\n", ""},
	} {
		if got := podUID([]byte(tc.file)); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// The local routes of a pod namespace's fib_trie are its addresses; the
// subnet, broadcast and loopback-range routes are not.
func TestLocalRoutes4(t *testing.T) {
	trie := `Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 10.77.0.0/24 2 0 2
        |-- 10.77.0.0
           /24 link UNICAST
        |-- 10.77.0.12
           /32 host LOCAL
        |-- 10.77.0.255
           /32 link BROADCAST
     +-- 127.0.0.0/31 1 0 0
        |-- 127.0.0.0
           /8 host LOCAL
        |-- 127.0.0.1
           /32 host LOCAL
Local:
  +-- 10.77.0.0/24 2 0 2
        |-- 10.77.0.12
           /32 host LOCAL
`
	got := localRoutes4([]byte(trie))
	want := []string{"10.77.0.12", "127.0.0.1"}
	if len(got) != len(want) {
		t.Errorf("local addresses %v, want %v", got, want)
	}
	for _, w := range want {
		if _, ok := got[netip.MustParseAddr(w)]; !ok {
			t.Errorf("%s missing from %v", w, got)
		}
	}
	if a, ok := inet6Addr(strings.Fields("fd770000000000000000000000000012 02 40 00 80     eth0")); !ok || a != netip.MustParseAddr("fd77::12") {
		t.Errorf("if_inet6 line read as %v, %v", a, ok)
	}
	if _, ok := inet6Addr(strings.Fields("fd77 02 40 00 80 eth0")); ok {
		t.Error("a short address was read")
	}
}

func randomUID() string {
	var b [16]byte
	rand.Read(b[:])
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// A pod's processes confirm the addresses of their own namespace and no
// other's: a status IP that another pod's namespace holds is refused.
func TestConfirm(t *testing.T) {
	n := netnstest.NewNet(t)
	a, b := n.AddPod(t, "a"), n.AddPod(t, "b")
	uidA, uidB := randomUID(), randomUID()
	a.RunAsPod(t, uidA)
	b.RunAsPod(t, uidB)
	owners, err := ScanOwners("/proc")
	if err != nil {
		t.Fatal(err)
	}
	ipsA := []netip.Addr{a.IP4}
	if n.IPv6 {
		ipsA = append(ipsA, a.IP6)
	}
	if err := owners.Confirm(uidA, ipsA); err != nil {
		t.Errorf("the pod's own addresses: %v", err)
	}
	if err := owners.Confirm(uidA, []netip.Addr{b.IP4}); err == nil || !strings.Contains(err.Error(), "stale") {
		t.Errorf("another pod's address: %v, want a refusal", err)
	}
	if err := owners.Confirm(uidA, []netip.Addr{a.IP4, b.IP4}); err == nil {
		t.Error("a status naming one own and one foreign address was confirmed")
	}
	if err := owners.Confirm(randomUID(), []netip.Addr{a.IP4}); err == nil || !strings.Contains(err.Error(), "no process") {
		t.Errorf("a pod with no process here: %v, want a refusal", err)
	}
	if _, err := ScanOwners(t.TempDir()); err == nil {
		t.Error("a directory that is not /proc was scanned")
	}
}
