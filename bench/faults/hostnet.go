package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// hostNet is a reading of the kernel's network counters that say why
// idle loopback connections could die without the mesh closing them. They
// count for the whole host (other work on the machine adds to them).
type hostNet map[string]uint64

// hostNetCounters are the TcpExt counters read (from /proc/net/netstat):
// accept queue overflows, keepalive probes sent, connections aborted when
// keepalive or retransmission timed out.
var hostNetCounters = []string{"ListenOverflows", "ListenDrops", "TCPKeepAlive", "TCPAbortOnTimeout", "TCPTimeouts"}

// readHostNet reads the counters; softnet_dropped is the packets the
// kernel dropped from a full per-CPU input backlog (netdev_max_backlog),
// which loopback traffic also queues on.
func readHostNet() (hostNet, error) {
	out := hostNet{}
	f, err := os.Open("/proc/net/softnet_stat")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		d, err := strconv.ParseUint(fields[1], 16, 64)
		if err != nil {
			return nil, fmt.Errorf("softnet_stat: %w", err)
		}
		out["softnet_dropped"] += d
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	b, err := os.ReadFile("/proc/net/netstat")
	if err != nil {
		return nil, err
	}
	// Pairs of lines: "TcpExt: Name1 Name2 ..." then "TcpExt: 1 2 ...".
	lines := strings.Split(string(b), "\n")
	for i := 0; i+1 < len(lines); i += 2 {
		names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) == 0 || names[0] != "TcpExt:" || len(values) != len(names) {
			continue
		}
		for j, n := range names[1:] {
			for _, want := range hostNetCounters {
				if n == want {
					if out[n], err = strconv.ParseUint(values[j+1], 10, 64); err != nil {
						return nil, fmt.Errorf("netstat %s: %w", n, err)
					}
				}
			}
		}
	}
	return out, nil
}

// since is what each counter added after before, as "name +n" (the
// counters in a fixed order).
func (n hostNet) since(before hostNet) string {
	var parts []string
	for _, k := range append([]string{"softnet_dropped"}, hostNetCounters...) {
		parts = append(parts, fmt.Sprintf("%s +%d", k, n[k]-before[k]))
	}
	return strings.Join(parts, ", ")
}
