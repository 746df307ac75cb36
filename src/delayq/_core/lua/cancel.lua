-- cancel: remove tasks that are still waiting (delayed or due, not yet handed out).
-- KEYS:  the queue key set (see _lib.lua), then KEYS[15]: this call's receipt
-- ARGV[1] '1' if this call resends one whose reply was lost, else '0'
-- ARGV[2] ms to keep the receipt (the reply, so that a resend answers the same)
-- ARGV[3..] task ids
-- Reply: one status per id: 1 = cancelled, 0 = not waiting (unknown, in flight, or dead)
local receipt = KEYS[15]
if ARGV[1] == '1' and redis.call('EXISTS', receipt) == 1 then
  local stored = redis.call('LRANGE', receipt, 0, -1)
  for i = 1, #stored do stored[i] = tonumber(stored[i]) end
  return stored
end
local now = now_ms()
local reply = {}
local cancelled = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', K_DELAYED, id) == 1 then
    forget(id, now, false)
    cancelled = cancelled + 1
    reply[#reply + 1] = 1
  else
    reply[#reply + 1] = 0
  end
end
count('cancelled', cancelled)
redis.call('RPUSH', receipt, unpack(reply))
redis.call('PEXPIRE', receipt, tonumber(ARGV[2]))
return reply
