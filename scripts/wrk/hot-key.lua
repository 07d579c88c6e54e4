-- hot-key.lua: one client sending as fast as it can, to drive zgix's
-- per-client rate limit past its burst and watch it answer 429.
--
--   wrk -t1 -c1 -d5s -s scripts/wrk/hot-key.lua http://127.0.0.1:8080/
--
-- Every connection from wrk shares the source address 127.0.0.1, so with one
-- connection (-c1) this is exactly one client key; more connections are still
-- one key, just more concurrency. Prints the status counts at the end: with
-- rate_limit {requests R, window_ms W, burst B} expect about B + R*duration/W
-- 2xx responses and the rest refused.

local threads = {}

function setup(thread)
    table.insert(threads, thread)
end

function init(args)
    statuses = {}
    wrk.headers["User-Agent"] = "wrk-hot-key"
end

function response(status, headers, body)
    statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
    local total = {}
    for _, t in ipairs(threads) do
        for status, n in pairs(t:get("statuses")) do
            total[status] = (total[status] or 0) + n
        end
    end
    io.write("status counts:")
    for status, n in pairs(total) do
        io.write(string.format(" %d=%d", status, n))
    end
    io.write("\n")
end
