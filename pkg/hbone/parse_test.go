package hbone

import (
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/net/http2/hpack"
)

func TestParseAuthority(t *testing.T) {
	good := map[string]string{
		"10.0.0.1:80":           "10.0.0.1:80",
		"255.255.255.255:65535": "255.255.255.255:65535",
		"[fd00::1]:8080":        "[fd00::1]:8080",
		"[::1]:1":               "[::1]:1",
		"[2001:DB8::1]:443":     "[2001:db8::1]:443",
	}
	for in, want := range good {
		ap, err := ParseAuthority(in)
		if err != nil {
			t.Errorf("%q: %v", in, err)
			continue
		}
		if got := FormatAuthority(ap); got != want {
			t.Errorf("%q: parsed as %s, want %s", in, got, want)
		}
	}
	bad := []string{
		"", ":80", "10.0.0.1", "10.0.0.1:", "10.0.0.1:0", "10.0.0.1:080", "10.0.0.1:65536",
		"10.0.0.1:+80", "10.0.0.1:-1", "10.0.0.1:8a", "010.0.0.1:80", "10.0.0:80", "10.0.0.1.5:80",
		"::1:80", "[::1]", "[::1]80", "[::1:80", "fd00::1]:80", "[10.0.0.1]:80",
		"[::ffff:10.0.0.1]:80", "[fe80::1%eth0]:80", "example.com:80", " 10.0.0.1:80",
		"10.0.0.1:80 ", "10.0.0.1:80\x00", strings.Repeat("1", 300) + ":80",
	}
	for _, in := range bad {
		if ap, err := ParseAuthority(in); err == nil {
			t.Errorf("%q: accepted as %v", in, ap)
		}
	}
}

func TestParseHostAuthority(t *testing.T) {
	for _, in := range []string{"echo.ns.svc.cluster.local:80", "a:1", "under_score.example:443", "x-y.z.:80"} {
		if _, err := parseHostAuthority(in); err != nil {
			t.Errorf("%q: %v", in, err)
		}
	}
	for _, in := range []string{
		"a", "a:0", ":80", "-a.b:80", "a-.b:80", "a..b:80", "a b:80", "a/b:80", "10.1.2.300:80",
		"a@b:80", strings.Repeat("a", 64) + ".b:80", "[::1]:80",
	} {
		if _, err := parseHostAuthority(in); err == nil {
			t.Errorf("%q: accepted", in)
		}
	}
}

func TestParseForwardedFor(t *testing.T) {
	good := map[string]string{
		`for="10.1.2.3:4567"`:                          "10.1.2.3:4567",
		`for=10.1.2.3`:                                 "10.1.2.3:0",
		`For="[2001:db8::17]:4711"`:                    "[2001:db8::17]:4711",
		`for="[2001:db8::17]"`:                         "[2001:db8::17]:0",
		`for="10.1.2.3:4567";proto=https;by=10.0.0.1`:  "10.1.2.3:4567",
		`by=10.0.0.1; for="10.1.2.3:1" , for=10.9.9.9`: "10.1.2.3:1",
		`for="10.1.2.3:1", for=unknown`:                "10.1.2.3:1",
		`;for="\1\0.1.2.3:1"`:                          "10.1.2.3:1",
	}
	for in, want := range good {
		ap, err := ParseForwardedFor(in)
		if err != nil {
			t.Errorf("%q: %v", in, err)
			continue
		}
		if ap != netip.MustParseAddrPort(want) {
			t.Errorf("%q: got %v, want %s", in, ap, want)
		}
	}
	bad := []string{
		``, `by=10.0.0.1`, `for=unknown`, `for=_hidden`, `for="[::1]:_port"`, `for=10.1.2.3:80`,
		`for="10.1.2.3:80`, `for="10.1.2.3:80" junk`, `for=`, `for`, `for="10.1.2.3";for="10.1.2.4"`,
		`for="[::ffff:10.1.2.3]:1"`, `for="[fe80::1%eth0]:1"`, `for="::1"`, `for="10.1.2.3:0"`,
		`for="10.1.2.3:"`, `for="[::1]:"`, `for="[::1]x"`, "for=\"10.1.2.3\x00\"", `, for=10.1.2.3`,
		strings.Repeat(" ", maxForwardedLen) + "for=10.1.2.3",
	}
	for _, in := range bad {
		if ap, err := ParseForwardedFor(in); err == nil {
			t.Errorf("%q: accepted as %v", in, ap)
		}
	}
}

