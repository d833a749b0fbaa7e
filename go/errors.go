package selfserve

import "fmt"

// Code is a stable status code of the C ABI (include/selfserve.h, ss_status).
type Code int32

const (
	CodeOK               Code = 0
	CodeInvalidArgument  Code = 1    // the caller's input: options, sampling values, JSON, prompt too long
	CodeNotFound         Code = 2    // a file that is not there
	CodeInvalidModel     Code = 3    // a model file that is truncated, malformed or unsupported
	CodeOutOfMemory      Code = 4    // host or device memory
	CodeDeviceLost       Code = 5    // the GPU stopped answering
	CodeLaunchFailure    Code = 6    // a kernel failed
	CodeDevice           Code = 7    // another CUDA / cuBLAS error
	CodeUnavailable      Code = 8    // the device asked for is not there
	CodeCancelled        Code = 9    // the request was cancelled (its context was)
	CodeDeadlineExceeded Code = 10   // the request's deadline passed
	CodeInternal         Code = 11   // a bug
	CodeClosed           Code = 1000 // Go side only: the engine was closed
)

var codeNames = map[Code]string{
	CodeOK: "ok", CodeInvalidArgument: "invalid argument", CodeNotFound: "not found",
	CodeInvalidModel: "invalid model", CodeOutOfMemory: "out of memory", CodeDeviceLost: "device lost",
	CodeLaunchFailure: "launch failure", CodeDevice: "device error", CodeUnavailable: "unavailable",
	CodeCancelled: "cancelled", CodeDeadlineExceeded: "deadline exceeded", CodeInternal: "internal error",
	CodeClosed: "engine closed",
}

func (c Code) String() string {
	if s, ok := codeNames[c]; ok {
		return s
	}
	return fmt.Sprintf("code %d", int32(c))
}

// Error is every error this package returns: the engine's code and message, and the C++ source
// file and line where it arose. errors.Is(err, ErrOutOfMemory) and the like match on the code;
// a request ended by its context also unwraps to context.Canceled or context.DeadlineExceeded.
type Error struct {
	Code    Code
	Message string
	File    string
	Line    int

	sentinel bool
	cause    error
}

func (e *Error) Error() string {
	if e.sentinel {
		return "selfserve: " + e.Code.String()
	}
	if e.File != "" {
		return fmt.Sprintf("selfserve: %s: %s (%s:%d)", e.Code, e.Message, e.File, e.Line)
	}
	return fmt.Sprintf("selfserve: %s: %s", e.Code, e.Message)
}

// Is reports whether target is the sentinel of e's code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.sentinel && t.Code == e.Code
}

// Unwrap gives the context's error for a request its context ended.
func (e *Error) Unwrap() error { return e.cause }

func sentinel(c Code) *Error { return &Error{Code: c, sentinel: true} }

// Sentinels for errors.Is.
var (
	ErrInvalidArgument  = sentinel(CodeInvalidArgument)
	ErrNotFound         = sentinel(CodeNotFound)
	ErrInvalidModel     = sentinel(CodeInvalidModel)
	ErrOutOfMemory      = sentinel(CodeOutOfMemory)
	ErrDeviceLost       = sentinel(CodeDeviceLost)
	ErrLaunchFailure    = sentinel(CodeLaunchFailure)
	ErrDevice           = sentinel(CodeDevice)
	ErrUnavailable      = sentinel(CodeUnavailable)
	ErrCancelled        = sentinel(CodeCancelled)
	ErrDeadlineExceeded = sentinel(CodeDeadlineExceeded)
	ErrInternal         = sentinel(CodeInternal)
	ErrClosed           = sentinel(CodeClosed)
)
