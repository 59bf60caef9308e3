package localmesh

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestPIDs(t *testing.T) {
	sleep := "/bin/sleep"
	if _, err := os.Stat(sleep); err != nil {
		t.Skip("no /bin/sleep")
	}
	m := &Mesh{}
	p, err := startProcess("nodeproxy-node-a", sleep, []string{"60"}, nil, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m.group.add(p)
	defer m.Stop()

	pids := m.PIDs()
	pid, ok := pids["nodeproxy-node-a"]
	if !ok || len(pids) != 1 {
		t.Fatalf("PIDs() = %v, want one entry for nodeproxy-node-a", pids)
	}
	// Right after exec the kernel may still show an empty command line.
	var cmdline []byte
	for deadline := time.Now().Add(5 * time.Second); len(cmdline) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cmdline, err = os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline")); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.HasPrefix(string(cmdline), sleep) {
		t.Fatalf("pid %d runs %q, not %s", pid, cmdline, sleep)
	}

	p.stop(5 * time.Second)
	if pids := m.PIDs(); len(pids) != 0 {
		t.Fatalf("PIDs() after the process exited = %v, want none", pids)
	}
}
