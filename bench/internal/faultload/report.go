package faultload

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// TableHeader heads the Markdown table of PrintRow's lines.
const TableHeader = "| fault | connections | sent | failed (by cause) | longest gap | result |\n|---|---|---|---|---|---|\n"

// PrintRow prints a row's figures, a line per connection kind.
func PrintRow(w io.Writer, name string, fresh, existing Summary, result string) {
	for _, k := range []struct {
		name string
		s    Summary
	}{{"new", fresh}, {"existing", existing}} {
		fmt.Fprintf(w, "| %s | %s | %d | %d (%s) | %v | %s |\n", name, k.name, k.s.Sent, k.s.Failed, k.s.CausesText(),
			k.s.LongestGap.Round(time.Millisecond), result)
	}
}

// Verdict words a row's result from what its judge said (why, "" when the
// figures meet the expectation), a problem the fault itself found, and a
// note: "met" or "NOT met: ...", the note in parentheses.
func Verdict(why, problem, note string) (result string, met bool) {
	if problem != "" {
		why = strings.TrimPrefix(why+", "+problem, ", ")
	}
	result, met = "met", why == ""
	if !met {
		result = "NOT met: " + why
	}
	if note != "" {
		result += " (" + note + ")"
	}
	return result, met
}

// NoFailures says on which kinds of connection requests failed ("" if
// none did).
func NoFailures(fresh, existing Summary) string {
	var why []string
	for _, s := range []struct {
		kind string
		s    Summary
	}{{"new", fresh}, {"existing", existing}} {
		if s.s.Failed > 0 {
			why = append(why, fmt.Sprintf("%d failed on %s connections", s.s.Failed, s.kind))
		}
	}
	return strings.Join(why, ", ")
}
