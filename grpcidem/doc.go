// Package grpcidem makes unary gRPC methods idempotent: a server interceptor
// that runs each call carrying an idempotency key at most once per key, and
// replays its response — message and status, details included — to the
// retries; and a client interceptor that gives each logical call one key
// and keeps it across every retry.
//
// gRPC has no signal of a method's idempotency an interceptor can read
// (grpc-go does not expose the proto option idempotency_level), so methods
// opt in by name. Only unary methods can: a stream's messages are not one
// request and one response to store and replay (Server.Check refuses a
// streaming method that opted in).
//
// What a call gets, by the state of its key:
//
//	first call, or a retry after the first was released   runs; its response or status is stored per Dispositions
//	retry after it completed                               the stored response, or the stored status (code, message, details)
//	retry while the first runs                             codes.Aborted with a google.rpc.RetryInfo detail
//	another request under the same key                     codes.FailedPrecondition
//	the store out of reach                                 codes.Unavailable; nothing runs
//	a malformed key                                        codes.InvalidArgument
//
// FailedPrecondition for a reused key, as HTTP's 422: the request cannot
// succeed in the state the key is in, and retrying it unchanged will not
// help (Aborted would invite a retry; AlreadyExists would say the first
// call's resource is this request's).
package grpcidem
