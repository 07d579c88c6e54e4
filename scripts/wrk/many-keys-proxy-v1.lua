-- many-keys-proxy-v1.lua: many clients, each with its own source address,
-- through a zgix listener with "proxy_protocol": true.
--
--   wrk -t1 -c64 -d5s -s scripts/wrk/many-keys-proxy-v1.lua http://127.0.0.1:8080/
--
-- The limitation, and what this script does about it: a PROXY header must be
-- the first bytes of a connection, once. wrk has no per-connection hook: its
-- `init` runs once per thread and `request` once per request, and whatever
-- `request` returns is written on a connection that may already have carried
-- requests. Prepending the header in `request` on a keep-alive connection
-- would put "PROXY TCP4 ..." where the proxy expects the next request line,
-- and it answers 400 (or closes), which measures nothing useful.
--
-- What works is to make every request the first on its connection: each
-- request carries the PROXY header and `Connection: close`, the proxy closes
-- after the response, and wrk opens a fresh connection for the next request.
-- Each request then claims a distinct client (198.18.0.0/15, the RFC 2544
-- benchmark range, counting up per request), so this exercises per-client
-- table growth and eviction, connect/accept cost and the PROXY parser, at
-- connection-per-request rates.
--
-- For many clients on keep-alive connections use instead:
--   zgix-bench load --url http://127.0.0.1:8080/ --proxy-header v1 --connections 1000
-- which sends the header once per connection (and v2 with --proxy-header v2).
--
-- The listener must have "proxy_protocol": true; without it zgix answers 400.
-- Optional argument: distinct clients per wrk thread before its addresses
-- repeat (default 16384), e.g. `... -- 5000`. Thread i uses clients
-- i*N .. i*N+N-1; keep threads x N <= 131072 (the size of 198.18.0.0/15) or
-- threads share addresses.

local threads = {}
local counter = 0

function setup(thread)
    thread:set("id", #threads)
    table.insert(threads, thread)
end

function init(args)
    clients = tonumber(args[1]) or 16384
    statuses = {}
    counter = 0
    -- wrk calls thread 0's request() once before the run and parses the result
    -- as HTTP to check it ("invalid HTTP method" on a PROXY line); that call
    -- sends nothing, so it gets a plain request.
    verify_pending = (id == 0)
    local addr = tostring(wrk.thread.addr or "")
    local host, port = addr:match("^(.*):(%d+)$")
    dst_ip = host or "127.0.0.1"
    dst_port = port or "80"
end

local function client(c)
    -- Threads use disjoint ranges so no two send the same client.
    local n = (id * clients + c % clients) % 131072
    -- 198.18.0.0 + n
    return string.format("198.%d.%d.%d", 18 + math.floor(n / 65536) % 2,
        math.floor(n / 256) % 256, n % 256), 1024 + n % 64000
end

function request()
    if verify_pending then
        verify_pending = false
        return wrk.format("GET", nil, { ["Connection"] = "close" })
    end
    counter = counter + 1
    local ip, sport = client(counter)
    local proxy = string.format("PROXY TCP4 %s %s %d %s\r\n", ip, dst_ip, sport, dst_port)
    return proxy .. wrk.format("GET", nil, { ["Connection"] = "close" })
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
