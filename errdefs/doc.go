// Package errdefs holds the error classes every esf domain shares and the one
// table that names them with the stable codes of the API.
//
// Domain packages re-export the classes they return (cas.ErrNotFound is
// errdefs.ErrNotFound) and wrap them with context; callers test with
// errors.Is. The API boundary turns any error into a Code with CodeOf, and the
// client turns a code back into an *Error that still matches the class, so
// errors.Is(err, errdefs.ErrNotFound) holds on both sides of the socket.
package errdefs
