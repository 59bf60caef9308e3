package agent

import "errors"

// NonRetryableError marks a capture failure that another attempt with the
// same pod and namespace would meet again (the namespace is not one, the
// kernel refuses the rules). A pod watch retries other failures with
// backoff and gives up on these; the CNI plugin fails the sandbox either way.
type NonRetryableError struct{ Err error }

func (e *NonRetryableError) Error() string { return e.Err.Error() }
func (e *NonRetryableError) Unwrap() error { return e.Err }

func nonRetryable(err error) error { return &NonRetryableError{Err: err} }

// Retryable reports whether a capture error may pass on another attempt.
func Retryable(err error) bool {
	var nr *NonRetryableError
	return err != nil && !errors.As(err, &nr)
}
