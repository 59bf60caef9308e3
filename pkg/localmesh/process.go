package localmesh

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// process is one child of the local mesh, with its output in a log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited
	err     error         // exit status, valid after done
	job     job           // how it was started, for Restart
	// stopping is set when the mesh stops the process on purpose.
	stopping atomic.Bool
}

// startProcess runs bin with args and, besides meshctl's environment, env;
// its stdout and stderr are appended to <logDir>/<name>.log. The child gets
// its own process group so that a stop reaches everything it started.
func startProcess(name, bin string, args, env []string, logDir string) (*process, error) {
	logPath := filepath.Join(logDir, strings.ReplaceAll(name, "/", "_")+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%s: log file: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: start %s: %w", name, bin, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after grace.
func (p *process) stop(grace time.Duration) {
	p.stopping.Store(true)
	if p.exited() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// tail returns the last n lines of the process's log.
func (p *process) tail(n int) string {
	data, err := readTail(p.logPath, 64<<10)
	if err != nil {
		return fmt.Sprintf("(log unreadable: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func readTail(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > max {
		if _, err := f.Seek(st.Size()-max, io.SeekStart); err != nil {
			return nil, err
		}
	}
	data, err := io.ReadAll(io.LimitReader(f, max))
	if err != nil {
		return nil, err
	}
	if st.Size() > max {
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			data = data[i+1:]
		}
	}
	return data, nil
}

// describeExit says how a process ended, with its last log lines.
func (p *process) describeExit() string {
	return fmt.Sprintf("%s exited (%v); last log lines from %s:\n%s", p.name, p.err, p.logPath, p.tail(15))
}

// waitReady polls url until it answers 200, the process dies, broken (if
// set) reports a reason, or ctx ends.
func waitReady(ctx context.Context, p *process, url string, broken func() error) error {
	client := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		resp, err := client.Get(url)
		if err == nil {
			// The body of a 503 says why (admin.StatusHandlers).
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s answered %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
			if broken != nil {
				if why := broken(); why != nil {
					return fmt.Errorf("%s will not become ready: %w", p.name, why)
				}
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %v", p.name, last)
		case <-p.done:
			return errors.New(p.describeExit())
		case <-tick.C:
		}
	}
}

// policyRejected asks a waypoint's /config_dump whether it has no policy
// because its policy was rejected: the directory exists (Start checked), so
// in local mode only an edit can mend that, and the reason is worth more
// than a wait.
func policyRejected(admin string) func() error {
	client := &http.Client{Timeout: time.Second}
	return func() error {
		resp, err := client.Get("http://" + admin + "/config_dump")
		if err != nil {
			return nil // not serving yet
		}
		defer resp.Body.Close()
		var dump struct {
			Policies struct {
				Revision      string
				LastRejection *struct{ Source, Revision, Stage, Reason string } `json:"last_rejection"`
			}
		}
		if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&dump) != nil {
			return nil
		}
		r := dump.Policies.LastRejection
		if dump.Policies.Revision != "" || r == nil {
			return nil
		}
		return fmt.Errorf("its policy (%s revision %s) was rejected at %s: %s", r.Source, r.Revision, r.Stage, r.Reason)
	}
}

// group is the set of running processes, stopped in reverse start order.
type group struct {
	mu    sync.Mutex
	procs []*process
}

func (g *group) add(p *process) {
	g.mu.Lock()
	g.procs = append(g.procs, p)
	g.mu.Unlock()
}

func (g *group) stopAll(grace time.Duration) {
	g.mu.Lock()
	procs := append([]*process(nil), g.procs...)
	g.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].stop(grace)
	}
}
