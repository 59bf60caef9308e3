// Package podns reads what the node agent and the node proxy need to know
// about a pod's network namespace from inside it: the pod's addresses, its
// default gateways (where the node, and kubelet's probes, reach it from),
// and, for pods that were running before the agent saw their sandbox, which
// of the node's named namespaces is theirs.
package podns

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Addresses lists the namespace's own unicast addresses (not loopback,
// not link-local): the pod's IPs.
func Addresses(netns ns.NetNS) ([]netip.Addr, error) {
	var out []netip.Addr
	err := netns.Do(func(ns.NetNS) error {
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			return err
		}
		for _, a := range addrs {
			pfx, err := netip.ParsePrefix(a.String())
			if err != nil {
				continue
			}
			if ip := pfx.Addr().Unmap(); ip.IsGlobalUnicast() {
				out = append(out, ip)
			}
		}
		return nil
	})
	return out, err
}

// maxRouteTable bounds how much of a routing table is read.
const maxRouteTable = 1 << 20

// Gateways lists the gateways of the namespace's default routes, IPv4
// then IPv6.
func Gateways(netns ns.NetNS) ([]netip.Addr, error) {
	var out []netip.Addr
	err := netns.Do(func(ns.NetNS) error {
		// /proc/thread-self/net shows the namespace of this (locked) thread.
		for _, t := range []struct {
			file string
			gw   func([]string) (netip.Addr, bool)
		}{{"route", gateway4}, {"ipv6_route", gateway6}} {
			f, err := os.Open("/proc/thread-self/net/" + t.file)
			if errors.Is(err, os.ErrNotExist) && t.file == "ipv6_route" {
				continue // no IPv6 in this kernel
			}
			if err != nil {
				return err
			}
			sc := bufio.NewScanner(io.LimitReader(f, maxRouteTable))
			for sc.Scan() {
				if a, ok := t.gw(strings.Fields(sc.Text())); ok {
					out = append(out, a)
				}
			}
			err = sc.Err()
			f.Close()
			if err != nil {
				return fmt.Errorf("read %s: %w", t.file, err)
			}
		}
		return nil
	})
	return out, err
}

// gateway4 reads a /proc/net/route line: Iface Destination Gateway Flags
// ... Mask ..., addresses in host byte order (little-endian here).
func gateway4(f []string) (netip.Addr, bool) {
	if len(f) < 8 || f[1] != "00000000" || f[7] != "00000000" {
		return netip.Addr{}, false
	}
	b, err := hex.DecodeString(f[2])
	if err != nil || len(b) != 4 {
		return netip.Addr{}, false
	}
	a := netip.AddrFrom4([4]byte{b[3], b[2], b[1], b[0]})
	return a, !a.IsUnspecified()
}

// gateway6 reads a /proc/net/ipv6_route line: Destination DestPrefixLen
// Source SourcePrefixLen NextHop ..., in network byte order.
func gateway6(f []string) (netip.Addr, bool) {
	if len(f) < 10 || f[1] != "00" || strings.Trim(f[0], "0") != "" {
		return netip.Addr{}, false
	}
	b, err := hex.DecodeString(f[4])
	if err != nil || len(b) != 16 {
		return netip.Addr{}, false
	}
	a := netip.AddrFrom16([16]byte(b))
	return a, !a.IsUnspecified()
}

// Index maps the addresses of the namespaces under dir (where the
// container runtime names its pod sandboxes' namespaces, /var/run/netns)
// to their paths. A pod's IP is unique on its node, so it names the
// sandbox without asking the runtime. Namespaces that cannot be entered
// are skipped.
type Index map[netip.Addr][]string

// Scan indexes the namespaces under dir.
func Scan(dir string) (Index, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	idx := Index{}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		netns, err := ns.GetNS(p)
		if err != nil {
			continue // not a namespace (yet), or gone
		}
		addrs, err := Addresses(netns)
		netns.Close()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			idx[a] = append(idx[a], p)
		}
	}
	return idx, nil
}

// Lookup returns the one namespace holding any of ips; none, or several
// namespaces for them, is an error.
func (idx Index) Lookup(ips ...netip.Addr) (string, error) {
	var found []string
	for _, ip := range ips {
		for _, p := range idx[ip] {
			if !slices.Contains(found, p) {
				found = append(found, p)
			}
		}
	}
	switch len(found) {
	case 0:
		return "", fmt.Errorf("no network namespace has %v", ips)
	case 1:
		return found[0], nil
	}
	return "", fmt.Errorf("network namespaces %s all have one of %v", strings.Join(found, ", "), ips)
}
