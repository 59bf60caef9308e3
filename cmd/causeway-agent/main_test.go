package main

import (
	"net"
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
