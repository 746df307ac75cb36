-- cancel: remove tasks that are still waiting (delayed or due, not yet handed out).
-- KEYS:  the queue key set (see _lib.lua), then KEYS[14]: this call's receipt
-- ARGV[1] ms to keep the receipt (this reply, for a resend of the same call)
-- ARGV[2..] task ids
-- Reply: one status per id: 1 = cancelled, 0 = not waiting (unknown, in flight, or dead)
local receipt = KEYS[14]
local earlier = stored_reply(receipt)
if earlier then return earlier end
local now = now_ms()
local reply = {}
local cancelled = 0
for i = 2, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', K_DELAYED, id) == 1 or unpark(id) then
    forget(id, now, false)
    cancelled = cancelled + 1
    reply[#reply + 1] = 1
  else
    reply[#reply + 1] = 0
  end
end
count('cancelled', cancelled)
keep_reply(receipt, reply, tonumber(ARGV[1]))
return reply
