// Package benchmesh is what the mesh benchmark programs (bench/nodeproxy,
// bench/waypoint) share: a local mesh of the real binaries started from a
// YAML document on loopback addresses of their own, figures read from
// /proc for its processes, and the `bench: <name> <value> <unit>` lines of
// docs/design.md §9.
package benchmesh

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/causeway-mesh/causeway/pkg/config"
	"github.com/causeway-mesh/causeway/pkg/localmesh"
	"github.com/causeway-mesh/causeway/pkg/readlimit"
)

// Report prints one figure as docs/design.md §9 wants it.
func Report(name string, value float64, unit string) {
	fmt.Printf("bench: %s %.3f %s\n", name, value, unit)
}

// Sleep waits d or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}

// Setup describes a benchmark mesh.
type Setup struct {
	BinDir   string            // controlplane, nodeproxy, waypoint, echo
	WorkDir  string            // config, policies and state go below it
	Mesh     string            // local-mode YAML (docs/design.md §6)
	Policies map[string]string // file name -> Rego, for waypoints
	BasePort int
	// Edit, if set, may change the plan before anything starts, for
	// example to drop a node proxy whose part the benchmark plays itself.
	Edit func(*localmesh.Plan) error
	// ControlPlaneArgs are extra flags for the control plane,
	// NodeProxyArgs for the node proxy of each node named, WaypointArgs
	// for every waypoint.
	ControlPlaneArgs []string
	NodeProxyArgs    map[string][]string
	WaypointArgs     []string
}

// Start writes the configuration and starts the mesh; Stop it when done.
func Start(ctx context.Context, s Setup) (*localmesh.Mesh, error) {
	cfg := filepath.Join(s.WorkDir, "config")
	pol := filepath.Join(s.WorkDir, "policies")
	for _, d := range []string{cfg, pol} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("benchmark directories: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(cfg, "mesh.yaml"), []byte(s.Mesh), 0o644); err != nil {
		return nil, fmt.Errorf("mesh configuration: %w", err)
	}
	for name, src := range s.Policies {
		if err := os.WriteFile(filepath.Join(pol, name), []byte(src), 0o644); err != nil {
			return nil, fmt.Errorf("policy %s: %w", name, err)
		}
	}
	snap, err := config.NewDirSource(cfg, config.DirOptions{}).Load()
	if err != nil {
		return nil, fmt.Errorf("mesh configuration: %w", err)
	}
	plan, err := localmesh.NewPlan(snap, s.BasePort)
	if err != nil {
		return nil, err
	}
	if s.Edit != nil {
		if err := s.Edit(plan); err != nil {
			return nil, err
		}
	}
	bin, err := filepath.Abs(s.BinDir)
	if err != nil {
		return nil, err
	}
	for _, b := range []string{"controlplane", "nodeproxy", "waypoint"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return nil, fmt.Errorf("binary %s missing (run make build first): %w", b, err)
		}
	}
	return localmesh.Start(ctx, plan, localmesh.Options{BinDir: bin, ConfigDir: cfg, PolicyDir: pol,
		StateDir: filepath.Join(s.WorkDir, "state"), ReadyTimeout: 60 * time.Second, ControlPlaneArgs: s.ControlPlaneArgs,
		NodeProxyArgs: s.NodeProxyArgs, WaypointArgs: s.WaypointArgs})
}

// WorkDir returns dir, or when it is empty a new temporary directory for
// the benchmark name, and the function to defer that removes it unless
// *keep is set by then (it says where the directory is instead).
func WorkDir(dir, name string, keep *bool) (string, func(), error) {
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "causeway-bench-"+name+"-"); err != nil {
			return "", nil, err
		}
	}
	return dir, func() {
		if *keep {
			fmt.Fprintf(os.Stderr, "%s bench: work directory kept: %s\n", name, dir)
		} else {
			os.RemoveAll(dir)
		}
	}, nil
}

