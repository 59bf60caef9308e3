package main

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestListenCNIOverlap: a new agent takes the plugin's socket over from a
// running one (a DaemonSet surge); the old one stopping afterwards must
// leave the new one reachable.
func TestListenCNIOverlap(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cni.sock")
	old, err := listenCNI(path)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := listenCNI(path)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("the new agent's socket after the old one closed: %v", err)
	}
	c.Close()
}

// TestRemoveCNISocket: an uninstall leaves neither the socket nor the
// directory made for it on the node, but keeps a directory holding
// something else.
func TestRemoveCNISocket(t *testing.T) {
	confDir := t.TempDir()
	path := filepath.Join(confDir, "causeway", "cni.sock")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := listenCNI(path)
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	if err := removeCNISocket(path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(path)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket's directory is still there: %v", err)
	}
	if err := removeCNISocket(path); err != nil {
		t.Errorf("a second removal: %v", err)
	}

	shared := filepath.Join(t.TempDir(), "cni.sock")
	other := filepath.Join(filepath.Dir(shared), "someone-else")
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if ln, err = listenCNI(shared); err != nil {
		t.Fatal(err)
	}
	ln.Close()
	if err := removeCNISocket(shared); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(shared); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket is still there: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("another file of the directory went: %v", err)
	}
}
