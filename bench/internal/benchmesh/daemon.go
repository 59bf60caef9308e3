package benchmesh

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Daemon is a peer program (nginx, stunnel) the benchmark runs as its own
// child in the foreground, with a configuration in its work directory:
// never the system service.
type Daemon struct {
	cmd  *exec.Cmd
	dir  string
	logs []string // files in dir that say why it failed
	done chan struct{}
}

// LookTool finds a peer program on PATH or at one of the fallback paths
// (Debian puts daemons in /usr/sbin, often not on a user's PATH).
func LookTool(name string, fallbacks ...string) (string, error) {
	for _, p := range append([]string{name}, fallbacks...) {
		if bin, err := exec.LookPath(p); err == nil {
			return bin, nil
		}
	}
	return "", fmt.Errorf("%s not found on PATH or at %s", name, strings.Join(fallbacks, ", "))
}

// StartDaemon runs bin with args (its output to dir/name.out) and waits
// until every address in listen accepts connections. logs are the files
// in dir whose tails explain a failure.
func StartDaemon(name, dir string, listen, logs []string, bin string, args ...string) (*Daemon, error) {
	out, err := os.Create(filepath.Join(dir, name+".out"))
	if err != nil {
		return nil, err
	}
	defer out.Close()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	d := &Daemon{cmd: cmd, dir: dir, logs: append([]string{name + ".out"}, logs...), done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(d.done)
	}()
	deadline := time.Now().Add(15 * time.Second)
	for _, addr := range listen {
		for {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				c.Close()
				break
			}
			select {
			case <-d.done:
				return nil, fmt.Errorf("%s exited: %s", name, d.Logs())
			default:
			}
			if time.Now().After(deadline) {
				d.Stop()
				return nil, fmt.Errorf("%s not listening on %s: %v; %s", name, addr, err, d.Logs())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return d, nil
}

// Logs returns the tails of the daemon's output and log files.
func (d *Daemon) Logs() string {
	var out []string
	for _, f := range d.logs {
		if data, err := os.ReadFile(filepath.Join(d.dir, f)); err == nil && len(data) > 0 {
			out = append(out, strings.TrimSpace(string(data[max(0, len(data)-2000):])))
		}
	}
	return strings.Join(out, "\n")
}

// Stop asks the daemon to quit (SIGQUIT is nginx's graceful stop, and
// stunnel quits on it too), then kills its process group.
func (d *Daemon) Stop() {
	pgid := d.cmd.Process.Pid
	_ = syscall.Kill(pgid, syscall.SIGQUIT)
	select {
	case <-d.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-d.done
	}
}

// PIDs are the daemon's process and its children (nginx's workers).
func (d *Daemon) PIDs() ([]int, error) {
	kids, err := children(d.cmd.Process.Pid)
	if err != nil {
		return nil, err
	}
	return append([]int{d.cmd.Process.Pid}, kids...), nil
}

// CPU is the CPU time of the daemon's processes.
func (d *Daemon) CPU() (time.Duration, error) {
	pids, err := d.PIDs()
	if err != nil {
		return 0, err
	}
	var sum time.Duration
	for _, pid := range pids {
		t, err := CPUTime(pid)
		if err != nil {
			return 0, err
		}
		sum += t
	}
	return sum, nil
}

// children lists the processes whose parent is pid.
func children(pid int) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// Field 4 (ppid) follows the parenthesised command name.
		i := bytes.LastIndexByte(data, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(data[i+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out, nil
}
