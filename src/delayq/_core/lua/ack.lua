-- ack: finish tasks whose leases the caller still holds.
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV:  pairs: id, lease token
-- Reply: one status per pair: 1 = acked; 2 = the task no longer exists (acked already: by this
--        call's first try whose reply was lost, or by the consumer it was redelivered to);
--        0 = lease lost: the task is still there but no longer ours (lease expired, delivered
--        to another consumer, back in the queue, or dead)
-- Being a no-op on a finished task makes ack safe to resend after a lost reply, whoever
-- resends it (delayq or the redis client's own retry).
local now = now_ms()
local reply = {}
local acked = 0
for i = 1, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  if held_lease(id, token, now) then
    drop_lease(id)
    forget(id, now, true)
    acked = acked + 1
    reply[#reply + 1] = 1
  elseif redis.call('HEXISTS', K_TASKS, id) == 0 then
    reply[#reply + 1] = 2
  else
    reply[#reply + 1] = 0
  end
end
count('acked', acked)
return reply
