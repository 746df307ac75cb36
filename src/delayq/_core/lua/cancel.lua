-- cancel: remove tasks that are still waiting (delayed or due, not yet handed out).
-- KEYS:  the queue key set (see _lib.lua), then KEYS[14]: this call's receipt, and for an
--        outbox row (optional) KEYS[15]: the shard's applied set (see _lib.lua)
-- ARGV[1] ms to keep the receipt (this reply, for a resend of the same call)
-- ARGV[2..] task ids; with KEYS[15], the last two are the row's apply id and the ms to keep
--         its receipt
-- Reply: one status per id: 1 = cancelled, 0 = not waiting (unknown, in flight, or dead);
--        {2}: the outbox row was applied before (nothing done)
local receipt = KEYS[14]
local earlier = stored_reply(receipt)
if earlier then return earlier end
local now = now_ms()
local applied, last = KEYS[15], #ARGV
if applied then
  last = #ARGV - 2
  if not unapplied(applied, {ARGV[#ARGV - 1]}, now)[1] then
    keep_reply(receipt, {2}, tonumber(ARGV[1]))
    return {2}
  end
  record_applied(applied, {ARGV[#ARGV - 1]}, now, tonumber(ARGV[#ARGV]))
end
local reply = {}
local cancelled = 0
for i = 2, last do
  local id = ARGV[i]
  if redis.call('ZREM', K_DELAYED, id) == 1 or unpark(id) then
    hist_ended({id}, now, 'cancelled')  -- [H]
    forget(id, now, false)
    task_ended({id}, now, 'cancelled')
    cancelled = cancelled + 1
    reply[#reply + 1] = 1
  else
    reply[#reply + 1] = 0
  end
end
count('cancelled', cancelled)
keep_reply(receipt, reply, tonumber(ARGV[1]))
return reply