func FuzzParseAuthority(f *testing.F) {
	for _, s := range []string{
		"10.0.0.1:80", "[fd00::1]:8080", "[::ffff:1.2.3.4]:1", "[fe80::1%eth0]:80", "a.b:80",
		"10.0.0.1:080", "[::1]", "::1:80", "1.2.3.4:65536", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ap, err := ParseAuthority(s)
		if err != nil {
			if ap.IsValid() {
				t.Fatalf("%q: error with a value", s)
			}
			return
		}
		if !ap.IsValid() || ap.Port() == 0 || ap.Addr().Zone() != "" || ap.Addr().Is4In6() {
			t.Fatalf("%q: accepted %v", s, ap)
		}
		// The canonical form parses back to the same address.
		again, err := ParseAuthority(FormatAuthority(ap))
		if err != nil || again != ap {
			t.Fatalf("%q: round trip %q -> %v, %v", s, FormatAuthority(ap), again, err)
		}
		if _, err := parseHostAuthority(s); err == nil {
			t.Fatalf("%q: both an IP and a host name", s)
		}
	})
}

func FuzzParseForwardedFor(f *testing.F) {
	for _, s := range []string{
		`for="10.1.2.3:4567"`, `for=10.1.2.3;proto=http`, `For="[2001:db8::17]:4711", for=unknown`,
		`by=x;for="\1\0.1.2.3"`, `for="[::1]`, `for=;`, `for="a\"b"`, `,for=1.2.3.4`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ap, err := ParseForwardedFor(s)
		if err != nil {
			return
		}
		if !ap.IsValid() || ap.Addr().Zone() != "" || ap.Addr().Is4In6() {
			t.Fatalf("%q: accepted %v", s, ap)
		}
		again, err := ParseForwardedFor(FormatForwardedFor(ap))
		if err != nil || again != ap {
			t.Fatalf("%q: round trip %q -> %v, %v", s, FormatForwardedFor(ap), again, err)
		}
	})
}

// FuzzParseRequest feeds a CONNECT header block, one "name: value" field a
// line, through the checks a stream's headers pass (field rules, request
// rules, then parseRequest). An accepted request has exactly one target;
// Forwarded is a valid address or absent, and Baggage is every baggage
// value in order.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		":method: CONNECT\n:authority: 10.0.0.1:80\nforwarded: for=\"10.1.2.3:4567\"\nbaggage: k8s.namespace.name=shop\nbaggage: k8s.pod.name=web\ntraceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		":method: CONNECT\n:authority: reviews.shop:9080\nhost: reviews.shop:9080\nforwarded: for=unknown, for=1.2.3.4",
		":method: CONNECT\n:authority: [fd00::1]:8080\nforwarded: for=\"[fd00::2]:1\";proto=https\nbaggage: ",
		":method: GET\n:scheme: https\n:path: /\n:authority: 10.0.0.1:80",
		":method: CONNECT\n:authority: 10.0.0.1:80\nhost: 10.0.0.2:80",
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, block string, hostnames bool) {
		var b headerBlock
		var baggage []string
		for _, line := range strings.Split(block, "\n") {
			name, value, _ := strings.Cut(line[min(1, len(line)):], ":")
			name = line[:min(1, len(line))] + name
			value = strings.TrimPrefix(value, " ")
			b.addField(hpack.HeaderField{Name: name, Value: value}, 16<<10)
			if name == "baggage" {
				baggage = append(baggage, value)
			}
		}
		if _, problem := b.checkRequest(); problem != "" {
			return
		}
		s := &Server{opts: ServerOptions{AllowHostnames: hostnames}}
		req, code, reason := s.parseRequest(&Request{}, &b)
		if code != 0 {
			if req != nil || reason == "" {
				t.Fatalf("refusal %d with request %v and reason %q", code, req, reason)
			}
			return
		}
		if req.Authority.IsValid() == (req.Host != "") {
			t.Fatalf("accepted with authority %v and host %q", req.Authority, req.Host)
		}
		if req.Host != "" && !hostnames {
			t.Fatalf("host name %q accepted without AllowHostnames", req.Host)
		}
		if req.Forwarded.IsValid() && (req.Forwarded.Addr().Zone() != "" || req.Forwarded.Addr().Is4In6()) {
			t.Fatalf("forwarded %v accepted", req.Forwarded)
		}
		if !b.truncated && req.Baggage != strings.Join(baggage, ",") {
			t.Fatalf("baggage %q, want %q", req.Baggage, strings.Join(baggage, ","))
		}
	})
}
