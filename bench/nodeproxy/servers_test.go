package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseBulkLine(t *testing.T) {
	at := time.Unix(1700000000, 123)
	r, err := parseBulkLine("bulk 4096 1700000000000000123 -")
	if err != nil || r.bytes != 4096 || !r.at.Equal(at) || r.err != nil {
		t.Fatalf("ok line: %+v, %v", r, err)
	}
	r, err = parseBulkLine("bulk 10 1700000000000000123 read: connection reset by peer")
	if err != nil || r.err == nil || !strings.Contains(r.err.Error(), "connection reset by peer") {
		t.Fatalf("error line: %+v, %v", r, err)
	}
	for _, bad := range []string{"", "ready", "bulk 1 2", "bulk x 2 -", "bulk 1 y -", "listen: address in use"} {
		if _, err := parseBulkLine(bad); err == nil {
			t.Errorf("parseBulkLine(%q) accepted", bad)
		}
	}
}
