// Command benchscripts writes the server-side twins of idem's store
// transitions, so scripts/bench-stores.sh can run exactly the same round
// trips with pgbench and redis-benchmark:
//
//	benchscripts pgbench SCHEMA > lifecycle.sql   # pgbench -f: acquire then complete
//	benchscripts redis-acquire > acquire.lua      # the Lua scripts of redisstore
//	benchscripts redis-owned > owned.lua
package main
