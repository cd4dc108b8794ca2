module github.com/idemgo/idem/scripts/peerbench

go 1.26.0

require (
	github.com/faustbrian/go-idempotency v0.0.0-20260715141327-26ee779f6bb7
	github.com/idemgo/idem v0.0.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/valkey-io/valkey-go v1.0.76
)

replace github.com/idemgo/idem => ../..
