package handoff

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// recorder is a PodHandler that remembers what it was told.
type recorder struct {
	mu     sync.Mutex
	pods   map[string]*os.File
	events []string
	fail   error
}

func newRecorder() *recorder { return &recorder{pods: map[string]*os.File{}} }

func (r *recorder) AddPod(_ context.Context, p Pod, netns *os.File) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		netns.Close()
		return r.fail
	}
	r.pods[p.UID] = netns
	r.events = append(r.events, "add "+p.UID)
	return nil
}

func (r *recorder) RemovePod(uid string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pods[uid].Close()
	delete(r.pods, uid)
	r.events = append(r.events, "remove "+uid)
}

func (r *recorder) uids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for uid := range r.pods {
		out = append(out, uid)
	}
	slices.Sort(out)
	return out
}

func (r *recorder) log() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.events, ", ")
}

func pod(uid string) *Pod {
	return &Pod{UID: uid, Name: "pod-" + uid, Namespace: "default", ServiceAccount: "sa"}
}

// fakeNetns stands in for a namespace: any file has an identity (dev, inode).
func fakeNetns(t *testing.T, name string) *os.File {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func reopen(t *testing.T, f *os.File) *os.File {
	t.Helper()
	g, err := os.Open(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestStateReplayAndSnapshot(t *testing.T) {
	r := newRecorder()
	s := NewState(r)
	ctx := context.Background()
	nsA, nsB := fakeNetns(t, "a"), fakeNetns(t, "b")
	s.Connected()
	must(t, s.Handle(ctx, Message{Type: TypeAdd, Pod: pod("a")}, reopen(t, nsA)))
	must(t, s.Handle(ctx, Message{Type: TypeAdd, Pod: pod("b")}, reopen(t, nsB)))
	must(t, s.Handle(ctx, Message{Type: TypeSnapshotComplete}, nil))

	// Reconnect: a is replayed with the same namespace (nothing happens),
	// b is not replayed (dropped at snapshot_complete), c is new.
	s.Connected()
	must(t, s.Handle(ctx, Message{Type: TypeAdd, Pod: pod("a")}, reopen(t, nsA)))
	must(t, s.Handle(ctx, Message{Type: TypeAdd, Pod: pod("c")}, fakeNetns(t, "c")))
	if got := r.uids(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("before snapshot_complete: pods %v", got)
	}
	must(t, s.Handle(ctx, Message{Type: TypeSnapshotComplete}, nil))
	if got := r.uids(); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("after snapshot_complete: pods %v, want [a c]", got)
	}
	// Same uid, new namespace (the sandbox was recreated): replaced.
	must(t, s.Handle(ctx, Message{Type: TypeAdd, Pod: pod("a")}, fakeNetns(t, "a2")))
	must(t, s.Handle(ctx, Message{Type: TypeRemove, UID: "c"}, nil))
	must(t, s.Handle(ctx, Message{Type: TypeRemove, UID: "unknown"}, nil))
	want := "add a, add b, add c, remove b, remove a, add a, remove c"
	if got := r.log(); got != want {
		t.Errorf("events:\n %s\nwant\n %s", got, want)
	}
}

func TestStateReportsHandlerError(t *testing.T) {
	r := newRecorder()
	r.fail = errors.New("cannot listen")
	s := NewState(r)
	err := s.Handle(context.Background(), Message{Type: TypeAdd, Pod: pod("a")}, fakeNetns(t, "a"))
	if err == nil || !strings.Contains(err.Error(), "cannot listen") {
		t.Fatalf("Handle = %v, want the handler's error", err)
	}
	if len(s.Pods()) != 0 {
		t.Errorf("a refused pod is recorded: %v", s.Pods())
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// socketpair returns two connected seqpacket Conns and the raw fd of the
// first, to write packets the Conn API would refuse to send.
func socketpair(t *testing.T) (raw int, c *Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[1]), "peer")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	c = newConn(nc.(*net.UnixConn))
	t.Cleanup(func() { unix.Close(fds[0]); c.Close() })
	return fds[0], c
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

func TestRecvRefusesAndClosesDescriptors(t *testing.T) {
	raw, c := socketpair(t)
	add, _ := Encode(Message{Type: TypeAdd, Pod: pod("a")})
	remove, _ := Encode(Message{Type: TypeRemove, UID: "a"})
	f1, f2 := fakeNetns(t, "1"), fakeNetns(t, "2")
	for _, tc := range []struct {
		name string
		msg  []byte
		fds  []int
		want string
	}{
		{"add with two descriptors", add, []int{int(f1.Fd()), int(f2.Fd())}, "2 descriptors"},
		{"remove with a descriptor", remove, []int{int(f1.Fd())}, "remove message with 1 descriptors"},
		{"add without a descriptor", add, nil, "add message with 0 descriptors"},
		{"too long", []byte(`{"type":"ack","error":"` + strings.Repeat("x", MaxMessage) + `"}`), []int{int(f1.Fd())}, "exceeds"},
		{"not JSON", []byte("hello"), nil, "bad message"},
		{"unknown field", []byte(`{"type":"ack","x":1}`), nil, "bad message"},
		{"bad pod", []byte(`{"type":"add","pod":{"uid":"a"}}`), []int{int(f1.Fd())}, "pod name"},
		{"too many descriptors", add, slices.Repeat([]int{int(f1.Fd())}, maxFDs+2), "descriptors"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := openFDs(t)
			var oob []byte
			if tc.fds != nil {
				oob = unix.UnixRights(tc.fds...)
			}
			if err := unix.Sendmsg(raw, tc.msg, oob, nil, 0); err != nil {
				t.Fatal(err)
			}
			m, netns, err := c.Recv()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Recv = %+v, %v, %v; want an error containing %q", m, netns, err, tc.want)
			}
			if netns != nil {
				t.Error("a refused message returned a descriptor")
			}
			if after := openFDs(t); after != before {
				t.Errorf("%d descriptors open before, %d after: received ones were not closed", before, after)
			}
		})
	}
}

func TestSendRefusesWrongDescriptors(t *testing.T) {
	_, c := socketpair(t)
	if err := c.Send(Message{Type: TypeAdd, Pod: pod("a")}, nil); err == nil {
		t.Error("add without a descriptor was sent")
	}
	if err := c.Send(Message{Type: TypeRemove, UID: "a"}, fakeNetns(t, "x")); err == nil {
		t.Error("remove with a descriptor was sent")
	}
	if err := c.Send(Message{Type: TypeAdd, Pod: &Pod{UID: "a"}}, fakeNetns(t, "y")); err == nil {
		t.Error("add of an incomplete pod was sent")
	}
}

func startServer(t *testing.T, ackTimeout time.Duration) (*Server, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "handoff.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{AckTimeout: ackTimeout}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s, path
}

// startClient runs a Client and returns a stop func and a channel that
// gets a value per completed snapshot.
func startClient(t *testing.T, path string, st *State) (stop func(), snaps chan struct{}) {
	t.Helper()
	snaps = make(chan struct{}, 10)
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{Path: path, State: st, MaxBackoff: 100 * time.Millisecond, OnSnapshot: func() { snaps <- struct{}{} }}
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop, snaps
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func recv(t *testing.T, snaps chan struct{}) {
	t.Helper()
	select {
	case <-snaps:
	case <-time.After(5 * time.Second):
		t.Fatal("no snapshot completed")
	}
}

// TestServerClientReplay: pods recorded before a proxy connects are
// replayed, live changes are sent and acknowledged, and a reconnecting
// proxy gets a fresh replay that drops the pods removed while it was away.
func TestServerClientReplay(t *testing.T) {
	s, path := startServer(t, 2*time.Second)
	if err := s.AddPod(*pod("early"), fakeNetns(t, "early")); !errors.Is(err, ErrNoProxy) {
		t.Fatalf("AddPod with no proxy = %v, want ErrNoProxy", err)
	}
	if s.Has("early") {
		t.Fatal("a pod no proxy took is recorded")
	}
	r := newRecorder()
	st := NewState(r)
	stop, snaps := startClient(t, path, st)
	recv(t, snaps)
	for _, uid := range []string{"a", "b", "c"} {
		must(t, s.AddPod(*pod(uid), fakeNetns(t, uid)))
	}
	// Acked means handled: no waiting needed.
	if got := r.uids(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("proxy serves %v", got)
	}
	stop()
	waitFor(t, "the agent to see the proxy leave", func() bool { return s.Connected() == 0 })
	must(t, s.RemovePod("b"))
	_, snaps = startClient(t, path, st)
	recv(t, snaps)
	if got := r.uids(); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("after reconnect the proxy serves %v, want [a c]", got)
	}
	if got, want := r.log(), "add a, add b, add c, remove b"; got != want {
		t.Errorf("events %q, want %q (replayed pods already served are not re-added)", got, want)
	}
}

// TestServerTwoProxies: during a restart both proxies get every change.
func TestServerTwoProxies(t *testing.T) {
	s, path := startServer(t, 2*time.Second)
	r1, r2 := newRecorder(), newRecorder()
	_, s1 := startClient(t, path, NewState(r1))
	recv(t, s1)
	must(t, s.AddPod(*pod("a"), fakeNetns(t, "a")))
	_, s2 := startClient(t, path, NewState(r2))
	recv(t, s2)
	must(t, s.AddPod(*pod("b"), fakeNetns(t, "b")))
	for i, r := range []*recorder{r1, r2} {
		if got := r.uids(); !slices.Equal(got, []string{"a", "b"}) {
			t.Errorf("proxy %d serves %v", i+1, got)
		}
	}
}

// TestServerNack: a pod the proxy refuses fails AddPod and is forgotten.
func TestServerNack(t *testing.T) {
	s, path := startServer(t, 2*time.Second)
	r := newRecorder()
	r.fail = errors.New("no listener for you")
	_, snaps := startClient(t, path, NewState(r))
	recv(t, snaps)
	err := s.AddPod(*pod("a"), fakeNetns(t, "a"))
	if err == nil || !strings.Contains(err.Error(), "no listener for you") {
		t.Fatalf("AddPod = %v, want the proxy's refusal", err)
	}
	if s.Has("a") {
		t.Error("a refused pod is recorded")
	}
}

// TestServerUnansweredAck: a proxy that never acknowledges is cut off
// after AckTimeout, and AddPod fails instead of hanging.
func TestServerUnansweredAck(t *testing.T) {
	s, path := startServer(t, 200*time.Millisecond)
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	must(t, c.Send(Message{Type: TypeHello, Version: Version}, nil))
	m, _, err := c.Recv()
	if err != nil || m.Type != TypeSnapshotComplete {
		t.Fatalf("Recv = %+v, %v; want snapshot_complete", m, err)
	}
	must(t, c.Send(Message{Type: TypeAck}, nil))
	waitFor(t, "registration", func() bool { return s.Connected() == 1 })
	start := time.Now()
	err = s.AddPod(*pod("a"), fakeNetns(t, "a"))
	if err == nil || !strings.Contains(err.Error(), "did not acknowledge") {
		t.Fatalf("AddPod = %v, want an ack timeout", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("AddPod took %s", d)
	}
	waitFor(t, "the silent proxy to be dropped", func() bool { return s.Connected() == 0 })
}

func TestServerRefusesBadHello(t *testing.T) {
	_, path := startServer(t, 2*time.Second)
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	must(t, c.Send(Message{Type: TypeAck}, nil))
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if m, _, err := c.Recv(); err == nil {
		t.Fatalf("got %+v after a bad hello, want the connection closed", m)
	}
}

func FuzzDecode(f *testing.F) {
	for _, m := range []Message{{Type: TypeHello, Version: 1}, {Type: TypeAck, Error: "x"}, {Type: TypeAdd, Pod: pod("a")}, {Type: TypeRemove, UID: "a"}} {
		b, _ := Encode(m)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			return
		}
		out, err := Encode(m)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", m, err)
		}
		if _, err := Decode(out); err != nil {
			t.Fatalf("re-decode: %v", err)
		}
	})
}

