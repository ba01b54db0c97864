package upload

import "github.com/emberbox/emberbox/internal/errdefs"

// Codes of the errors a Store returns, besides errdefs.ErrInternal ones.
const (
	CodeInvalid    = "invalid_request"   // ErrInvalidArgument; details.issues lists the fields
	CodeChecksum   = "checksum_mismatch" // ErrInvalidArgument; details.expected, details.actual
	CodeNotFound   = "upload_not_found"  // ErrNotFound: never began, ended or another owner's
	CodeCommitting = "upload_committing" // ErrConflict: a commit is under way
	CodeCommitted  = "upload_committed"  // ErrConflict
	CodeIncomplete = "upload_incomplete" // ErrConflict; details.missingOffsets and counts
	CodeTooMany    = "rate_limited"      // ErrConflict: the owner has MaxPerOwner open, or its byte quota staged
	CodeTooLarge   = "too_large"         // ErrInvalidArgument: larger than the server ever stages for one owner
	CodeFull       = "staging_full"      // ErrUnavailable: the server's budget or free-space reserve is reached
	CodeBusy       = "upload_busy"       // ErrConflict: a chunk of an open-ended upload is being written
)

// Issue is one problem with a field of a request, listed in details.issues
// of an invalid_request error. Path names the field as the API spells it.
type Issue struct {
	Path    string `json:"path"`
	Message string `json:"message"`
}

func invalid(issues ...Issue) *errdefs.CodedError {
	msg := "The request is not valid."
	if len(issues) == 1 {
		msg = issues[0].Message
		if issues[0].Path != "" {
			msg = issues[0].Path + ": " + msg
		}
	}
	return &errdefs.CodedError{Class: errdefs.ErrInvalidArgument, Code: CodeInvalid, Message: msg,
		Hint:    "Fix the fields listed in details.issues and send the request again.",
		Details: map[string]any{"issues": issues}}
}

func errNotFound(id string) *errdefs.CodedError {
	return errdefs.New(errdefs.ErrNotFound, CodeNotFound, "No upload %s in this sandbox.", id).
		WithHint("Uploads end when committed or aborted and after an hour without a request; begin a new one.")
}

func errCommitting(id string) *errdefs.CodedError {
	return errdefs.New(errdefs.ErrConflict, CodeCommitting, "Upload %s is being committed.", id).
		WithHint("Wait for the commit to answer.")
}

func errCommitted(id string) *errdefs.CodedError {
	return errdefs.New(errdefs.ErrConflict, CodeCommitted, "Upload %s is already committed.", id).
		WithHint("Begin a new upload to write the file again.")
}

func errTooMany() *errdefs.CodedError {
	return errdefs.New(errdefs.ErrConflict, CodeTooMany, "This key has %d uploads open, the most allowed.", MaxPerOwner).
		WithHint("Commit or abort an upload before beginning another; idle uploads end after an hour.")
}

// errIncomplete lists the first missing chunks (all of a 4 GiB upload's
// would be 4096 numbers).
func errIncomplete(missing []int64, chunks int) *errdefs.CodedError {
	const show = 20
	e := errdefs.New(errdefs.ErrConflict, CodeIncomplete, "%d of the upload's %d chunks have not arrived.", len(missing), chunks).
		WithHint("Send the missing chunks (details.missingOffsets) and commit again.")
	e.Details = map[string]any{"missingOffsets": missing[:min(len(missing), show)], "missingChunks": len(missing),
		"chunks": chunks, "chunkBytes": ChunkSize}
	return e
}

func errChecksum(want, got string) *errdefs.CodedError {
	e := errdefs.New(errdefs.ErrInvalidArgument, CodeChecksum, "The uploaded bytes do not match the sha256 given when the upload began.").
		WithHint("Send the chunks again and commit, or abort and begin a new upload.")
	e.Details = map[string]any{"expected": want, "actual": got}
	return e
}

func errTooLarge(size, limit int64) *errdefs.CodedError {
	return errdefs.New(errdefs.ErrInvalidArgument, CodeTooLarge,
		"An upload of %d bytes is larger than this server stages for one key (%d bytes).", size, limit).
		WithHint("Split the file, or ask the operator to raise the upload quota.")
}

func errOwnerBytes(limit int64) *errdefs.CodedError {
	return errdefs.New(errdefs.ErrConflict, CodeTooMany, "This key's open uploads would stage more than %d bytes.", limit).
		WithHint("Commit or abort an upload before beginning another; idle uploads end after an hour.")
}

func errStagingFull() *errdefs.CodedError {
	return errdefs.New(errdefs.ErrUnavailable, CodeFull, "The server has no room to stage this upload now.").
		WithHint("Retry later.")
}
