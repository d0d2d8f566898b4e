-- post.lua - wrk script for the serving benchmark: POST the JSON body in the
-- file $WRK_BODY to every request, and print one machine-readable line,
--   WRKJSON {...}
-- with the totals and latency percentiles (microseconds) when wrk is done.
local f = assert(io.open(assert(os.getenv("WRK_BODY"), "set WRK_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"p50_us": %d, "p90_us": %d, "p99_us": %d, "mean_us": %.1f, "max_us": %d}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.mean, latency.max))
end
