-- extend: push back the expiry of a lease the caller still holds.
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] id   ARGV[2] lease token   ARGV[3] ms from now until the lease expires
-- Reply: the new expiry in epoch ms, or -1 when the lease is lost.
local id, token, ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = now_ms()
local lease = held_lease(id, token, now)
if not lease then return -1 end
redis.call('ZADD', K_INFLIGHT, 'XX', fmt(score(now + ms, slot_of(lease))), id)
hist_note(id, now, 'extended', 'lease ends in ' .. hist_span(ms))  -- [H]
return now + ms
