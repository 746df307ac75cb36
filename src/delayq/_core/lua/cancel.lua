-- cancel: remove tasks that are still waiting (delayed or due, not yet handed out).
-- KEYS:  the queue key set (see _lib.lua).
-- ARGV:  task ids
-- Reply: one status per id: 1 = cancelled, 0 = not waiting (unknown, in flight, or dead)
local now = now_ms()
local reply = {}
local cancelled = 0
for i = 1, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', K_DELAYED, id) == 1 then
    forget(id, now, false)
    cancelled = cancelled + 1
    reply[i] = 1
  else
    reply[i] = 0
  end
end
count('cancelled', cancelled)
return reply
