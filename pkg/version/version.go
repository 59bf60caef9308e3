// Package version holds the version of Causeway a binary was built as.
//
// The Makefile and hack/images stamp it, and the source revision, at link
// time:
//
//	go build -ldflags "-X github.com/causeway-mesh/causeway/pkg/version.version=v1.2.3
//	  -X github.com/causeway-mesh/causeway/pkg/version.revision=$(git rev-parse HEAD)" ./cmd/...
//
// Unstamped builds report what the go command recorded from the module and
// its VCS state (e.g. v0.0.0-20261206031700-a03919d1e2f3+dirty), or
// "devel" when there is none (as with -buildvcs=false).
package version

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
)

// version and revision are set by -ldflags -X; empty in unstamped builds.
var version, revision string

// Version is this binary's version.
func Version() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

// Revision is the VCS revision the binary was built from: the stamped one,
// else the go command's record (with "-dirty" when the tree had changes);
// empty when there is neither.
func Revision() string {
	if revision != "" {
		return revision
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev != "" && modified == "true" {
		rev += "-dirty"
	}
	return rev
}

// Print writes the line every command's --version prints: the command,
// its version, the revision when known, and the Go version.
func Print(w io.Writer, command string) {
	line := command + " " + Version()
	if rev := Revision(); rev != "" {
		line += " (" + rev + ")"
	}
	bi, ok := debug.ReadBuildInfo()
	if ok {
		line += " " + bi.GoVersion
	}
	fmt.Fprintln(w, line)
}

// RegisterFlag adds --version to fs: it prints the version line to stdout
// and exits with status 0, whatever other flags say.
func RegisterFlag(fs *flag.FlagSet, command string) {
	fs.BoolFunc("version", "print the version and exit", func(string) error {
		Print(os.Stdout, command)
		os.Exit(0)
		return nil
	})
}
