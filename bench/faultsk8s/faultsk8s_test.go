package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/causeway-mesh/causeway/bench/internal/faultload"
)

// The in-pod load's output, read back as the host reads it through
// kubectl exec: started, every result, ended.
func TestStreamReadBack(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"headers": {"X-Policy-Revision": ["read,rev-2"]}}`)
	}))
	defer srv.Close()
	l := &faultload.Load{URL: srv.URL, Rate: 40, Fresh: srv.Client(), Existing: srv.Client()}
	pr, pw := io.Pipe()
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	go func() { pw.CloseWithError(stream(ctx, l, pw)) }()
	rl := newRemoteLoad()
	if err := rl.read(pr); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rl.startedc:
	default:
		t.Fatal("no started event")
	}
	rs, from, to := rl.window()
	if len(rs) < 10 || !from.Before(to) {
		t.Fatalf("%d results from %v to %v", len(rs), from, to)
	}
	for _, r := range rs {
		if r.Cause != "" || r.Revision != "rev-2" || r.Start.Before(from) || r.End.After(to) {
			t.Fatalf("result %+v outside [%v, %v] or failed", r, from, to)
		}
	}
	if _, ok := rl.first(func(r faultload.Result) bool { return r.Conn == "existing" }); !ok {
		t.Error("no result on existing connections")
	}
}

// Every connection goes to the address the URL's host had at the start,
// whatever address the client asks for.
func TestPinnedDial(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, r.Host) }))
	defer srv.Close()
	dial, err := pinnedDial(context.Background(), srv.URL+"/x")
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: &http.Transport{DialContext: dial}}
	resp, err := c.Get("http://reviews.shop.invalid/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "reviews.shop.invalid" {
		t.Errorf("Host %q", body)
	}
	for _, bad := range []string{"https://a/", "http:///x", "::"} {
		if _, err := pinnedDial(context.Background(), bad); err == nil {
			t.Errorf("pinnedDial(%q) accepted", bad)
		}
	}
}

func TestReadRefusesBrokenOutput(t *testing.T) {
	now := time.Now()
	line := func(e event) string { b, _ := json.Marshal(e); return string(b) + "\n" }
	for name, out := range map[string]string{
		"cut before the end": line(event{Started: &now}) + line(event{Result: &faultload.Result{Conn: "new"}}),
		"started twice":      line(event{Started: &now}) + line(event{Started: &now}),
		"empty event":        line(event{Started: &now}) + "{}\n",
		"not JSON":           "error: unable to upgrade connection\n",
	} {
		if err := newRemoteLoad().read(strings.NewReader(out)); err == nil {
			t.Errorf("%s: read accepted %q", name, out)
		}
	}
}

func TestRunningPID(t *testing.T) {
	out := "TASK    PID     STATUS\nabc     4242    RUNNING\ndef     17      STOPPED\n"
	for id, want := range map[string]int{"abc": 4242, "def": 0, "ghi": 0, "ab": 0} {
		if got := runningPID(out, id); got != want {
			t.Errorf("runningPID(%q) = %v, want %v", id, got, want)
		}
	}
}

func TestDead(t *testing.T) {
	for stat, want := range map[string]bool{
		"4242 (waypoint) S 1 4242 4242 0 -1":   false,
		"4242 (way) point)) R 1 4242":          false,
		"4242 (waypoint) Z 1 4242 4242 0 -1":   true,
		"4242 (wait (Z) here) X 1 4242 4242 0": true,
		"garbage":                              false,
	} {
		if got := dead(stat); got != want {
			t.Errorf("dead(%q) = %v, want %v", stat, got, want)
		}
	}
}

// A process of the test's own: exited sees its end (a zombie until it is
// reaped) within the poll.
func TestExited(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	defer cmd.Wait()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	at, err := exited(context.Background(), cmd.Process.Pid)
	if err != nil || at.Sub(killed) > 5*time.Second {
		t.Fatalf("exited: %v after %v", err, at.Sub(killed))
	}
}

func TestAfterKillNoFailures(t *testing.T) {
	kill := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	rs := []faultload.Result{
		{Conn: "existing", Start: kill.Add(-time.Second), End: kill.Add(time.Second), Cause: "EOF"},
		{Conn: "new", Start: kill.Add(-10 * time.Millisecond), End: kill, Cause: "HTTP 503 x"},
		{Conn: "new", Start: kill.Add(time.Second), End: kill.Add(2 * time.Second)},
	}
	if why := afterKillNoFailures(rs, faultload.Summary{}, faultload.Summary{}, outcome{at: kill}); why != "" {
		t.Errorf("in-flight failures only: %q", why)
	}
	rs = append(rs, faultload.Result{Conn: "new", Start: kill.Add(300 * time.Millisecond), Cause: "connection reset"})
	if why := afterKillNoFailures(rs, faultload.Summary{}, faultload.Summary{}, outcome{at: kill}); !strings.Contains(why, "1 requests started after the process died failed: connection reset (new, 300ms after)") {
		t.Errorf("a failure after the kill: %q", why)
	}
}

func TestPolicyConfigMap(t *testing.T) {
	var cm struct {
		Kind     string
		Metadata struct{ Name, Namespace string }
		Data     map[string]string
	}
	if err := json.Unmarshal([]byte(policyConfigMap(4)), &cm); err != nil {
		t.Fatal(err)
	}
	if cm.Kind != "ConfigMap" || cm.Metadata.Name != "waypoint-policies" || cm.Metadata.Namespace != "shop" || cm.Data["authz.rego"] != faultload.Policy(4) {
		t.Errorf("%+v", cm)
	}
}