// TestServerRemoveFromAProxyThatLeaves: a proxy that goes away before it
// acknowledges a removal (restarting or uninstalled as the pod is deleted)
// does not fail RemovePod: its next snapshot lacks the pod. A proxy that
// leaves before acknowledging an addition still fails AddPod.
func TestServerRemoveFromAProxyThatLeaves(t *testing.T) {
	s, path := startServer(t, 2*time.Second)
	// leaver registers, answers nothing more and hangs up at the next
	// message.
	leaver := func() {
		t.Helper()
		c, err := Dial(path)
		if err != nil {
			t.Fatal(err)
		}
		must(t, c.Send(Message{Type: TypeHello, Version: Version}, nil))
		for { // the snapshot: each message acknowledged
			m, f, err := c.Recv()
			if err != nil {
				t.Fatalf("Recv: %v", err)
			}
			if f != nil {
				f.Close()
			}
			must(t, c.Send(Message{Type: TypeAck}, nil))
			if m.Type == TypeSnapshotComplete {
				break
			}
		}
		waitFor(t, "registration", func() bool { return s.Connected() == 1 })
		go func() {
			c.Recv()
			c.Close()
		}()
	}

	r := newRecorder()
	stop, snaps := startClient(t, path, NewState(r))
	recv(t, snaps)
	must(t, s.AddPod(*pod("a"), fakeNetns(t, "a")))
	stop()
	waitFor(t, "the proxy to leave", func() bool { return s.Connected() == 0 })

	leaver()
	if err := s.RemovePod("a"); err != nil {
		t.Errorf("RemovePod with the proxy leaving before its ack = %v, want nil", err)
	}
	if s.Has("a") {
		t.Error("the removed pod is still recorded")
	}
	waitFor(t, "the leaver to be gone", func() bool { return s.Connected() == 0 })

	leaver()
	if err := s.AddPod(*pod("b"), fakeNetns(t, "b")); err == nil || !strings.Contains(err.Error(), "disconnected before acknowledging") {
		t.Errorf("AddPod with the proxy leaving before its ack = %v, want a failure", err)
	}
	if s.Has("b") {
		t.Error("a pod no proxy acknowledged is recorded")
	}
}
