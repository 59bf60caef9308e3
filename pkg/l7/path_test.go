package l7

import (
	"strings"
	"testing"
)

func TestNormalizePath(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/", "/"},
		{"/a/b", "/a/b"},
		{"/a/./b", "/a/b"},
		{"/a/b/..", "/a/"},
		{"/a/b/../c", "/a/c"},
		{"/../../a", "/a"},
		{"/a/.", "/a/"},
		{"/public/%2e%2e/admin", "/admin"},
		{"/public/%2E%2e/admin", "/admin"},
		{"/a%2fb", "/a%2Fb"},           // escaped slash stays data
		{"/a%2F..%2Fb", "/a%2F..%2Fb"}, // not a dot segment: one segment
		{"/%7euser", "/~user"},
		{"/caf%c3%a9", "/caf%C3%A9"},
		{"/a//b", "/a//b"},
		{"/a//../b", "/a/b"},
	} {
		got, err := normalizePath(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("normalizePath(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "a/b", "*", "/a%", "/a%2", "/a%zz"} {
		if got, err := normalizePath(bad); err == nil {
			t.Errorf("normalizePath(%q) = %q, want an error", bad, got)
		}
	}
}

// The table in the Gateway API HTTPPathModifier.ReplacePrefixMatch docs.
func TestReplacePrefixSpecTable(t *testing.T) {
	for _, tc := range []struct{ path, prefix, repl, want string }{
		{"/foo/bar", "/foo", "/xyz", "/xyz/bar"},
		{"/foo/bar", "/foo", "/xyz/", "/xyz/bar"},
		{"/foo/bar", "/foo/", "/xyz", "/xyz/bar"},
		{"/foo/bar", "/foo/", "/xyz/", "/xyz/bar"},
		{"/foo", "/foo", "/xyz", "/xyz"},
		{"/foo/", "/foo", "/xyz", "/xyz/"},
		{"/foo/bar", "/foo", "", "/bar"},
		{"/foo/", "/foo", "", "/"},
		{"/foo", "/foo", "", "/"},
		{"/foo/", "/foo", "/", "/"},
		{"/foo", "/foo", "/", "/"},
		// Conformance HTTPRouteRewritePath cases.
		{"/prefix/one/two", "/prefix/one", "/one", "/one/two"},
		{"/strip-prefix/three", "/strip-prefix", "/", "/three"},
		{"/strip-prefix", "/strip-prefix", "/", "/"},
		// Prefix "/" keeps the whole path after the replacement.
		{"/a/b", "/", "/xyz", "/xyz/a/b"},
		// Not on a segment boundary: unchanged.
		{"/foobar", "/foo", "/xyz", "/foobar"},
	} {
		if got := replacePrefix(tc.path, tc.prefix, tc.repl); got != tc.want {
			t.Errorf("replacePrefix(%q, %q, %q) = %q, want %q", tc.path, tc.prefix, tc.repl, got, tc.want)
		}
	}
}

func TestSegmentPrefix(t *testing.T) {
	for _, tc := range []struct {
		path, prefix string
		want         bool
	}{
		{"/abc", "/abc", true},
		{"/abc/", "/abc", true},
		{"/abc/def", "/abc", true},
		{"/abcd", "/abc", false},
		{"/abc", "/abc/", true}, // a trailing "/" in the prefix is ignored
		{"/abcd", "/abc/", false},
		{"/", "/", true},
		{"/anything", "/", true},
		{"/ab", "/abc", false},
	} {
		if got := hasSegmentPrefix(tc.path, trimPrefixValue(tc.prefix)); got != tc.want {
			t.Errorf("prefix %q on %q = %v, want %v", tc.prefix, tc.path, got, tc.want)
		}
	}
}

func FuzzNormalizePath(f *testing.F) {
	for _, s := range []string{"/", "/a/../b", "/%2e%2e/x", "/a%2Fb", "//", "/./.", "/a/b/c/../../d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		n, err := normalizePath(p)
		if err != nil {
			return
		}
		if n == "" || n[0] != '/' {
			t.Fatalf("normalizePath(%q) = %q: not absolute", p, n)
		}
		for _, seg := range strings.Split(n, "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("normalizePath(%q) = %q: dot segment left", p, n)
			}
		}
		again, err := normalizePath(n)
		if err != nil || again != n {
			t.Fatalf("not idempotent: %q -> %q -> %q (%v)", p, n, again, err)
		}
	})
}

func FuzzReplacePrefix(f *testing.F) {
	f.Add("/foo/bar", "/foo", "/xyz")
	f.Add("/foo", "/foo/", "")
	f.Add("/", "/", "/")
	f.Fuzz(func(t *testing.T, p, prefix, repl string) {
		if p == "" || p[0] != '/' || prefix == "" || prefix[0] != '/' {
			return
		}
		got := replacePrefix(p, prefix, repl)
		if got == "" || got[0] != '/' {
			t.Fatalf("replacePrefix(%q, %q, %q) = %q: not absolute", p, prefix, repl, got)
		}
		m := trimPrefixValue(prefix)
		if !hasSegmentPrefix(p, m) {
			if got != p {
				t.Fatalf("replacePrefix changed a path without the prefix: %q -> %q", p, got)
			}
			return
		}
		// The part after the prefix survives unchanged.
		if rest := p[len(m):]; rest != "" && !strings.HasSuffix(got, rest) {
			t.Fatalf("replacePrefix(%q, %q, %q) = %q lost %q", p, prefix, repl, got, rest)
		}
	})
}
