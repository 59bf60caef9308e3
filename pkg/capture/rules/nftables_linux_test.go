package rules

import (
	"errors"
	"flag"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/causeway-mesh/causeway/pkg/capture/internal/netnstest"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var cases = []struct {
	name string
	cfg  Config
}{
	{"defaults", Config{}},
	{"probes", Config{ProbeSources: []netip.Addr{netip.MustParseAddr("10.244.0.1"), netip.MustParseAddr("fd00:10:244::1")}}},
	{"ports", Config{OutboundPort: 25001, InboundPort: 25006, HBONEPort: 25008, Mark: 0x1000, MarkMask: 0xf000}},
}

// TestNFTablesGolden applies each case twice in a fresh namespace and
// compares what nft lists with testdata/<case>.nft: the rules as the
// kernel holds them, not as this package meant to write them.
func TestNFTablesGolden(t *testing.T) {
	netnstest.Require(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs the nft tool to list the rules")
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := netnstest.New(t, "rules")
			var b NFTables
			if err := b.Check(ns.Fd(), tc.cfg); !errors.Is(err, ErrMissing) {
				t.Fatalf("Check before Apply = %v, want ErrMissing", err)
			}
			for i := range 2 {
				if err := b.Apply(ns.Fd(), tc.cfg); err != nil {
					t.Fatalf("Apply #%d: %v", i+1, err)
				}
			}
			got := ns.Run(t, "nft", "list", "ruleset")
			golden := filepath.Join("testdata", tc.name+".nft")
			if *update {
				os.WriteFile(golden, []byte(got), 0o644)
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Errorf("ruleset after two Applies:\n%s\nwant (%s):\n%s", got, golden, want)
			}
			if err := b.Check(ns.Fd(), tc.cfg); err != nil {
				t.Errorf("Check after Apply: %v", err)
			}
			if err := b.Delete(ns.Fd()); err != nil {
				t.Fatal(err)
			}
			if out := ns.Run(t, "nft", "list", "ruleset"); out != "" {
				t.Errorf("ruleset after Delete:\n%s", out)
			}
			if err := b.Delete(ns.Fd()); err != nil {
				t.Errorf("second Delete: %v", err)
			}
		})
	}
}

// TestNFTablesCheckFindsChanges: Check notices a removed rule, a changed
// rule and a configuration other than the applied one.
func TestNFTablesCheckFindsChanges(t *testing.T) {
	netnstest.Require(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs the nft tool to change the rules")
	}
	ns := netnstest.New(t, "check")
	var b NFTables
	cfg := cases[1].cfg
	apply := func() {
		t.Helper()
		if err := b.Apply(ns.Fd(), cfg); err != nil {
			t.Fatal(err)
		}
	}
	apply()
	if err := b.Check(ns.Fd(), Config{}); !errors.Is(err, ErrMissing) {
		t.Errorf("Check with another config = %v, want ErrMissing", err)
	}
	ns.Run(t, "nft", "flush", "chain", "inet", TableName, "output")
	if err := b.Check(ns.Fd(), cfg); !errors.Is(err, ErrMissing) {
		t.Errorf("Check after flushing output = %v, want ErrMissing", err)
	}
	apply()
	ns.Run(t, "nft", "insert", "rule", "inet", TableName, "prerouting", "tcp", "dport", "80", "return")
	if err := b.Check(ns.Fd(), cfg); !errors.Is(err, ErrMissing) {
		t.Errorf("Check after inserting a rule = %v, want ErrMissing", err)
	}
	apply()
	if err := b.Check(ns.Fd(), cfg); err != nil {
		t.Errorf("Check after re-Apply: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{
		{OutboundPort: 15001, InboundPort: 15001},
		{Mark: 0x1539, MarkMask: 0xfff},
		{ProbeSources: []netip.Addr{{}}},
		{ProbeSources: []netip.Addr{netip.MustParseAddr("fe80::1%eth0")}},
	} {
		if err := c.Defaults().Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", c)
		}
	}
	if err := (Config{}).Defaults().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}