// PID returns the pid of the named mesh process.
func PID(m *localmesh.Mesh, name string) (int, error) {
	pid, ok := m.PIDs()[name]
	if !ok {
		return 0, fmt.Errorf("no running mesh process %q", name)
	}
	return pid, nil
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat;
// it is 100 on every Linux architecture Go supports.
const clockTicks = 100

// CPUTime is the user plus system CPU time a process has used, from
// /proc/<pid>/stat (its own threads; children are not counted).
func CPUTime(pid int) (time.Duration, error) {
	data, err := readProc(pid, "stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// count fields after the last ')'. utime and stime are fields 14, 15.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(f))
	}
	var ticks uint64
	for _, s := range f[11:13] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// ContextSwitches is the number of times the threads of a process have
// been switched out, voluntarily (blocked, woke later) or not, summed over
// its live threads (/proc/<pid>/task/*/status).
func ContextSwitches(pid int) (int64, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, t := range tasks {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, t.Name()))
		if err != nil {
			continue // the thread ended meanwhile
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if !ok || (k != "voluntary_ctxt_switches" && k != "nonvoluntary_ctxt_switches") {
				continue
			}
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/task/%s/status: %w", pid, t.Name(), err)
			}
			sum += n
		}
	}
	return sum, nil
}

// RSS is a process's resident set size in bytes (VmRSS).
func RSS(pid int) (int64, error) { return statusBytes(pid, "VmRSS") }

// FileRSS is the part of a process's RSS that maps files (RssFile): its
// binary's code and read-only data, as far as they were touched.
func FileRSS(pid int) (int64, error) { return statusBytes(pid, "RssFile") }

// AnonRSS is the part of a process's RSS that maps no file (RssAnon):
// heap, stacks and the Go runtime's own structures.
func AnonRSS(pid int) (int64, error) { return statusBytes(pid, "RssAnon") }

// OpenFiles is how many file descriptors a process holds.
func OpenFiles(pid int) (int, error) {
	fds, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	return len(fds), err
}

// PeakRSS is the largest resident set size the process has had, in bytes
// (VmHWM).
func PeakRSS(pid int) (int64, error) { return statusBytes(pid, "VmHWM") }

// statusBytes reads a "<field>: <n> kB" line of /proc/<pid>/status.
func statusBytes(pid int, field string) (int64, error) {
	data, err := readProc(pid, "status")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), field+":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("/proc/%d/status: odd %s line %q", pid, field, sc.Text())
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/status: %w", pid, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, field)
}

func readProc(pid int, file string) ([]byte, error) {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), file))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 64<<10))
}

// RaiseNoFile lifts the soft RLIMIT_NOFILE towards n, the hard limit too
// when the process may (CAP_SYS_RESOURCE), and returns the soft limit now in
// force; processes started afterwards inherit it.
func RaiseNoFile(n uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("RLIMIT_NOFILE: %w", err)
	}
	if lim.Cur >= n {
		return lim.Cur, nil
	}
	want := syscall.Rlimit{Cur: n, Max: max(lim.Max, n)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err == nil {
		return n, nil
	}
	lim.Cur = lim.Max // not allowed past the hard limit: go as far as it
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("raise RLIMIT_NOFILE to %d: %w", lim.Cur, err)
	}
	return lim.Cur, nil
}

// Scrape reads unlabelled metrics (counters, gauges) from a Prometheus
// text page; every name must be there.
func Scrape(url string, names ...string) (map[string]float64, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		for _, name := range names {
			if rest, ok := strings.CutPrefix(line, name+" "); ok {
				if out[name], err = strconv.ParseFloat(strings.TrimSpace(rest), 64); err != nil {
					return nil, fmt.Errorf("%s: %s: %w", url, name, err)
				}
			}
		}
	}
	for _, name := range names {
		if _, ok := out[name]; !ok {
			return nil, fmt.Errorf("%s: no %s", url, name)
		}
	}
	return out, nil
}

// Profile writes a CPU profile of a mesh process over d (whole seconds),
// from the pprof handler of its admin address, to path.
func Profile(ctx context.Context, admin string, d time.Duration, path string) error {
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", admin, max(1, int(d/time.Second)))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profile of %s: %w", admin, err)
	}
	defer resp.Body.Close()
	data, err := readlimit.All(resp.Body, 64<<20)
	if err != nil {
		return fmt.Errorf("profile of %s: %w", admin, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile of %s: %s: %s", admin, resp.Status, data)
	}
	return os.WriteFile(path, data, 0o644)
}
