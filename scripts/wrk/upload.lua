-- wrk script for scripts/bench-peers.sh --upload-bytes N: every request is a
-- POST with an N-byte Content-Length body (N from $ZGIX_UPLOAD_BYTES).
local n = tonumber(os.getenv("ZGIX_UPLOAD_BYTES") or "0")
wrk.method = "POST"
wrk.body = string.rep("x", n)
wrk.headers["Content-Type"] = "application/octet-stream"
