package main

import "testing"

func TestFlagsRefused(t *testing.T) {
	for _, s := range []string{"", "0", "-5", "100,x"} {
		if _, err := parseRates(s); err == nil {
			t.Errorf("rates %q accepted", s)
		}
	}
	if _, err := parsePaths("direct,l5"); err == nil {
		t.Error("path l5 accepted")
	}
	if got, err := parseRates("100, 1000"); err != nil || len(got) != 2 || got[1] != 1000 {
		t.Errorf("rates: %v, %v", got, err)
	}
}
