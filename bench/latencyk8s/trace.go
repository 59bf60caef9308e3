package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/causeway-mesh/causeway/bench/internal/schedtrace"
	"github.com/causeway-mesh/causeway/pkg/readlimit"
)

// adminPort is where every Causeway proxy serves /debug/pprof/, on the
// loopback of its own network namespace (pkg/bootstrap's default).
const adminPort = "127.0.0.1:15000"

// traced is one proxy process of a path: its name in the report and its
// pid on this host (every node of the test cluster shares its kernel).
type traced struct {
	name string
	pid  int
}

// proxies lists the mesh's processes on path p: each node proxy and
// waypoint pod's proxy, found in the components' cgroups by executable.
func (r *run) proxies(p path) ([]traced, error) {
	comps, err := r.components(p)
	if err != nil {
		return nil, err
	}
	var out []traced
	for _, c := range []struct {
		comp int
		exe  string
	}{{compNodeProxy, "nodeproxy"}, {compWaypoint, "waypoint"}} {
		for i, d := range comps[c.comp].dirs {
			pid, err := r.g.process(d, c.exe)
			if err != nil {
				return nil, err
			}
			out = append(out, traced{name: c.exe + strconv.Itoa(i+1), pid: pid})
		}
	}
	return out, nil
}

// process finds the process running executable exe in the cgroup rel or
// below it (a pod's directory holds a directory per container).
func (g cgroups) process(rel, exe string) (int, error) {
	base := filepath.Join(g.root, "cpuacct", rel)
	var found int
	err := filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() || found != 0 {
			return err
		}
		b, err := readlimit.File(filepath.Join(p, "cgroup.procs"), 1<<16)
		if err != nil {
			return err
		}
		for _, f := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				continue
			}
			if target, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && filepath.Base(target) == exe {
				found = pid
				return filepath.SkipAll
			}
		}
		return nil
	})
	if err == nil && found == 0 {
		err = fmt.Errorf("no %s process in cgroup %s", exe, rel)
	}
	return found, err
}

// traceProxies takes execution traces of d, from 1 s into the window, of
// every process in ps through its admin port (dialed from inside the
// process's network namespace), and prints what each shows.
func traceProxies(ctx context.Context, dir, prefix string, ps []traced, d time.Duration) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		logf("trace: %v", err)
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(time.Second):
	}
	var wg sync.WaitGroup
	stats := make([]*schedtrace.Stats, len(ps))
	for i, p := range ps {
		wg.Go(func() {
			file := filepath.Join(dir, prefix+"-"+p.name+".trace")
			if err := fetchInNetns(ctx, p.pid, d, file); err != nil {
				logf("trace of %s (pid %d): %v", p.name, p.pid, err)
				return
			}
			s, err := schedtrace.Read(file)
			if err != nil {
				logf("trace of %s: %v", p.name, err)
				return
			}
			stats[i] = &s
		})
	}
	wg.Wait()
	for i, p := range ps {
		if stats[i] != nil {
			schedtrace.Report(os.Stdout, prefix+"_"+p.name, *stats[i])
		}
	}
}

// fetchInNetns fetches a trace of d from the admin port of process pid.
func fetchInNetns(ctx context.Context, pid int, d time.Duration, file string) error {
	netns, err := ns.GetNS(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return err
	}
	defer netns.Close()
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := netns.Do(func(ns.NetNS) error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	client := &http.Client{Timeout: d + 30*time.Second, Transport: &http.Transport{DialContext: dial}}
	url := fmt.Sprintf("http://%s/debug/pprof/trace?seconds=%d", adminPort, int(d.Seconds()))
	return schedtrace.Fetch(ctx, client, url, file)
}
