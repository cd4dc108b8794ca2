// Package httpidem is net/http middleware for the Idempotency-Key header
// (draft-ietf-httpapi-idempotency-key-header, and what Stripe's clients rely
// on): a POST or PATCH retried with the same key and the same request gets the
// first response back instead of running twice.
//
// For a request with a key the middleware:
//   - answers 400 to an empty, malformed or over-long key, and (RequireKey)
//     to a missing one;
//   - scopes the key by method, path and principal, so the same key from two
//     callers is two keys;
//   - fingerprints the request (method, path, body): the same key with
//     another request is 422 and never executed;
//   - runs the handler once, passing its response through as it is written
//     (streaming works) and storing a copy;
//   - answers a duplicate while the first is running with 409, and after it
//     with the stored status, headers (hop-by-hop ones excluded) and body plus
//     "Idempotent-Replayed: true";
//   - stores 2xx, 3xx and 4xx (except 408, 409, 425, 429); releases the key on
//     those and 5xx so the retry runs again; holds it on 502, 504 or a panic,
//     where the effect may have happened, until the lease expires;
//   - fails closed with 503 when the store is unreachable;
//   - runs the handler under the key's lease: the request's context is not
//     cancelled when the client leaves (only Config.FinishTimeout after),
//     but at once, with cause idem.ErrLeaseExpired or store.ErrStaleFence,
//     when the lease runs out or is lost; idem.FenceFrom(r.Context()) is
//     the execution's fencing token, for writes conditioned on it (idem
//     serve hands it to its upstream in FenceHeader).
//
// Every error is application/problem+json whose "type" links to
// PROBLEMS.md (or your own docs, Config.ProblemTypeBase). Every stored
// response carries Idempotency-Key-Expires: how long a retry is replayed.
package httpidem
