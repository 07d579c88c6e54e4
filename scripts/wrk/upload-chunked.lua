-- wrk script for scripts/bench-peers.sh --upload-bytes N --upload-chunk-bytes K:
-- every request is a POST of N body bytes sent with Transfer-Encoding:
-- chunked, in chunks of K bytes (RFC 9112 §7.1; the last one shorter), no
-- extensions, no trailers. The request is built once per thread; wrk's own
-- wrk.format would add a Content-Length beside the Transfer-Encoding.
local n = tonumber(os.getenv("ZGIX_UPLOAD_BYTES") or "0")
local k = tonumber(os.getenv("ZGIX_UPLOAD_CHUNK_BYTES") or "0")
if k <= 0 then k = n end
local req

function init(args)
   local host = wrk.host
   if wrk.port then host = host .. ":" .. wrk.port end
   local parts = {"POST " .. wrk.path .. " HTTP/1.1\r\nHost: " .. host ..
      "\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n"}
   local left = n
   local chunk = string.rep("x", k)
   while left > 0 do
      local m = math.min(k, left)
      parts[#parts + 1] = string.format("%x\r\n", m) .. (m == k and chunk or string.rep("x", m)) .. "\r\n"
      left = left - m
   end
   parts[#parts + 1] = "0\r\n\r\n"
   req = table.concat(parts)
end

function request()
   return req
end
