-- waf-hit.lua: a mix of clean requests and requests that hit the deny list of
-- the listener's WAF ("union select", "<script", "../"), to measure the cost
-- of matching and check that hits get the configured status and clean
-- requests do not.
--
--   wrk -t1 -c16 -d5s -s scripts/wrk/waf-hit.lua http://127.0.0.1:8080/ -- 50
--
-- The argument is the percentage of requests that hit (default 100). Hits
-- rotate through the places a deny-list literal can legally appear. zgix's
-- WAF matches the canonical path (dot-segments removed, never percent-decoded),
-- the raw query and every header value, so:
--   query-dotdot, header-union, header-script   hit in zgix;
--   path-dotdot   does not: "/static/../etc" is canonically "/etc" (and the
--                 origin would see the same), listed to show that;
--   query-union   does not: a space cannot appear raw in a request-target
--                 (RFC 9112 §3.2) and zgix does not decode "%20".
-- The counts printed at the end show what the listener did with each kind.

local threads = {}

local hits = {
    { kind = "query-dotdot",  path = "/download?file=../../etc/passwd" },
    { kind = "path-dotdot",   path = "/static/../etc/passwd" },
    { kind = "query-union",   path = "/search?q=1%20union%20select%20password" },
    { kind = "header-union",  path = "/search", header = "1 union select password" },
    { kind = "header-script", path = "/search", header = "<script>alert(1)</script>" },
}

function setup(thread)
    table.insert(threads, thread)
end

function init(args)
    percent = tonumber(args[1]) or 100
    n = 0
    sent = {}
    statuses = {}
end

function request()
    n = n + 1
    local kind, req
    if (n * 37) % 100 < percent then
        local h = hits[(n % #hits) + 1]
        kind = h.kind
        local headers = {}
        if h.header then headers["X-Query"] = h.header end
        req = wrk.format("GET", h.path, headers)
    else
        kind = "clean"
        req = wrk.format("GET", "/search?q=hello")
    end
    sent[kind] = (sent[kind] or 0) + 1
    return req
end

-- wrk's response() does not say which connection or request it answers, and
-- connections interleave, so responses are counted by status only; compare
-- them with the requests sent per kind (a few sent at the end get no answer).
function response(status, headers, body)
    statuses[status] = (statuses[status] or 0) + 1
end

local function sum(name)
    local total = {}
    for _, t in ipairs(threads) do
        for key, c in pairs(t:get(name)) do
            total[key] = (total[key] or 0) + c
        end
    end
    local keys = {}
    for key in pairs(total) do table.insert(keys, key) end
    table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
    return total, keys
end

function done(summary, latency, requests)
    local s, sk = sum("sent")
    io.write("requests sent by kind:\n")
    for _, k in ipairs(sk) do io.write(string.format("  %-14s %d\n", k, s[k])) end
    local r, rk = sum("statuses")
    io.write("responses by status:\n")
    for _, k in ipairs(rk) do io.write(string.format("  %-14s %d\n", k, r[k])) end
end
