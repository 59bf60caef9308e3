package policy

// The engine's test helpers, for the tests of package policy_test (a Git
// source: git_test.go), which import policygit and so cannot be in
// package policy.
var (
	NewTestEngine = newTestEngine
	StartEngine   = startEngine
	WaitFor       = waitFor
	WriteFiles    = writeFiles
	Gathered      = gathered
	TestRequest   = request
)
