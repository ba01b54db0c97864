package guest

import "context"

type fileUserKey struct{}

// WithFileUser returns ctx under which the file and watch calls that name
// no user of their own act as user ("" or "user": the sandbox's user, or
// "root"). It serves callers whose protocol names the user per request
// (E2B's envd) without a user parameter on every file call; the agent
// refuses a user it has no account for.
func WithFileUser(ctx context.Context, user string) context.Context {
	return context.WithValue(ctx, fileUserKey{}, user)
}

func fileUser(ctx context.Context) string {
	u, _ := ctx.Value(fileUserKey{}).(string)
	return u
}
