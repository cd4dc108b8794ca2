package httpidem

// HeaderName is the request header that carries the key
// (draft-ietf-httpapi-idempotency-key-header).
const HeaderName = "Idempotency-Key"

// FenceHeader is the request header in which idem serve hands the upstream
// its request's fencing token (idem.FenceFrom), in decimal: each execution
// of a key gets a larger one than every execution before it, so an
// upstream that keeps the largest fence it applied per key, and refuses a
// write under a smaller one, refuses a gateway that lost its lease while
// frozen. In a handler behind the middleware, read idem.FenceFrom of the
// request's context instead.
const FenceHeader = "Idempotency-Fence"
