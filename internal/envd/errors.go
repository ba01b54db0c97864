package envd

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	"github.com/emberbox/emberbox/internal/errdefs"
	"github.com/emberbox/emberbox/internal/guest"
)

var (
	errNotRouted = errors.New("envd: the request was not routed to a sandbox")
	errBadUser   = errors.New(`the Authorization header must be "Basic base64(user:)"`)
)

// rpcError maps a guest's error to the Connect code envd answers for it.
func rpcError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	return connect.NewError(rpcCode(err), err)
}

// rpcCode is the Connect code of a guest's error.
func rpcCode(err error) connect.Code {
	switch {
	case errors.Is(err, context.Canceled):
		return connect.CodeCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return connect.CodeDeadlineExceeded
	case errdefs.IsNotFound(err):
		return connect.CodeNotFound
	case errdefs.IsInvalidArgument(err):
		return connect.CodeInvalidArgument
	case errors.Is(err, errdefs.ErrPermission):
		return connect.CodePermissionDenied
	case errors.Is(err, errdefs.ErrUnavailable):
		return connect.CodeUnavailable
	case errdefs.IsConflict(err):
		switch errdefs.Code(err) {
		case "file_exists":
			return connect.CodeAlreadyExists
		case "is_a_directory", "not_a_directory":
			return connect.CodeInvalidArgument
		case "no_space", guest.CodeStdinFull:
			return connect.CodeResourceExhausted
		}
		return connect.CodeFailedPrecondition
	}
	return connect.CodeInternal
}

func invalidArg(msg string) error {
	return connect.NewError(connect.CodeInvalidArgument, errors.New(msg))
}

func notFound(msg string) error {
	return connect.NewError(connect.CodeNotFound, errors.New(msg))
}
