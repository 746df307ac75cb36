-- ack: finish tasks whose leases the caller still holds.
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV[1] '1' if this call repeats one whose reply was lost (a task already gone is then
--         taken as acked by that first call), else '0'
-- ARGV[2..] pairs: id, lease token
-- Reply: one status per pair: 1 = acked, 2 = already gone (repeat only), 0 = lease lost
--        (expired, or the task was handed to another consumer)
local repeated = ARGV[1] == '1'
local now = now_ms()
local reply = {}
local acked = 0
for i = 2, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  if held_lease(id, token, now) then
    drop_lease(id)
    forget(id, now, true)
    acked = acked + 1
    reply[#reply + 1] = 1
  elseif repeated and redis.call('HEXISTS', K_TASKS, id) == 0 then
    reply[#reply + 1] = 2
  else
    reply[#reply + 1] = 0
  end
end
count('acked', acked)
return reply
